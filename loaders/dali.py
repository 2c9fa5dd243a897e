"""The ``dali`` backend: the Pillow backend's plans and batches, decoded by NVIDIA DALI.

- What is read is the base's (``loaders.base``): the plan's batches, each fetched through the
  loader's ``Source`` (shards: ``os.pread`` by offset through the sample index,
  ``loaders.reader``), so the samples of every rank and step, the tails, padding, resume
  (elastic too) and ``len()`` are the Pillow backend's. Labels never enter DALI: they are
  kept beside the batches in flight.
- The samples go to DALI through a batch-level ``fn.external_source`` callback that runs in
  the loader's thread (the serial source); DALI decodes in ``num_threads`` threads, the
  Pillow backend's worker count. DALI's parallel source (``parallel=True``, worker
  processes) works on the CPU, but its workers start with every pipeline (0.1 s forked,
  3.6 s spawned, measured here), a pipeline is built per pass (below), forking is unsafe
  once CUDA is initialised, and reading is ~3 % of a sample's cost (docs/loaders.md): the
  serial source costs less.
- Train: ``fn.decoders.image_random_crop`` (torchvision's random-resized-crop sampling:
  ``scale`` of the area, ``ratio`` aspect, 10 tries) decodes only the crop, ``fn.resize`` to
  ``size`` x ``size``, then ``fn.crop_mirror_normalize`` (uint8, no normalisation; its
  output layout CHW, or HWC for ``memory_format="channels_last"``, whose batches are handed
  over as the Pillow backend's: NCHW-shaped views with channels_last strides) mirrors where
  ``fn.random.coin_flip(probability=0.5)`` says: DALI draws its own boxes and flips, not the
  transforms' ``geometry`` (why: ``GRAPHS``). Val: ``fn.decoders.image``,
  the short side to ``resize``, the center crop in ``crop_mirror_normalize``. With
  ``device="gpu"`` the decoders run ``"mixed"`` (nvJPEG on GPU ``local_rank``; DALI falls back
  to the CPU for what it refuses) and the rest on that GPU, and batches come out as CUDA
  tensors (``feed_ndarray``); with ``"cpu"`` everything runs on the CPU. Normalisation stays
  with ``DeviceLoader``. With ``random_erase`` or ``mixup`` set, each batch's batch-level
  draws are made in the loader's process as the Pillow backend makes them (``Config.draws``,
  from the batch's labels) and travel third: the same draws for the same labels.
- Seeds: DALI's random ops draw from the pipeline's seed, fixed when it is built, so every
  pass builds a pipeline seeded by (the plan's seed, epoch, rank, the order position of its
  first batch): a rerun gives the same pixels. A mid-epoch resume gives the same samples in every
  step, with other crops and flips than the uninterrupted run (the Pillow backend seeds each
  batch and gives the same pixels too).
- A size schedule (``LoaderOptions.size_schedule``) is followed pass by pass: each pass's
  pipeline is built for the transform of the epoch's plan (``loaders.config.PlannedEpoch``),
  so a size change costs nothing beyond the pipeline every pass builds anyway.
- Errors: DALI fails a whole batch on an undecodable image, and its pipeline cannot go on.
  The batches handed to DALI and not yet yielded are then decoded sample by sample with the
  Pillow backend's own transform (``loaders.transforms.apply``), which finds the bad samples
  by the Pillow backend's rule, and a new pipeline starts at the first batch not yielded.
  Each bad slot is fed a good sample of its batch (``loaders.backends.stand_ins``, the Pillow
  backend's choice), whose row then takes the slot: ``on_error="skip"`` yields it, counted
  in ``skipped``; ``"raise"`` raises the Pillow backend's error, naming the first bad sample,
  when its batch is reached. One case DALI does not fail on: a JPEG whose last bytes are
  missing (libjpeg-turbo greys the rest; Pillow refuses it); so a sample that does not end
  with the JPEG end marker is first checked the Pillow way, before DALI sees it (one
  ``endswith`` per sample). A batch DALI refuses whose samples Pillow all decodes raises,
  naming the batch.
"""

from __future__ import annotations

import functools
import io
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from imgprep import ImgprepError
from loaders.backends import Batch, EncodedSample, InProcessBackend, Source, stand_ins
from loaders.batch import PAD_LABEL, as_nchw, row_shape, with_draws
from loaders.config import Config, PlannedEpoch
from loaders.epochs import PAD
from loaders.errors import LoaderError
from loaders.transforms import SampleError, TrainTransform, Transform, ValTransform, apply

