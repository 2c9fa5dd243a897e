"""What the shard and label-list loaders share, so that they keep the same promises.

- A loader numbers its samples (a shard set's sample ids; a list's entries, as one "shard")
  and hands this base the sample counts its plans are made from and a ``Source`` that
  fetches samples by number. Plans, tails, resume and the error rule are then one code.
- Plans come from ``loaders.epochs``: equal step counts on every rank (``uneven`` aside),
  stated before the epoch.
- Workers (persistent DataLoader processes) compute their rank's plan themselves from the
  epoch, the plan's starting positions and the batches to skip, which the loader writes into
  the ring's counters (``loaders.ring``), and decode their batches (batch b of the pass: the
  worker of ``(b - skip) % workers``) straight into ring slots.
- Augmentation draws come from a generator seeded by (seed, epoch, pool, the batch's first
  position in the epoch's order): any worker count gives the same batches, and resuming at
  batch k reads and decodes nothing before it.
- ``state_dict`` holds the batches done on this World and, per pool, the positions of the
  epoch's order done (one count when one says it for every pool); a state from another
  World resumes from the positions (elastic; partition data only on its own node count).
- An undecodable sample raises a ``LoaderError`` naming it, or with ``on_error="skip"`` its
  slot takes a good sample of the same batch (a batch of none: padding) and is counted.
- Backends (``loaders.backends``) differ only in decoding: ``pillow`` is this module's
  workers (``WorkerBatches``), ``dali`` is ``loaders.dali``; both make the plan's batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from imgprep.errors import ImgprepError, WorldError
from imgprep.job.world import World
from loaders.backends import backend_class
from loaders.common import PAD_LABEL, LoaderError
from loaders.epochs import PAD, EpochPlan, as_samples, plan_epoch, pool_starts, pools
from loaders.ring import Ring, is_dead
from loaders.transforms import SampleError, Transform, apply

Item = tuple[str, bytes, int]  # where it is (for messages), the encoded image, its label
Batch = tuple[torch.Tensor, torch.Tensor]


class Source(Protocol):
    """What a worker reads samples through (its own open files, made after the fork)."""

    fix: str  # what to do about an undecodable sample, for the error message

    def fetch(self, ids: np.ndarray) -> list[Item]: ...


class Batches(Protocol):
    """How a backend makes a rank's batches: ``run(plan, skip)`` yields the plan's batches
    from ``skip`` on, in order (``loaders.backends`` names the backends)."""

    @property
    def skipped(self) -> int: ...  # samples replaced this pass (on_error="skip")

    @property
    def pids(self) -> tuple[int, ...]: ...  # decoding processes (0: not started)

    def run(self, plan: EpochPlan, skip: int) -> Iterator[Batch]: ...

    def dead(self, plan: EpochPlan, describe: Callable[[EpochPlan, int], str]) -> str: ...


def stand_ins(count: int, bad: list[int]) -> dict[int, int]:
    """on_error="skip": the good sample of the same batch (of ``count``) that takes each bad
    slot, in turn; -1 where the batch has none (the slot becomes padding)."""
    good = sorted(set(range(count)) - set(bad))
    return {b: good[n % len(good)] if good else -1 for n, b in enumerate(bad)}


@dataclass(frozen=True)
class Options:
    """How a backend runs: where batches go, and what it may keep in flight."""

    device: str  # "cpu", or "gpu" (decoded on this rank's GPU: the dali backend)
    pin: bool  # CPU batches in pinned memory (for fast copies to a GPU)
    prefetch_factor: int  # batches made ahead (per worker for the pillow backend)
    pools: int  # pools of the plans (a ring counter each)


@dataclass(frozen=True, eq=False)
class Config:
    """What a loader and its workers both need to compute a rank's batches."""

    samples: tuple[int, ...]  # per shard (a list: one entry, all of its lines)
    world: World
    mode: str
    layout_seed: int  # places shards on nodes and orders each epoch
    seed: int  # augmentation draws
    batch_size: int
    workers: int
    transform: Transform
    tail: str
    shuffle: bool
    on_error: str

    def plan(self, epoch: int, starts: tuple[int, ...]) -> EpochPlan:
        return plan_epoch(self.samples, self.world, self.mode, self.layout_seed, epoch,
                          self.batch_size, self.workers, self.tail, self.shuffle, starts)

    def slots(self, plan: EpochPlan, b: int) -> np.ndarray:
        """Batch ``b``'s slots: sample ids, and PAD for padding (tail="pad"; the others'
        last batches are shorter instead)."""
        row = plan.table[b]
        return row if self.tail == "pad" else row[row != PAD]


