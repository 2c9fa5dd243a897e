"""The ``pillow`` decoder backend: CPU decoding in persistent DataLoader worker processes
(``loaders.decode``: imgprep's extension, or Pillow with ``crop_decode=False``).

- Workers (persistent DataLoader processes, ``WorkerStream``) compute their rank's plan
  themselves from the epoch, the plan's starting positions and the batches to skip, which the
  backend writes into the ring's counters (``loaders.ring``), and decode their batches (batch
  b of the pass: the worker of ``(b - skip) % workers``) straight into ring slots; the
  loader's process copies them out in order, or hands them over in place (``PillowBackend``).
- Rows are written as the loader's ``memory_format`` says: 3 x size x size, or size x size x
  3 (``channels_last``); either way the batch leaves NCHW-shaped with the same values. The
  size is the epoch's plan's (``loaders.config.PlannedEpoch``: a size schedule's); the
  ring's slots hold the largest (``ResolvedOptions.sizes``), so the workers go on through
  every size change.
- Augmentation draws come from the plan's generator of the batch (``PlannedEpoch.batch_rng``:
  seeded by the batch's first position in the epoch's order): any worker count gives the
  same batches, and resuming at batch k reads and decodes nothing before it. With
  ``random_erase`` or ``mixup`` set, the worker then makes the batch's batch-level draws
  (``Config.draws``, from ``PlannedEpoch.batch_draws_rng``), which travel packed beside the
  labels, by value (``loaders.mixing``).
- An undecodable sample raises a ``LoaderError`` naming it, or with ``on_error="skip"`` its
  slot takes a good sample of the same batch (``loaders.backends.stand_ins``) and is counted.
- ``workers=0`` decodes in the loader's process, batch by batch.
- Placement (``loaders.placement``): with a CPU plan the loader's process keeps its core once
  its workers have started (whose count DataLoader weighs against the process's CPUs) and
  each worker pins itself to the rest of the rank's share as it starts. With ``sizing``
  (``loaders.sizing``) only the pass's *active* workers (``Ring.set_active``) decode, the
  batch of the pass from batch s going to worker ``(b - s) % active``; a change of the count
  starts a new pass at the next batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from loaders import placement
from loaders.backends import Batch, EncodedSample, Source, stand_ins
from loaders.batch import PAD_LABEL, as_nchw, row_shape
from loaders.config import Config, PlannedEpoch
from loaders.decode import SampleDecoder
from loaders.epochs import PAD, EpochPlan
from loaders.errors import LoaderError
from loaders.ring import Ring, is_dead
from loaders.sizing import Sizer
from loaders.transforms import SampleError, Transform


class Abandoned(Exception):
    """A worker's batch of an iteration the main process has left: stop making it."""


class WorkerStream(IterableDataset):
    """What each DataLoader worker runs: its batches of the rank's plan, as tagged batches
    (decoded into its ring slots; yielded whole when running in the main process)."""

    def __init__(self, cfg: Config, ring: Ring, source: Source) -> None:
        self.cfg, self.ring, self.source = cfg, ring, source
        self._plan: PlannedEpoch | None = None
        self._decoder: SampleDecoder | None = None  # made in the worker, after the fork

    def _plan_for(self, epoch: int, starts: tuple[int, ...]) -> PlannedEpoch:
        p = self._plan
        if p is None or (p.epoch, p.starts) != (epoch, starts):
            p = self._plan = self.cfg.plan(epoch, starts)
        return p

    def __iter__(self) -> Iterator[tuple[int, Any, Any, bytes | None]]:
        cfg, ring, o = self.cfg, self.ring, self.cfg.options
        info = get_worker_info()
        w = info.id if info is not None else 0
        if ring.data is not None:
            ring.begin(w)
        generation, active = ring.generation, max(1, ring.active())
        epoch, starts, skip = ring.epoch()
        if w >= active:
            return  # asleep this pass (loaders.sizing)
        plan = self._plan_for(epoch, starts)
        size = plan.size
        made = 0
        for b in range(skip + w, plan.batches, active):
            ring.note(w, b)
            cpu = time.process_time()
            ids = cfg.slots(plan, b)
            samples = self.source.fetch(ids[ids != PAD])
            rng = plan.batch_rng(b)
            if ring.data is None:
                images = np.empty((len(ids), *row_shape(size, o.channels_last)), np.uint8)
                labels = self._decode(samples, rng, images, w, plan.transform)
                yield (b, as_nchw(torch.from_numpy(images), o.channels_last),
                       torch.from_numpy(labels), cfg.draws(plan, b, labels))
                continue
            if not ring.acquire(w, generation):
                return  # the main process started over: this iteration is abandoned
            slot = made % ring.slots
            rows = ring.slot_array(w, slot, len(ids), size)
            try:
                labels = self._decode(samples, rng, rows, w, plan.transform, generation)
            except Abandoned:
                return  # the main process started over mid-batch (a resize, a new pass)
            made += 1
            draws = cfg.draws(plan, b, labels)
            ring.add_work(w, time.process_time() - cpu)
            yield b, (generation, w, slot, len(ids), size), labels.tobytes(), draws  # by value

    def _decoder_for(self, t: Transform) -> SampleDecoder:
        """The sample decoder of an epoch's transform (made again when its size changes)."""
        o = self.cfg.options
        if self._decoder is None or self._decoder.transform != t:
            self._decoder = SampleDecoder(t, channels_last=o.channels_last, fast=o.crop_decode)
        return self._decoder

    def _decode(self, samples: list[EncodedSample], rng: np.random.Generator,
                images: np.ndarray, w: int, t: Transform, generation: int | None = None
                ) -> np.ndarray:
        """Decode and augment ``samples`` into ``images`` (n rows, ``row_shape``); rows past
        the samples (``tail="pad"``) are zeroed. Returns the labels, PAD_LABEL for padding;
        raises ``Abandoned`` once the ring's generation is no longer ``generation``."""
        cfg, o = self.cfg, self.cfg.options
        decode = self._decoder_for(t)
        images[len(samples):] = 0
        labels = np.full(len(images), PAD_LABEL, dtype=np.int64)
        bad: list[int] = []
        for i, sample in enumerate(samples):
            if generation is not None and self.ring.generation != generation:
                raise Abandoned(generation)
            try:
                decode(sample.data if sample.view is None else sample.view, rng, images[i],
                       where=sample.where)
                labels[i] = sample.label
            except SampleError as e:
                if o.on_error == "raise":
                    raise LoaderError(f"rank {cfg.world.rank}: {e}; {self.source.fix}, or "
                                      "load with on_error='skip'") from e
                bad.append(i)
        if bad:
            self.ring.add_skipped(w, len(bad))
            for b, g in stand_ins(len(samples), bad).items():  # a good sample takes the slot
                images[b] = images[g] if g >= 0 else 0
                labels[b] = labels[g] if g >= 0 else PAD_LABEL
        return labels