DECODER = {"cpu": "cpu", "gpu": "mixed"}  # where the decoder runs, per output device
EOI = b"\xff\xd9"  # a JPEG's last two bytes
RANDOM_CROP_TRIES = 10  # torchvision's RandomResizedCrop tries as many boxes


def pass_seed(seed: int, epoch: int, rank: int, position: int) -> int:
    """The seed of the pipeline that makes ``rank``'s batches of ``epoch`` from the batch
    whose first slot is at ``position`` of the epoch's order."""
    words = [seed, epoch, rank, position, 0xDA11]
    return int(np.random.default_rng(words).integers(1 << 31))


def decode_graph(jpegs: Any, t: Transform, device: str, layout: str = "CHW") -> Any:
    """DALI ops from encoded images to uint8 ``t.size`` x ``t.size`` images laid out as
    ``layout`` (``"CHW"`` or ``"HWC"``); the decoder runs as ``DECODER[device]`` says, the
    later ops where its output is. The graph is the transform kind's (``GRAPHS``)."""
    return GRAPHS[type(t)](jpegs, t, DECODER[device], layout)


def _train_graph(jpegs: Any, t: TrainTransform, decoder: str, layout: str) -> Any:
    from nvidia.dali import fn, types

    images: Any = fn.decoders.image_random_crop(
        jpegs, device=decoder, output_type=types.DALIImageType.RGB, random_area=list(t.scale),
        random_aspect_ratio=list(t.ratio), num_attempts=RANDOM_CROP_TRIES)
    images = fn.resize(images, resize_x=t.size, resize_y=t.size)
    mirror = fn.random.coin_flip(probability=0.5) if t.flip else 0
    return fn.crop_mirror_normalize(images, dtype=types.DALIDataType.UINT8,
                                    output_layout=layout, mirror=mirror)


def _val_graph(jpegs: Any, t: ValTransform, decoder: str, layout: str) -> Any:
    from nvidia.dali import fn, types

    images: Any = fn.decoders.image(jpegs, device=decoder, output_type=types.DALIImageType.RGB)
    images = fn.resize(images, resize_shorter=t.resize)
    return fn.crop_mirror_normalize(images, dtype=types.DALIDataType.UINT8,
                                    output_layout=layout, crop=(t.size, t.size),
                                    crop_pos_x=0.5, crop_pos_y=0.5)


# Each transform kind's DALI graph. DALI draws its own crop boxes and flips (its random ops,
# seeded per pass) rather than carrying out the transforms' ``geometry``: feeding it ours
# would mean parsing every image's header on the CPU in the feeding thread before DALI sees
# it, per-sample slice anchors and a flip input, and a decode that is no longer
# ``image_random_crop``'s fused one, for no gain in pixels (DALI resamples with its own
# filter, so its batches would still differ from the Pillow backend's).
GRAPHS: dict[type, Callable[[Any, Any, str, str], Any]] = {
    TrainTransform: _train_graph, ValTransform: _val_graph}


@functools.cache
def placeholder() -> bytes:
    """A small JPEG fed for a bad slot whose batch has no good sample (its row is then
    padding)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (128, 128, 128)).save(buf, "JPEG")
    return buf.getvalue()


@dataclass
class _Fixes:
    """What a pass knows of its bad samples: per plan batch, the stand-in slot of each bad
    slot (-1: none, the slot becomes padding), the batches checked whole, and the error to
    raise on reaching a batch (on_error="raise")."""

    swap: dict[int, dict[int, int]] = field(default_factory=dict)
    checked: set[int] = field(default_factory=set)
    errors: dict[int, LoaderError] = field(default_factory=dict)


@dataclass(eq=False)
class _Feed:
    """A pipeline's external source: DALI asks for its i-th batch; the batch's samples are
    read through the loader's ``Source``, screened, and kept (with their labels) until it is
    yielded; DALI gets the encoded images, a bad slot its stand-in's."""

    source: Source
    rows: list[tuple[int, np.ndarray]]  # (plan batch, real sample ids) this pipeline makes
    fixes: _Fixes
    screen: Callable[[int, list[EncodedSample]], None]
    fed: deque[tuple[int, list[EncodedSample]]] = field(default_factory=deque)  # not yet yielded

    def __call__(self, info: Any) -> list[np.ndarray]:
        if info.iteration >= len(self.rows):
            raise StopIteration  # DALI may ask past the end while it prefetches
        b, ids = self.rows[info.iteration]
        items = self.source.fetch(ids)
        self.screen(b, items)
        self.fed.append((b, items))
        data = [s.data for s in items]
        for slot, good in self.fixes.swap.get(b, {}).items():
            data[slot] = data[good] if good >= 0 else placeholder()
        return [np.frombuffer(d, np.uint8) for d in data]