class Stream(IterableDataset):
    """What each DataLoader worker runs: its batches of the rank's plan, as tagged batches
    (decoded into its ring slots; yielded whole when running in the main process)."""

    def __init__(self, cfg: Config, ring: Ring, source: Source) -> None:
        self.cfg, self.ring, self.source = cfg, ring, source
        self._plan: EpochPlan | None = None

    def _plan_for(self, epoch: int, starts: tuple[int, ...]) -> EpochPlan:
        p = self._plan
        if p is None or (p.epoch, p.starts) != (epoch, starts):
            p = self._plan = self.cfg.plan(epoch, starts)
        return p

    def __iter__(self) -> Iterator[tuple[int, Any, Any]]:
        cfg, ring = self.cfg, self.ring
        info = get_worker_info()
        w = info.id if info is not None else 0
        if ring.data is not None:
            ring.begin(w)
        generation = ring.generation
        epoch, starts, skip = ring.epoch()
        plan = self._plan_for(epoch, starts)
        made = 0
        for b in range(skip + w, plan.batches, max(1, cfg.workers)):
            ring.note(w, b)
            ids = cfg.slots(plan, b)
            items = self.source.fetch(ids[ids != PAD])
            rng = np.random.default_rng([cfg.seed, plan.epoch, plan.group.pool,
                                         int(plan.first[b])])
            if ring.data is None:
                images = np.empty((len(ids), 3, cfg.transform.size, cfg.transform.size),
                                  np.uint8)
                labels = self._decode(items, rng, images, w)
                yield b, torch.from_numpy(images), torch.from_numpy(labels)
                continue
            if not ring.acquire(w, generation):
                return  # the main process started over: this iteration is abandoned
            slot = made % ring.slots
            labels = self._decode(items, rng, ring.slot_array(w, slot, len(ids)), w)
            made += 1
            yield b, (generation, w, slot, len(ids)), labels.tobytes()  # by value: no fd

    def _decode(self, items: list[Item], rng: np.random.Generator, images: np.ndarray,
                w: int) -> np.ndarray:
        """Decode and augment ``items`` into ``images`` (n x 3 x size x size); rows past the
        items (``tail="pad"``) are zeroed. Returns the labels, PAD_LABEL for padding."""
        cfg = self.cfg
        images[len(items):] = 0
        labels = np.full(len(images), PAD_LABEL, dtype=np.int64)
        bad: list[int] = []
        for i, (where, data, label) in enumerate(items):
            try:
                apply(data, cfg.transform, rng, images[i], where=where)
                labels[i] = label
            except SampleError as e:
                if cfg.on_error == "raise":
                    raise LoaderError(f"rank {cfg.world.rank}: {e}; {self.source.fix}, or "
                                      "load with on_error='skip'") from e
                bad.append(i)
        if bad:
            self.ring.add_skipped(w, len(bad))
            for b, g in stand_ins(len(items), bad).items():  # a good sample takes the slot
                images[b] = images[g] if g >= 0 else 0
                labels[b] = labels[g] if g >= 0 else PAD_LABEL
        return labels


class WorkerBatches:
    """The ``pillow`` backend: persistent DataLoader workers decode their batches (``Stream``)
    into the ring's shared-memory slots; the loader's process copies them out in order."""

    def __init__(self, cfg: Config, source: Source, options: Options) -> None:
        if options.device != "cpu":
            raise ValueError(f"device={options.device!r}: the pillow backend decodes on the "
                             "CPU (DeviceLoader moves its batches); device='gpu' needs "
                             "backend='dali'")
        self.pin, prefetch_factor = options.pin, options.prefetch_factor
        # prefetch_factor batches in flight per worker, one being decoded, one spare
        self.ring = Ring(cfg.workers, prefetch_factor + 2, cfg.batch_size,
                         cfg.transform.size, pools=options.pools)
        self.loader = DataLoader(
            Stream(cfg, self.ring, source), batch_size=None, num_workers=cfg.workers,
            persistent_workers=cfg.workers > 0, pin_memory=self.pin and cfg.workers == 0,
            prefetch_factor=prefetch_factor if cfg.workers > 0 else None)
        self.workers = cfg.workers

    @property
    def skipped(self) -> int:
        return self.ring.skipped()

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(self.ring.pid(w) for w in range(self.workers))

    def run(self, plan: EpochPlan, skip: int) -> Iterator[Batch]:
        self.ring.set_epoch(plan.epoch, plan.starts, skip)
        generation = self.ring.new_iteration()  # workers of an abandoned iteration stop
        return self.ring.in_order(self.loader, generation, self.pin, skip)

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