class PillowBackend:
    """The ``pillow`` backend: persistent DataLoader workers decode their batches
    (``WorkerStream``) into the ring's shared-memory slots; the loader's process copies them
    out in order (or hands them over in place)."""

    def __init__(self, cfg: Config, source: Source) -> None:
        o = cfg.options
        if o.device != "cpu":
            raise ValueError(f"device={o.device!r}: the pillow backend decodes on the "
                             "CPU (DeviceLoader moves its batches); device='gpu' needs "
                             "backend='dali' or backend='nvjpeg'")
        self.pin, self.options = o.pin_memory, o
        # prefetch_factor batches in flight per worker, one being decoded, one spare
        self.ring = Ring(o.workers, o.prefetch_factor + 2, o.batch_size, o.sizes.largest,
                         pools=len(cfg.pool_sizes), channels_last=o.channels_last)
        self.loader = DataLoader(
            WorkerStream(cfg, self.ring, source), batch_size=None, num_workers=o.workers,
            persistent_workers=o.workers > 0, pin_memory=self.pin and o.workers == 0,
            prefetch_factor=o.prefetch_factor if o.workers > 0 else None,
            worker_init_fn=placement.worker_init(o))
        self.workers = o.workers
        self.sizer = None if o.sizing is None else Sizer(o.sizing, o.workers)

    @property
    def skipped(self) -> int:
        return self.ring.skipped()

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(self.ring.pid(w) for w in range(self.workers))

    def lock_pages(self) -> bool:
        return self.ring.lock_pages()

    @property
    def page_locked(self) -> bool:
        return self.ring.page_locked

    @property
    def active(self) -> int:
        """The workers that make the batches now (all of them unless ``sizing``)."""
        return self.workers if self.sizer is None else self.sizer.count

    def run(self, plan: PlannedEpoch, skip: int, in_place: bool = False) -> Iterator[Batch]:
        if self.sizer is None:
            return self._pass(plan, skip, in_place)
        return self._sized(plan, skip, in_place, self.sizer)

    def _sized(self, plan: PlannedEpoch, skip: int, in_place: bool, sizer: Sizer
               ) -> Iterator[Batch]:
        """Passes of the sizer's count, a new one from the next batch at each change."""
        b = skip
        while b < plan.batches:
            batches = self._pass(plan, b, in_place)
            try:
                for batch in sizer.watch(batches, self.ring.work, plan.epoch, b):
                    yield batch
                    b += 1
            finally:
                batches.close()

    def _pass(self, plan: PlannedEpoch, skip: int, in_place: bool
              ) -> Generator[Batch, None, None]:
        self.ring.set_active(self.active)
        self.ring.set_epoch(plan.epoch, plan.starts, skip)
        generation = self.ring.new_iteration()  # workers of an abandoned iteration stop
        items = iter(self.loader)  # the workers start (forked from the unpinned process)
        placement.enter(self.options)  # then the process keeps its core (every pass: cheap)
        return self.ring.in_order(items, generation, self.pin, skip, in_place)

    def dead(self, plan: EpochPlan, describe: Callable[[EpochPlan, int], str]) -> str:
        """'worker 1 (pid 123, making batch 4 …)' for the workers whose recorded pids have
        exited."""
        dead = []
        for w in range(self.workers):
            pid = self.ring.pid(w)
            if is_dead(pid):
                b = self.ring.making(w)
                dead.append(f"worker {w} (pid {pid}, making batch {b}{describe(plan, b)})")
        return "; ".join(dead)
