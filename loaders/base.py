"""What the shard and label-list loaders share, so that they keep the same promises.

- A loader is this base over a *source*, where samples come from (a shard set:
  ``loaders.shards``; a label list: ``loaders.labellist``): the loader numbers the samples (a
  shard set's sample ids; a list's entries, as one "shard") and hands the base the ``Config``
  its plans are made from (``loaders.config``) and a ``Source`` that fetches samples by
  number. Plans, tails and resume are then one code.
- Plans come from ``loaders.epochs``: equal step counts on every rank (``uneven`` aside),
  stated before the epoch. The base holds each as the epoch's ``PlannedEpoch``
  (``loaders.config``: the plan, the epoch's transform and output size, the batches' seeds),
  which ``plan(epoch)`` gives to the trainer too.
- A *decoder backend* (``loaders.backends``: ``pillow``, ``dali``, ``nvjpeg``) turns each
  pass's planned epoch into batches; the base picks it by name and only counts what it
  yields.
- ``state_dict`` holds the batches done on this World and, per pool, the positions of the
  epoch's order done (one count when one says it for every pool); a state from another
  World resumes from the positions (elastic; partition data only on its own node count).
  It also records the order's version (``loaders.order``: absent means 1); a state of
  another version is refused, since its positions mean other samples. With a size schedule
  (``loaders.schedule``) it records the schedule (``size_schedule``, its one spelling); a
  state of another schedule, or of none, is refused: the rest of its epoch would be made
  at other sizes than the run that wrote it made. And, with the pillow backend, the pixel
  version (``PIXELS_KEY``: who decodes and resamples, and with an augmentation policy the
  version of its draws and ops, ``loaders.decode.pixel_version``): a
  pillow-backend state of other pixels is refused, naming both, since the batches after the
  resume would not be the ones the run had made. A state without one (another backend's,
  whose augmentation is its own, or one written before pixel versions were recorded)
  resumes. With repeated augmentation (``loaders.repeats``) it records the repeat count
  (``REPEATS_KEY``, only above 1); a state of another count is refused: its positions count
  another epoch's repeated order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from imgprep import ImgprepError, WorldError
from loaders.backends import Backend, Batch, Source, backend_class
from loaders.config import Config, PlannedEpoch
from loaders.decode import augments, pixel_version
from loaders.epochs import EpochPlan, as_samples, pool_starts
from loaders.errors import LoaderError
from loaders.order import ORDER_KEY
from loaders.repeats import REPEATS_KEY

SCHEDULE_KEY = "size_schedule"  # a state's size schedule (absent: none)
PIXELS_KEY = "pixels"  # a pillow-backend state's pixel version (absent: any)


class PlannedLoader:
    """A rank's loader over planned epochs; ``ShardLoader`` and ``LabelListLoader`` add where
    the samples come from. ``len()`` (batches the next pass yields) and
    ``batches_per_epoch`` are stated before the epoch; every rank gets the same unless
    ``tail="uneven"``."""

    def __init__(self, cfg: Config, source: Source) -> None:
        make = backend_class(cfg.options.backend)  # unknown or missing: fails before anything
        self.cfg, self.world, self.options = cfg, cfg.world, cfg.options
        self._sizes = cfg.pool_sizes
        self._plans: dict[tuple[int, tuple[int, ...]], PlannedEpoch] = {}
        self.set_epoch(0)
        self.plan(0)  # fail now, not in a worker, if this World cannot be served
        self._decoder: Backend = make(cfg, source)

    # -- what a subclass says about its data
    def check_plan(self, plan: EpochPlan) -> None:
        """Refuse a plan this loader's data cannot serve (before reading anything)."""

    def describe(self, plan: EpochPlan, b: int) -> str:
        """What batch ``b`` of ``plan`` reads, for a dead worker's message."""
        return ""

    # -- plans and epochs
    @property
    def skipped(self) -> int:
        """Samples replaced because they could not be decoded (on_error='skip'), this pass."""
        return self._decoder.skipped

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """The worker processes' pids, as each recorded itself (0: not started; none for a
        backend that decodes in threads)."""
        return self._decoder.pids

    @property
    def active_workers(self) -> int:
        """The workers (threads with the dali and nvjpeg backends) that decode now: the
        options' ``workers``, or with ``sizing`` the count the consumer's demand set last
        (``loaders.sizing``)."""
        return self._decoder.active

    def plan(self, epoch: int | None = None, start: int | tuple[int, ...] | None = None
             ) -> PlannedEpoch:
        """This rank's plan of ``epoch`` from ``start`` (per pool, or one count for all),
        with the epoch's transform and output size (``PlannedEpoch.size``); by default the
        current epoch's plan that the next pass continues."""
        if epoch is None:
            epoch = self.epoch
            start = self._from if start is None else start
        starts = pool_starts(0 if start is None else start, self._sizes)
        key = (epoch, starts)
        if key not in self._plans:
            plan = self.cfg.plan(epoch, starts)
            self.check_plan(plan)
            self._plans = {k: v for k, v in self._plans.items() if k[0] == epoch}
            self._plans[key] = plan
        return self._plans[key]

    @property
    def output_sizes(self) -> tuple[int, ...]:
        """Every output size this loader's epochs are made at, ascending (a size schedule's,
        or the transform's one): what a compiled model is made for."""
        return self.options.sizes.sizes

    @property
    def batches_per_epoch(self) -> int:
        """A whole epoch's batches on this World (unchanged by ``load_state_dict``)."""
        return self.plan(self.epoch, 0).batches

    def __len__(self) -> int:
        return self.plan().batches - self._skip

    def set_epoch(self, epoch: int) -> None:
        """Iterate ``epoch`` next, from its first batch."""
        self.epoch, self._from = epoch, (0,) * len(self._sizes)
        self._b0 = self._skip = self._yielded = 0

    # -- resume
    def _shape(self) -> dict[str, Any]:
        w = self.world
        return {"mode": self.cfg.mode, "world_size": w.world_size, "num_nodes": w.num_nodes,
                "local_world_size": w.local_world_size, "batch_size": self.options.batch_size}

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands: the epoch, its batches done on this World (of the plan
        that began at ``from``: 0, or where a resume from another World began), and the
        positions of each pool's order done, which any World resumes from."""
        done = self.plan().position(self._skip + self._yielded)
        sched, k = self.options.size_schedule, self.options.repeats
        return {"epoch": self.epoch, "batch": self._b0 + self._skip + self._yielded,
                "samples": as_samples(done, self._sizes),
                "from": as_samples(self._from, self._sizes),
                ORDER_KEY: self.options.order_version, **self._shape(),
                **({} if sched is None else {SCHEDULE_KEY: str(sched)}),
                **({} if k == 1 else {REPEATS_KEY: k}),
                **({} if self.pixels is None else {PIXELS_KEY: self.pixels})}

    @property
    def pixels(self) -> str | None:
        """The pixel version of this loader's batches (``PIXELS_KEY``), or None for a GPU
        backend."""
        o = self.options
        if o.backend != "pillow":
            return None
        return pixel_version(o.crop_decode, augments(o.transform))

    def _b_at(self, epoch: int, starts: tuple[int, ...]) -> int:
        """The index of the batch of this World's whole epoch that a plan from ``starts``
        begins at (the whole batches already done there)."""
        if not any(starts):
            return 0
        full = self.plan(epoch, 0)
        pool = full.group.pool
        return int(np.searchsorted(full.done[pool], starts[pool], side="right"))

    def _starts(self, state: Mapping[str, Any], key: str, epoch: int) -> tuple[int, ...]:
        value = state.get(key, 0)
        counts = [value] if isinstance(value, int) else list(value)
        if len(counts) not in (1, len(self._sizes)) or not all(
                0 <= int(c) <= max(self._sizes) for c in counts):
            raise ValueError(f"{key} {value} is outside epoch {epoch}")
        return pool_starts(value if isinstance(value, int) else tuple(value), self._sizes)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume where ``state`` (from ``state_dict``, on this World or, in replicate mode,
        on another number of ranks or batch size) stands: each remaining sample of the epoch
        once, and on the same World exactly the batches an uninterrupted run yields."""
        self._check_order(state)
        self._check_repeats(state)
        self._check_schedule(state)
        self._check_pixels(state)
        epoch, b = int(state["epoch"]), int(state["batch"])
        if "samples" not in state or all(state.get(k) == v for k, v in self._shape().items()):
            starts = self._starts(state, "from", epoch)
            b0 = self._b_at(epoch, starts)
            if not 0 <= b - b0 <= self.plan(epoch, starts).batches:
                raise ValueError(f"batch {b} is outside epoch {epoch}")
        else:
            self._check_elastic(state)
            starts = self._starts(state, "samples", epoch)
            b0 = b = self._b_at(epoch, starts)
            self.plan(epoch, starts)  # refuse now if this World cannot be served from there
        self.epoch, self._from, self._b0 = epoch, starts, b0
        self._skip, self._yielded = b - b0, 0

    def _check_order(self, state: Mapping[str, Any]) -> None:
        """Refuse a state whose epoch order is of another version than this loader's."""
        theirs, mine = state.get(ORDER_KEY, 1), self.options.order_version
        if theirs == mine:
            return
        why = "" if ORDER_KEY in state else f" (it has no {ORDER_KEY!r}: written before " \
            "versions were recorded)"
        raise LoaderError(
            f"rank {self.world.rank}: the checkpoint's epoch order is version {theirs}{why}, "
            f"this loader's is version {mine}: its positions would name other samples; make "
            f"the loader with order_version={theirs} to resume it exactly (later epochs keep "
            "that order), or start a new epoch on this loader with set_epoch")

    def _check_repeats(self, state: Mapping[str, Any]) -> None:
        """Refuse a state written with another repeat count than this loader's."""
        theirs, mine = state.get(REPEATS_KEY, 1), self.options.repeats
        if theirs == mine:
            return
        raise LoaderError(
            f"rank {self.world.rank}: the checkpoint was written with repeats={theirs}, this "
            f"loader has repeats={mine}: its positions count another epoch of repeated "
            f"samples; make the loader with repeats={theirs} to resume it, or start a new "
            "epoch on this loader with set_epoch")

    def _check_schedule(self, state: Mapping[str, Any]) -> None:
        """Refuse a state written with another size schedule (or none) than this loader's."""
        mine = self.options.size_schedule
        theirs, ours = state.get(SCHEDULE_KEY), None if mine is None else str(mine)
        if theirs == ours:
            return
        then, now = ("none" if s is None else repr(s) for s in (theirs, ours))
        raise LoaderError(
            f"rank {self.world.rank}: the checkpoint was written with size schedule "
            f"{then}, this loader has {now}: the rest of its epoch would be "
            "made at other sizes; make the loader with the checkpoint's size_schedule "
            "(SizeSchedule.parse), or start a new run")

    def _check_pixels(self, state: Mapping[str, Any]) -> None:
        """Refuse a state whose batches were made with other pixels than this loader's."""
        theirs, mine = state.get(PIXELS_KEY), self.pixels
        if theirs is None or mine is None or theirs == mine:
            return
        raise LoaderError(
            f"rank {self.world.rank}: the checkpoint's batches have pixel version {theirs!r}, "
            f"this loader's are {mine!r} (loaders.decode: 'imgprep-1' is the extension's "
            "decode and resampler, 'pillow' the installed Pillow's, '+augment-N' a version of "
            "the augmentation draws and ops): resume with the checkpoint's (crop_decode=False "
            "for 'pillow'; the extension built for 'imgprep-1'; the same augment, or none), "
            "or start a new epoch with set_epoch")

    def _check_elastic(self, state: Mapping[str, Any]) -> None:
        mode = self.cfg.mode
        if state.get("mode") != mode:
            raise WorldError(f"rank {self.world.rank}: the checkpoint was written in "
                             f"{state.get('mode')} mode, this loader runs {mode}; resume with "
                             "the same mode")
        if mode == "partition" and state.get("num_nodes") != self.world.num_nodes:
            raise WorldError(
                f"rank {self.world.rank}: the checkpoint was written on {state.get('num_nodes')} "
                f"nodes of partitioned data, this job has {self.world.num_nodes}: each node's "
                "data is fixed by staging; resume with the same node count, or start the "
                "next epoch (set_epoch) after restaging")

    # -- iteration
    def __iter__(self) -> Iterator[Batch]:
        """The next pass's batches: ``(images, labels)``, or with ``random_erase`` or
        ``mixup`` set ``(images, labels, draws)`` (``loaders.mixing``)."""
        return self._batches(in_place=False)

    def in_place(self) -> Iterator[Batch]:
        """The next pass's batches as ``iter(loader)`` gives them, handed over without the
        copy out of the workers' shared memory: each batch's images are a view of the slot
        its worker decoded them into, valid only until the next batch is asked for from
        this iterator (or another pass of the loader starts); then the slot goes back to its
        worker, which decodes a later batch into it. Use each batch before asking for the
        next (a normalised or device copy is the batch's own), or ``.clone()`` what must
        outlive it. Never pinned; labels are the batch's own. Every other promise is
        ``iter(loader)``'s: the same batches, ``state_dict``, resume, ``on_error`` and a
        dead worker's error."""
        return self._batches(in_place=True)

    def lock_pages(self) -> bool:
        """Ask for the memory ``in_place`` batches live in (the workers' shared memory) to be
        page-locked for CUDA, so that such a batch copies to a GPU asynchronously straight
        from where it was decoded (``DeviceLoader`` does this). Done as the next pass's first
        batch arrives; ``page_locked`` then says whether CUDA agreed. False where there is no
        such memory (no worker processes; the dali and nvjpeg backends) or no CUDA device."""
        return self._decoder.lock_pages()

    @property
    def page_locked(self) -> bool:
        """Whether ``in_place`` batches are in page-locked memory (``lock_pages``)."""
        return self._decoder.page_locked

    def _batches(self, in_place: bool) -> Iterator[Batch]:
        plan, skip = self.plan(), self._skip
        self._yielded = 0
        try:
            for batch in self._decoder.run(plan, skip, in_place):
                self._yielded += 1
                yield batch
        except (RuntimeError, ConnectionError, EOFError) as e:
            dead = self._decoder.dead(plan, self.describe) if not isinstance(
                e, ImgprepError) else ""
            if not dead:
                raise
            raise LoaderError(f"rank {self.world.rank}: loader {dead} died in epoch "
                              f"{self.epoch} at batch {self._b0 + skip + self._yielded} "
                              f"({e}); rerun to resume from the last checkpoint") from e
        if skip + self._yielded != plan.batches:
            raise LoaderError(f"rank {self.world.rank}: epoch {self.epoch} gave "
                              f"{self._yielded} of {plan.batches - skip} batches; the data "
                              "changed under the loader")
        full = self.plan(self.epoch, 0).batches  # a finished epoch: the next pass starts over
        self._from, self._b0 = (0,) * len(self._sizes), 0
        self._skip, self._yielded = 0, full