class PlannedLoader:
    """A rank's loader over planned epochs; ``ShardLoader`` and ``LabelListLoader`` add where
    the samples come from. ``len()`` (batches the next pass yields) and
    ``batches_per_epoch`` are stated before the epoch; every rank gets the same unless
    ``tail="uneven"``."""

    def __init__(self, cfg: Config, source: Source, pin_memory: bool | None,
                 prefetch_factor: int, backend: str = "pillow", device: str = "cpu") -> None:
        make = backend_class(backend)  # an unknown or missing backend fails before anything
        self.cfg, self.world, self.tail = cfg, cfg.world, cfg.tail
        self.batch_size, self.workers = cfg.batch_size, cfg.workers
        self._sizes = tuple(len(p) for p in pools(cfg.samples, cfg.world.num_nodes, cfg.mode,
                                                  cfg.layout_seed))
        self._plans: dict[tuple[int, tuple[int, ...]], EpochPlan] = {}
        self.set_epoch(0)
        self.plan(0)  # fail now, not in a worker, if this World cannot be served
        pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.backend = backend
        self._batches: Batches = make(cfg, source, Options(device, pin, prefetch_factor,
                                                           len(self._sizes)))

    # -- what a subclass says about its data
    def check_plan(self, plan: EpochPlan) -> None:
        """Refuse a plan this loader's data cannot serve (before reading anything)."""

    def describe(self, plan: EpochPlan, batch: int) -> str:
        """What batch ``batch`` of ``plan`` reads, for a dead worker's message."""
        return ""

    # -- plans and epochs
    @property
    def skipped(self) -> int:
        """Samples replaced because they could not be decoded (on_error='skip'), this pass."""
        return self._batches.skipped

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """The worker processes' pids, as each recorded itself (0: not started; none for a
        backend that decodes in threads)."""
        return self._batches.pids

    def plan(self, epoch: int | None = None, start: int | tuple[int, ...] | None = None
             ) -> EpochPlan:
        """This rank's plan of ``epoch`` from ``start`` (per pool, or one count for all);
        by default the current epoch's plan that the next pass continues."""
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
    def batches_per_epoch(self) -> int:
        """A whole epoch's batches on this World (unchanged by ``load_state_dict``)."""
        return self.plan(self.epoch, 0).batches

    def __len__(self) -> int:
        return self.plan().batches - self._skip

    def set_epoch(self, epoch: int) -> None:
        """Iterate ``epoch`` next, from its first batch."""
        self.epoch, self._from = epoch, (0,) * len(self._sizes)
        self._batch0 = self._skip = self._yielded = 0

    # -- resume
    def _shape(self) -> dict[str, Any]:
        w = self.world
        return {"mode": self.cfg.mode, "world_size": w.world_size, "num_nodes": w.num_nodes,
                "local_world_size": w.local_world_size, "batch_size": self.batch_size}

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands: the epoch, its batches done on this World (of the plan
        that began at ``from``: 0, or where a resume from another World began), and the
        positions of each pool's order done, which any World resumes from."""
        done = self.plan().position(self._skip + self._yielded)
        return {"epoch": self.epoch, "batch": self._batch0 + self._skip + self._yielded,
                "samples": as_samples(done, self._sizes),
                "from": as_samples(self._from, self._sizes), **self._shape()}

    def _batch_at(self, epoch: int, starts: tuple[int, ...]) -> int:
        """The batch of this World's whole epoch that a plan from ``starts`` begins at (the
        whole batches already done there)."""
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
        epoch, batch = int(state["epoch"]), int(state["batch"])
        if "samples" not in state or all(state.get(k) == v for k, v in self._shape().items()):
            starts = self._starts(state, "from", epoch)
            batch0 = self._batch_at(epoch, starts)
            if not 0 <= batch - batch0 <= self.plan(epoch, starts).batches:
                raise ValueError(f"batch {batch} is outside epoch {epoch}")
        else:
            self._check_elastic(state)
            starts = self._starts(state, "samples", epoch)
            batch0 = batch = self._batch_at(epoch, starts)
            self.plan(epoch, starts)  # refuse now if this World cannot be served from there
        self.epoch, self._from, self._batch0 = epoch, starts, batch0
        self._skip, self._yielded = batch - batch0, 0

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
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        plan, skip = self.plan(), self._skip
        self._yielded = 0
        try:
            for batch in self._batches.run(plan, skip):
                self._yielded += 1
                yield batch
        except (RuntimeError, ConnectionError, EOFError) as e:
            dead = self._batches.dead(plan, self.describe) if not isinstance(
                e, ImgprepError) else ""
            if not dead:
                raise
            raise LoaderError(f"rank {self.world.rank}: loader {dead} died in epoch "
                              f"{self.epoch} at batch {self._batch0 + skip + self._yielded} "
                              f"({e}); rerun to resume from the last checkpoint") from e
        if skip + self._yielded != plan.batches:
            raise LoaderError(f"rank {self.world.rank}: epoch {self.epoch} gave "
                              f"{self._yielded} of {plan.batches - skip} batches; the data "
                              "changed under the loader")
        full = self.plan(self.epoch, 0).batches  # a finished epoch: the next pass starts over
        self._from, self._batch0 = (0,) * len(self._sizes), 0
        self._skip, self._yielded = 0, full
