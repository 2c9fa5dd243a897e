"""The ``nvjpeg`` backend: the Pillow backend's plans and batches, decoded a batch at a time by
torchvision's nvJPEG on this rank's GPU and cropped there in a few batched tensor ops.

- What is read is the base's (``loaders.base``): the plan's batches, each fetched through the
  loader's ``Source`` (shards: ``os.pread`` by offset through the sample index), so the
  samples of every rank and step, the tails, padding, resume (elastic too) and ``len()`` are
  the Pillow backend's.
- Decoding: ``device="gpu"`` hands a batch's whole JPEGs to
  ``torchvision.io.decode_jpeg(list, device="cuda:<local_rank>")`` in one call (nvJPEG, its
  hardware decoder where the GPU has one). A sample goes to the CPU decode instead (Pillow,
  the whole image to RGB: ``cpu_decode``) when its headers say nvJPEG may not decode it as
  Pillow would (``on_device``: not a Huffman-coded JPEG of 1 or 3 components, larger than
  Pillow's pixel bound, or not ending with the JPEG end marker, which libjpeg-turbo and
  nvJPEG would decode grey where Pillow refuses it), and when nvJPEG fails on it: a batch
  nvJPEG refuses is decoded again one sample at a time, and each sample it refuses again
  falls back to the CPU. ``device="cpu"`` (the backend's CPU form, and tests) decodes every
  sample on the CPU and runs the rest on the CPU; torchvision is needed only for ``"gpu"``.
- Crops: each image's box and flip are drawn by the Pillow backend's own draws
  (``loaders.batchcrop.boxes`` over the epoch's transform's ``geometry``, from the batch's
  generator of the epoch's plan, ``PlannedEpoch.batch_rng``, as the Pillow backend draws
  them), so a batch whose samples all decode gets the Pillow backend's boxes and flips; the
  pixels are resampled on the device for the whole batch at once, to the epoch's size
  (``loaders.batchcrop.crop_resize``: bilinear, no antialiasing) from another decoder's
  pixels, so they are not the Pillow backend's (docs/nvjpeg.md).
  Batches leave as uint8 rows (CHW, or HWC for channels_last: NCHW-shaped either way) on
  the device, labels beside them; normalisation is ``DeviceLoader``'s, on the device. With
  ``random_erase`` or ``mixup`` set, each batch's batch-level draws are made as the Pillow
  backend makes them (``Config.draws``, once its labels are known) and travel third.
- Errors: a sample neither nvJPEG nor Pillow decodes is bad by the Pillow backend's rule
  (Pillow's verdict): ``on_error="raise"`` raises the Pillow backend's ``LoaderError`` naming
  it; ``"skip"`` gives its slot a good sample of the same batch (``stand_ins``), or padding
  when there is none, counted in ``skipped``.
- Threads: with ``workers`` >= 1, batches are made ahead (``prefetch_factor`` of them) in
  one thread beside the training loop, on a CUDA stream of its own, and the CPU decodes run
  in a pool of ``workers`` threads (Pillow decodes without the GIL); ``workers=0`` makes
  each batch when it is asked for, in the caller's thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import numpy as np
import torch
from PIL import Image

from loaders import placement
from loaders.backends import Batch, EncodedSample, InProcessBackend, Source, stand_ins
from loaders.batch import PAD_LABEL, as_nchw, row_shape, with_draws
from loaders.batchcrop import boxes, crop_resize
from loaders.config import Config, PlannedEpoch
from loaders.epochs import PAD
from loaders.errors import LoaderError
from loaders.transforms import SampleError, decoding, into_chw, open_sample

logger = logging.getLogger(__name__)
SOI, EOI = b"\xff\xd8", b"\xff\xd9"  # a JPEG's first and last two bytes
HUFFMAN_FRAMES = (0xC0, 0xC1, 0xC2)  # baseline, extended, progressive: what nvJPEG decodes
JOIN_S = 120.0  # how long a pass that ends waits for its thread's batch in the making
# a GPU decoder: a batch's encoded samples -> RGB 3 x H x W on the device, None where it
# refuses one (torchvision raises for the batch instead: nvjpeg_decode finds the sample)
Decoder = Callable[[list[torch.Tensor], torch.device], list[torch.Tensor | None]]


def jpeg_frame(data: bytes) -> tuple[int, int, int, int] | None:
    """``(frame marker, width, height, components)`` of a JPEG's frame header (SOFn); None
    when ``data`` is not a JPEG whose markers lead to one."""
    if not data.startswith(SOI):
        return None
    at, end = 2, len(data)
    while at + 4 <= end:
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0xD9, 0xDA):  # the end, or a scan before any frame header
            return None
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if at + 10 > end:
                return None
            height = int.from_bytes(data[at + 5:at + 7], "big")
            width = int.from_bytes(data[at + 7:at + 9], "big")
            return marker, width, height, data[at + 9]
        at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    return None


def on_device(data: bytes) -> bool:
    """Whether nvJPEG is given ``data`` (module docstring): a Huffman-coded JPEG of 1 or 3
    components within Pillow's pixel bound, ending with the end marker."""
    frame = jpeg_frame(data)
    if frame is None or not data.endswith(EOI):
        return False
    marker, width, height, components = frame
    pixels = width * height
    bound = Image.MAX_IMAGE_PIXELS or pixels
    return marker in HUFFMAN_FRAMES and components in (1, 3) and 0 < pixels <= bound