class DaliBackend(InProcessBackend):
    """The ``dali`` backend (module docstring): a DALI pipeline per pass of the plan."""

    def __init__(self, cfg: Config, source: Source) -> None:
        if cfg.options.device not in DECODER:
            raise ValueError(f"device must be one of {tuple(DECODER)}, not "
                             f"{cfg.options.device!r}")
        super().__init__(cfg, source)
        self.threads = max(1, self.options.workers)  # the Pillow backend's worker count
        self._stream: Any = None  # the CUDA stream batches are copied out on

    # -- a pass
    def run(self, plan: PlannedEpoch, skip: int, in_place: bool = False) -> Iterator[Batch]:
        """The plan's batches from ``skip`` on (each its own memory, ``in_place`` or not;
        pinned when asked)."""
        self._skipped = 0
        fixes = _Fixes()
        b = skip
        pipe, feed = self._start(plan, b, fixes)
        while b < plan.batches:
            ids = self.cfg.slots(plan, b)
            if not (ids != PAD).any():  # padding only: nothing to decode
                yield self._drawn(plan, b, *self._padding(len(ids), plan.size))
                b += 1
                continue
            try:
                out = pipe.run()
            except ImgprepError:
                raise  # the source's own error (a shard that cannot be read …)
            except RuntimeError as e:  # the pipeline is done for: find why, start again
                pipe = None
                self._recover(plan, feed, fixes, e)
                pipe, feed = self._start(plan, b, fixes)
                continue
            done, items = feed.fed.popleft()
            assert done == b, (done, b)
            if b in fixes.errors:
                raise fixes.errors[b]
            batch = self._batch(out[0], plan.size, len(ids), items, fixes.swap.get(b, {}))
            yield self._drawn(plan, b, *batch)
            b += 1

    def _start(self, plan: PlannedEpoch, b: int, fixes: _Fixes) -> tuple[Any, _Feed]:
        """A pipeline making the plan's batches from ``b`` on (None when none has a
        sample), and its source."""
        rows = [(k, ids[ids != PAD]) for k in range(b, plan.batches)
                if ((ids := self.cfg.slots(plan, k)) != PAD).any()]
        feed = _Feed(self.source, rows, fixes,
                     functools.partial(self._screen, fixes, plan.transform))
        if not rows:
            return None, feed
        seed = pass_seed(plan.seed, plan.epoch, self.cfg.world.rank,
                         int(plan.first[rows[0][0]]))
        return self._pipeline(feed, seed, plan.transform), feed

    def _pipeline(self, feed: _Feed, seed: int, transform: Transform) -> Any:
        from nvidia.dali import Pipeline, fn, types

        gpu = self.device.type == "cuda"
        pipe = Pipeline(batch_size=self.options.batch_size, num_threads=self.threads,
                        device_id=self.device.index if gpu else None, seed=seed,
                        prefetch_queue_depth=self.options.prefetch_factor)
        with pipe:
            jpegs = fn.external_source(source=feed, batch=True, batch_info=True,
                                       dtype=types.DALIDataType.UINT8, ndim=1)
            layout = "HWC" if self.options.channels_last else "CHW"
            pipe.set_outputs(decode_graph(jpegs, transform, self.options.device, layout))
        pipe.build()
        return pipe

    # -- batches out
    def _drawn(self, plan: PlannedEpoch, b: int, images: torch.Tensor, labels: torch.Tensor
               ) -> Batch:
        """The batch with its labels (made on the CPU) on the batch's device, and its
        batch-level draws if the options ask for them."""
        draws = self.cfg.draws(plan, b, labels.numpy())
        return with_draws(images, labels.to(self.device), draws)

    def _empty(self, n: int, size: int) -> torch.Tensor:
        """``n`` rows of ``size`` px as DALI lays them out (``loaders.batch.row_shape``)."""
        pin = self.options.pin_memory and self.device.type == "cpu"
        return torch.empty((n, *row_shape(size, self.options.channels_last)), dtype=torch.uint8,
                           device=self.device, pin_memory=pin)

    def _padding(self, n: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` padding rows, and their labels (on the CPU)."""
        rows = self._empty(n, size)
        rows.zero_()
        return (as_nchw(rows, self.options.channels_last),
                torch.full((n,), PAD_LABEL, dtype=torch.int64))

    def _batch(self, out: Any, size: int, n: int, items: list[EncodedSample],
               swap: dict[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """DALI's output for ``items`` as ``n`` rows of ``size`` px (padding after them), each
        bad slot taking its stand-in's row and label; the labels on the CPU."""
        rows = self._empty(n, size)
        rows[len(items):] = 0
        self._copy(out.as_tensor(), rows[:len(items)])
        images = as_nchw(rows, self.options.channels_last)
        labels = torch.full((n,), PAD_LABEL, dtype=torch.int64)
        labels[:len(items)] = torch.tensor([s.label for s in items], dtype=torch.int64)
        for slot, good in swap.items():
            images[slot] = images[good] if good >= 0 else 0
            labels[slot] = labels[good] if good >= 0 else PAD_LABEL
        self._skipped += len(swap)
        return images, labels

    def _copy(self, tensor: Any, into: torch.Tensor) -> None:
        from nvidia.dali.plugin.pytorch import feed_ndarray

        if into.is_cuda:
            if self._stream is None:
                self._stream = torch.cuda.Stream(self.device)
            feed_ndarray(tensor, into, cuda_stream=self._stream)
            self._stream.synchronize()  # DALI's buffer is reused by the next run
        else:
            feed_ndarray(tensor, into)

    # -- errors
    def _screen(self, fixes: _Fixes, t: Transform, b: int, items: list[EncodedSample]) -> None:
        """Before DALI sees batch ``b``: a sample that does not end as a JPEG does (its EOI
        marker) is decoded by the Pillow backend's rule first. DALI's libjpeg-turbo decodes
        a JPEG whose last bytes are missing (the rest grey), which Pillow refuses."""
        if b in fixes.checked:
            return
        suspects = [slot for slot, s in enumerate(items) if not s.data.endswith(EOI)]
        bad = self._bad([items[k] for k in suspects], t)
        self._settle(fixes, b, items, [(suspects[k], e) for k, e in bad])

    def _recover(self, plan: PlannedEpoch, feed: _Feed, fixes: _Fixes,
                 error: RuntimeError) -> None:
        """After DALI failed: find the bad samples of the batches it was given and not yet
        yielded, with the Pillow backend's decoder, and settle them. Raises when there is
        none to find."""
        found = False
        for b, items in feed.fed:
            if b not in fixes.checked:
                fixes.checked.add(b)
                found |= self._settle(fixes, b, items, self._bad(items, plan.transform))
        if not found:
            first = feed.fed[0][0] if feed.fed else "?"
            why = " ".join(str(error).split())[:300]
            raise LoaderError(
                f"rank {self.cfg.world.rank}: DALI cannot decode batch {first} of epoch "
                f"{plan.epoch} ({why}), yet Pillow decodes every sample of it; load with "
                "backend='pillow'") from error

    def _settle(self, fixes: _Fixes, b: int, items: list[EncodedSample],
                bad: list[tuple[int, SampleError]]) -> bool:
        """Record what batch ``b``'s bad samples get: stand-ins (DALI must decode something
        in their slots), and with on_error="raise" the error the Pillow backend raises, for
        when the batch is reached. Whether there was any."""
        if not bad:
            return False
        fixes.swap[b] = stand_ins(len(items), [slot for slot, _ in bad])
        if self.options.on_error == "raise":
            fixes.errors[b] = LoaderError(f"rank {self.cfg.world.rank}: {bad[0][1]}; "
                                          f"{self.source.fix}, or load with on_error='skip'")
        return True

    def _bad(self, items: list[EncodedSample], t: Transform) -> list[tuple[int, SampleError]]:
        """The slots of ``items`` the Pillow backend cannot decode with the epoch's transform
        ``t``, with its errors."""
        scratch = np.empty((3, t.size, t.size), np.uint8)
        rng = np.random.default_rng(0)
        bad = []
        for slot, s in enumerate(items):
            try:
                apply(s.data, t, rng, scratch, where=s.where)
            except SampleError as e:
                bad.append((slot, e))
        return bad