def cpu_decode(data: bytes, where: str) -> torch.Tensor:
    """Pillow's decode of the whole image to RGB, as a 3 x H x W uint8 CPU tensor; a
    ``SampleError`` naming ``where`` when Pillow cannot decode it."""
    img = open_sample(data, where)
    with decoding(img, where):
        rgb = img.convert("RGB")
    out = np.empty((3, rgb.height, rgb.width), np.uint8)
    into_chw(rgb, out)
    return torch.from_numpy(out)


def load_nvjpeg(rank: int) -> Decoder:
    """torchvision's batched nvJPEG decode (RGB out); a ``LoaderError`` saying how to install
    torchvision without replacing the installed PIL or torch when it cannot be imported."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except (ImportError, OSError, RuntimeError) as e:  # absent, or built for another torch
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        raise LoaderError(
            f"rank {rank}: backend='nvjpeg' with device='gpu' decodes with torchvision's "
            f"nvJPEG, which cannot be imported ({reason}); install the torchvision release "
            "made for this torch with pip install --no-deps 'torchvision==<its version>' "
            "(--no-deps keeps this PIL and this torch), or load with device='cpu'") from None

    def decode(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | None]:
        return list(decode_jpeg(datas, mode=ImageReadMode.RGB, device=device))

    return decode


def nvjpeg_decode(decode: Decoder, datas: list[bytes], device: torch.device
                  ) -> list[torch.Tensor | None]:
    """``datas`` decoded by ``decode`` in one batch; when the batch fails, one at a time,
    None for each sample it fails on again (or refuses in the batch)."""
    encoded = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]
    try:
        return list(decode(encoded, device))
    except RuntimeError:
        pass  # one bad sample fails the batch: find it
    out: list[torch.Tensor | None] = []
    for one in encoded:
        try:
            out.append(decode([one], device)[0])
        except RuntimeError:
            out.append(None)
    return out


def decode_samples(items: list[EncodedSample], nvjpeg: Decoder | None, device: torch.device,
                   map_: Callable[[Callable[[Any], Any], list[Any]], list[Any]],
                   share: float = 1.0) -> tuple[list[torch.Tensor | SampleError], int]:
    """Each sample as a 3 x H x W uint8 tensor on ``device``, or why it is bad, and how many
    were decoded on the CPU: ``nvjpeg`` (None: the CPU form) first for what it may decode
    (``on_device``), at most ``share`` of the batch (rounded; the first such samples), Pillow
    for the rest and for what the GPU decoder refuses (``map_`` runs those decodes: in a
    thread pool)."""
    out: list[torch.Tensor | SampleError | None] = [None] * len(items)
    if nvjpeg is not None:
        slots = [i for i, s in enumerate(items) if on_device(s.data)]
        slots = slots[:round(share * len(items))]
        if slots:
            got = nvjpeg_decode(nvjpeg, [items[i].data for i in slots], device)
            for i, image in zip(slots, got, strict=True):
                out[i] = image

    def on_cpu(s: EncodedSample) -> torch.Tensor | SampleError:
        try:
            return cpu_decode(s.data, s.where).to(device)
        except SampleError as e:
            return e

    rest = [i for i, d in enumerate(out) if d is None]
    for i, image in zip(rest, map_(on_cpu, [items[i] for i in rest]), strict=True):
        out[i] = image
    return [d for d in out if d is not None], len(rest)


def ahead(make: Callable[[int], Any], items: range, depth: int,
          setup: Callable[[], AbstractContextManager[Any]] = nullcontext,
          start: Callable[[], None] | None = None) -> Iterator[Any]:
    """``make(i)`` for each of ``items``, in order, made in a thread at most ``depth`` ahead
    of the consumer, each inside ``setup()`` (a context: a CUDA stream), after ``start()``
    (the thread's placement, ``loaders.placement.thread_init``); the thread's error is raised
    here. Closing the iterator stops the thread after the item in the making."""
    done: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(kind: str, value: Any) -> bool:
        while not stop.is_set():
            try:
                done.put((kind, value), timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            if start is not None:
                start()
            for i in items:
                with setup():
                    value = make(i)
                if not put("item", value):
                    return
        except Exception as e:  # raised in the consumer, with its traceback
            put("error", e)
        else:
            put("end", None)

    thread = threading.Thread(target=run, name="nvjpeg-batches", daemon=True)
    thread.start()
    try:
        while True:
            try:
                kind, value = done.get(timeout=1.0)
            except queue.Empty:
                if thread.is_alive():
                    continue
                raise LoaderError("the nvjpeg backend's batch thread ended without its next "
                                  "batch or an error; rerun to resume from the last "
                                  "checkpoint") from None
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()
        thread.join(JOIN_S)
        if thread.is_alive():
            logger.warning("the nvjpeg backend's thread is still making a batch after "
                           "%.0f s; it is left to finish alone", JOIN_S)


class NvjpegBackend(InProcessBackend):
    """The ``nvjpeg`` backend (module docstring)."""

    def __init__(self, cfg: Config, source: Source) -> None:
        super().__init__(cfg, source)
        self._nvjpeg = self._gpu_decoder()
        self.share = 1.0  # of each batch the GPU decoder is given at most
        self.threads = self.options.workers
        self._pool: ThreadPoolExecutor | None = None
        self._side: torch.cuda.Stream | None = None  # the thread's CUDA stream
        self.cpu_decoded = 0  # samples decoded on the CPU since the loader was made

    # -- a pass
    def run(self, plan: PlannedEpoch, skip: int, in_place: bool = False) -> Iterator[Batch]:
        """The plan's batches from ``skip`` on (each its own memory, ``in_place`` or not)."""
        self._skipped = 0
        batches = range(skip, plan.batches)
        made: Iterator[tuple[torch.Tensor, torch.Tensor, int, bytes | None]]
        if self.threads == 0:
            made = (self._make(plan, b) for b in batches)
        else:
            made = ahead(lambda b: self._make(plan, b), batches, self.options.prefetch_factor,
                         self._on_stream if self.device.type == "cuda" else nullcontext,
                         placement.thread_init(self.options))
        for images, labels, bad, draws in made:
            if images.is_cuda and self.threads:  # made on the thread's stream, used on ours
                stream = torch.cuda.current_stream(self.device)
                images.record_stream(stream)
                labels.record_stream(stream)
            self._skipped += bad
            yield with_draws(images, labels, draws)

    @contextmanager
    def _on_stream(self) -> Iterator[None]:
        """Where the thread makes a batch on a GPU: a CUDA stream of its own, waited for
        before the batch is handed over."""
        torch.cuda.set_device(self.device)  # this thread's current device
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self._side):
            yield
        self._side.synchronize()

    def _make(self, plan: PlannedEpoch, b: int
              ) -> tuple[torch.Tensor, torch.Tensor, int, bytes | None]:
        """Batch ``b``: its rows, labels, the count of bad samples it replaced and its
        batch-level draws (``Config.draws``)."""
        cfg = self.cfg
        ids = cfg.slots(plan, b)
        o = cfg.options
        n, size = len(ids), plan.size
        items = self.source.fetch(ids[ids != PAD])
        decoded = self._decode(items)
        bad = [i for i, d in enumerate(decoded) if isinstance(d, SampleError)]
        if bad and o.on_error == "raise":
            raise LoaderError(f"rank {cfg.world.rank}: {decoded[bad[0]]}; {self.source.fix}, "
                              "or load with on_error='skip'")
        good = [i for i, d in enumerate(decoded) if isinstance(d, torch.Tensor)]
        labels = torch.full((n,), PAD_LABEL, dtype=torch.int64)
        labels[:len(items)] = torch.tensor([s.label for s in items], dtype=torch.int64)
        if len(good) == n:
            rows = self._crop(plan, b, [decoded[i] for i in good])
        else:
            rows = torch.zeros((n, *row_shape(size, o.channels_last)), dtype=torch.uint8,
                               device=self.device)
            if good:
                rows[good] = self._crop(plan, b, [decoded[i] for i in good])
        for slot, g in stand_ins(len(items), bad).items():  # a good sample takes the slot
            rows[slot] = rows[g] if g >= 0 else 0
            labels[slot] = labels[g] if g >= 0 else PAD_LABEL
        if o.pin_memory and not rows.is_cuda:
            rows = rows.pin_memory()
        draws = cfg.draws(plan, b, labels.numpy())
        return as_nchw(rows, o.channels_last), labels.to(self.device), len(bad), draws

    def _crop(self, plan: PlannedEpoch, b: int, images: list[Any]) -> torch.Tensor:
        """Batch ``b``'s decoded images cropped, resized and flipped, drawn as the Pillow
        backend draws the batch (the plan's generator of the batch)."""
        box, flip = boxes([(im.shape[2], im.shape[1]) for im in images], plan.transform,
                          plan.batch_rng(b))
        return crop_resize(images, box, flip, plan.size, self.options.channels_last)

    # -- decoding
    def _gpu_decoder(self) -> Decoder | None:
        """The GPU decoder: torchvision's nvJPEG with device="gpu"; None in the CPU form."""
        return load_nvjpeg(self.cfg.world.rank) if self.device.type == "cuda" else None

    def _decode(self, items: list[EncodedSample]) -> list[torch.Tensor | SampleError]:
        decoded, on_cpu = decode_samples(items, self._nvjpeg, self.device, self._map,
                                         self.share)
        self.cpu_decoded += on_cpu
        return decoded

    def _map(self, fn: Callable[[Any], Any], args: list[Any]) -> list[Any]:
        """``fn`` over ``args``, in the pool of ``workers`` threads when there is more than
        one to do."""
        if self.threads == 0 or len(args) < 2:
            return [fn(a) for a in args]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="nvjpeg-cpu",
                                            initializer=placement.thread_init(self.options))
        return list(self._pool.map(fn, args))
