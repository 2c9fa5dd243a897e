"""The shard loader: rank-aware, multiprocess, equal batches, deterministic, elastic resume.

- Planning (``loaders.plan``) is sample-granular and a pure function of (counts, seed,
  epoch, World, start): each epoch a seeded permutation of the pool (the whole set in
  replicate mode, the node's shards in partition mode) is cut into equal steps; a rank's
  batches go to its workers round-robin, so every worker is busy whatever the shard count.
- Workers read samples by offset through the split's sample index (``imgprep.index``), one
  ``pread`` per run of neighbouring samples (``loaders.reader``), and decode them into
  shared-memory slots (``loaders.ring``).
- Augmentation draws come from a generator seeded by (seed, epoch, pool, position of the
  batch in the epoch's order), so resuming yields exactly what an uninterrupted run would
  have, and no skipped batch is read or decoded.
- ``state_dict`` says how many samples of the epoch's order are done, which every World
  understands: a replicate run checkpointed on W ranks resumes on W' ranks, each remaining
  sample seen once. Partition data is fixed by staging: another node count is refused.
- Node-local data (a manifest with a ``node`` section, from stage-to-node or a partitioned
  convert): a partition copy holds one node's share of a layout for a node count, so only
  that node of a job with that node count may load it; a replicate copy holds every shard
  and loads on any node count (an elastic resume on fewer or more nodes).

Workers get the World from the loader, never from environment variables, and read the epoch
and start from shared memory, so they stay alive across epochs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from imgprep.assign import MODES
from imgprep.errors import ImgprepError, ManifestError, WorldError
from imgprep.index import read_index
from imgprep.manifest import Manifest, read_manifest
from imgprep.shardio import iter_members, iter_samples
from imgprep.world import World
from loaders.common import PAD_LABEL, LoaderError, check_policies
from loaders.plan import PAD, EpochPlan, plan_epoch, pools
from loaders.reader import Locations, Raw, Reader
from loaders.ring import Ring, is_dead
from loaders.transforms import SampleError, TrainTransform, Transform, ValTransform, apply

__all__ = ["PAD_LABEL", "EpochPlan", "LoaderError", "ShardLoader", "ShardSet", "iter_members",
           "iter_samples", "open_shards"]


# ---------------------------------------------------------------------------- the shard set


@dataclass(frozen=True, eq=False)
class ShardSet:
    """The whole set's shards (plans are computed from these), which are in ``folder``, and
    where every present sample lies (from the index)."""

    folder: Path
    split: str
    names: tuple[str, ...]
    samples: tuple[int, ...]
    present: frozenset[int]
    mode: str
    seed: int
    num_nodes: int | None
    node_rank: int | None
    mean: tuple[float, ...]
    std: tuple[float, ...]
    num_classes: int
    where: Locations


def _whole_set(folder: Path, split: str, m: Manifest, mode: str | None
               ) -> tuple[tuple[str, ...], tuple[int, ...], str, int, int | None, int | None]:
    node = m.node
    if node is None:
        return (tuple(s.name for s in m.shards), tuple(s.samples for s in m.shards),
                mode or "replicate", -1, None, None)
    names = tuple(n for n, _ in node.all_shards)
    samples = tuple(k for _, k in node.all_shards)
    if mode is not None and mode != node.mode:
        raise WorldError(f"{folder} holds {node.mode} node-local data (node "
                         f"{node.node_rank} of {node.num_nodes}); load it "
                         f"with mode {node.mode!r}, not {mode!r}")
    return names, samples, node.mode, node.seed, node.num_nodes, node.node_rank


def open_shards(folder: Path, split: str, mode: str | None = None, seed: int = 0) -> ShardSet:
    """Read ``folder``'s manifest and sample index: a full conversion, or a node-local one
    from stage-to-node or a partitioned convert (which fixes the mode and seed)."""
    m = read_manifest(folder, split)
    if m.format != "shards":
        raise ManifestError(f"{folder}/{split}.json describes a label list; use the "
                            "label-list loader (loaders.make_loader picks it)")
    names, samples, mode, laid_seed, nodes, node_rank = _whole_set(folder, split, m, mode)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    pos = {n: i for i, n in enumerate(names)}
    for s in m.shards:
        i = pos.get(s.name)
        if i is None or samples[i] != s.samples:
            raise ManifestError(
                f"{folder}/{split}.json: shard {s.name} holds {s.samples} samples, the "
                f"whole set's plan says {samples[i] if i is not None else 'none'}: every "
                "rank must plan from the same counts; reconvert with --max-errors 0 or "
                "stage from the full manifest")
    return ShardSet(folder, split, names, samples, frozenset(pos[s.name] for s in m.shards),
                    mode, laid_seed if laid_seed >= 0 else seed, nodes, node_rank,
                    tuple(m.mean), tuple(m.std), len(m.classes),
                    _locations(folder, m, names, samples))


def _locations(folder: Path, m: Manifest, names: tuple[str, ...], samples: tuple[int, ...]
               ) -> Locations:
    """Every sample's jpg and cls members, in the whole set's numbering (-1 where absent)."""
    ix = read_index(folder, m)
    first = np.concatenate([[0], np.cumsum(np.asarray(samples, np.int64))])
    ix_first = ix.first_sample
    ix_pos = {n: i for i, n in enumerate(ix.names)}
    cols = [np.full(int(first[-1]), -1, np.int64) for _ in range(4)]
    shard_bytes = np.zeros(len(names), np.int64)
    jpg, cls = ix.members("jpg"), ix.members("cls")
    for s in m.shards:
        i, k = names.index(s.name), ix_pos[s.name]
        shard_bytes[i] = s.bytes
        src, dst = slice(ix_first[k], ix_first[k + 1]), slice(first[i], first[i + 1])
        for col, arr in zip(cols, (*jpg, *cls), strict=True):
            col[dst] = arr[src]
    return Locations(folder, names, shard_bytes, first, (cols[0], cols[1]), (cols[2], cols[3]))


def check_world(shards: ShardSet, world: World) -> None:
    """Refuse a World that does not match the node-local data in the folder: a partition
    copy serves only its own node of its node count; a replicate copy holds every shard and
    serves any node of any node count."""
    if shards.num_nodes is None or shards.mode == "replicate":
        return
    if world.num_nodes != shards.num_nodes or world.node_rank != shards.node_rank:
        raise WorldError(
            f"rank {world.rank}: {shards.folder} holds the data of node {shards.node_rank} of "
            f"{shards.num_nodes}, but this rank is on node {world.node_rank} of "
            f"{world.num_nodes}; stage with the job's node count"
        )


def check_present(shards: ShardSet, world: World, plan: EpochPlan) -> None:
    """Refuse a plan that needs shards the folder lacks, before reading anything."""
    need = np.unique(plan.shards_of(plan.table))
    missing = [shards.names[i] for i in need.tolist() if i not in shards.present]
    if missing:
        raise LoaderError(
            f"rank {world.rank}: needs {len(missing)} shards that {shards.folder} does not "
            f"hold (first: {missing[0]}); stage them (imgprep stage-to-node) with this job's "
            "node count and mode")


# ---------------------------------------------------------------------------- the workers


@dataclass(frozen=True, eq=False)
class _Config:
    shards: ShardSet
    world: World
    batch_size: int
    workers: int
    transform: Transform
    tail: str
    shuffle: bool
    on_error: str
    seed: int

    def plan(self, epoch: int, start: int) -> EpochPlan:
        s = self.shards
        return plan_epoch(s.samples, self.world, s.mode, s.seed, epoch, self.batch_size,
                          self.workers, self.tail, self.shuffle, start)


class _EpochStream(IterableDataset):
    """What each DataLoader worker runs: its batches of the rank's plan, as tagged batches
    (decoded into its ring slots; yielded whole when running in the main process)."""

    def __init__(self, cfg: _Config, ring: Ring) -> None:
        self.cfg, self.ring = cfg, ring
        self._plan: EpochPlan | None = None
        self._reader: Reader | None = None

    def _plan_for(self, epoch: int, start: int) -> EpochPlan:
        p = self._plan
        if p is None or (p.epoch, p.start) != (epoch, start):
            p = self._plan = self.cfg.plan(epoch, start)
        return p

    def __iter__(self) -> Iterator[tuple[int, Any, Any]]:
        cfg, ring = self.cfg, self.ring
        info = get_worker_info()
        w = info.id if info is not None else 0
        if self._reader is None:
            self._reader = Reader(cfg.shards.where, cfg.world.rank)
        if ring.data is not None:
            ring.begin(w)
        generation = ring.generation
        plan = self._plan_for(*ring.epoch())
        made = 0
        for b in plan.worker_batches(w):
            ring.note(w, b)
            row = plan.table[b]
            ids = row if cfg.tail == "pad" else row[row != PAD]  # drop: a short last batch
            items = self._reader.read(ids[ids != PAD])
            n = len(ids)
            rng = np.random.default_rng([cfg.seed, plan.epoch, plan.group.pool,
                                         int(plan.first[b])])
            if ring.data is None:
                images = np.empty((n, 3, cfg.transform.size, cfg.transform.size), np.uint8)
                labels = self._decode(items, rng, images, w)
                yield b, torch.from_numpy(images), torch.from_numpy(labels)
                continue
            if not ring.acquire(w, generation):
                return  # the main process started over: this iteration is abandoned
            slot = made % ring.slots
            labels = self._decode(items, rng, ring.slot_array(w, slot, n), w)
            made += 1
            yield b, (generation, w, slot, n), labels.tobytes()  # by value: no fd to pass

    def _decode(self, items: list[Raw], rng: np.random.Generator, images: np.ndarray,
                w: int) -> np.ndarray:
        """Decode and augment ``items`` into ``images`` (n x 3 x size x size); rows past the
        items (``tail="pad"``) are zeroed. Returns the labels, PAD_LABEL for padding."""
        cfg = self.cfg
        images[len(items):] = 0
        labels = np.full(len(images), PAD_LABEL, dtype=np.int64)
        bad: list[int] = []
        for i, (shard, k, jpg, label) in enumerate(items):
            try:
                apply(jpg, cfg.transform, rng, images[i], where=f"{shard}: sample {k}")
                labels[i] = label
            except SampleError as e:
                if cfg.on_error == "raise":
                    raise LoaderError(f"rank {cfg.world.rank}: {e}; verify or restage the "
                                      "shard, or load with on_error='skip'") from e
                bad.append(i)
        if bad:
            self.ring.add_skipped(w, len(bad))
            good = [i for i in range(len(items)) if i not in set(bad)]
            for n, b in enumerate(bad):  # a good sample of the same batch takes the slot
                images[b] = images[good[n % len(good)]] if good else 0
                labels[b] = labels[good[n % len(good)]] if good else PAD_LABEL
        return labels


# ---------------------------------------------------------------------------- the loader


class ShardLoader:
    """Iterate ``(images uint8 NCHW, labels int64)`` batches of one rank over an epoch.

    Args:
        folder: a converted or staged folder holding ``<split>.json`` and its sample index.
        split: ``"train"`` (defaults: shuffle, ``tail="drop"``, train transform) or ``"val"``
            (no shuffle, ``tail="pad"``, center crop).
        world: this rank; every rank of the job computes the same plan from it.
        batch_size, workers: per rank; ``workers=0`` decodes in the calling process.
        seed: the epoch orders' and augmentations' seed.
        mode: ``replicate`` or ``partition`` (node-local manifests fix it).
        tail: ``drop``, ``pad`` (padding slots: label PAD_LABEL, zero pixels) or ``uneven``.
        on_error: ``raise`` on an undecodable sample, or ``skip`` (replace and count it).

    ``len(loader)`` (batches the next pass yields) and ``batches_per_epoch`` are stated
    before the epoch from the manifest; every rank gets the same unless ``tail="uneven"``.
    """

    def __init__(self, folder: Path, split: str, world: World, batch_size: int,
                 workers: int = 4, seed: int = 0, mode: str | None = None,
                 transform: Transform | None = None, tail: str | None = None,
                 shuffle: bool | None = None, on_error: str = "raise",
                 pin_memory: bool | None = None, prefetch_factor: int = 2) -> None:
        train = split == "train"
        self.tail = tail or ("drop" if train else "pad")
        check_policies(batch_size, workers, self.tail, on_error)
        self.shards = open_shards(Path(folder), split, mode, seed)
        check_world(self.shards, world)
        self.world, self.batch_size, self.workers = world, batch_size, workers
        self.cfg = _Config(self.shards, world, batch_size, workers,
                           transform or (TrainTransform() if train else ValTransform()),
                           self.tail, train if shuffle is None else shuffle, on_error, seed)
        self.epoch = self._start = self._batch0 = self._yielded = 0
        self._plans: dict[tuple[int, int], EpochPlan] = {}
        self._pool_max = max(len(p) for p in pools(self.shards.samples, world.num_nodes,
                                                   self.shards.mode, self.shards.seed))
        self.plan(0)  # fail now, not in a worker, if this World cannot be served
        self._pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        # prefetch_factor batches in flight per worker, one being decoded, one spare
        self._ring = Ring(workers, prefetch_factor + 2, batch_size, self.cfg.transform.size)
        self._loader = DataLoader(
            _EpochStream(self.cfg, self._ring), batch_size=None, num_workers=workers,
            persistent_workers=workers > 0, pin_memory=self._pin and workers == 0,
            prefetch_factor=prefetch_factor if workers > 0 else None)

    @property
    def mean(self) -> tuple[float, ...]:
        return self.shards.mean

    @property
    def std(self) -> tuple[float, ...]:
        return self.shards.std

    @property
    def num_classes(self) -> int:
        return self.shards.num_classes

    @property
    def skipped(self) -> int:
        """Samples replaced because they could not be decoded (on_error='skip'), this pass."""
        return self._ring.skipped()

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """The worker processes' pids, as each recorded itself (0: not started)."""
        return tuple(self._ring.pid(w) for w in range(self.workers))

    def plan(self, epoch: int | None = None, start: int | None = None) -> EpochPlan:
        """This rank's plan of ``epoch`` (default: the current one, from where it resumes)."""
        key = (self.epoch if epoch is None else epoch,
               (self._start if epoch is None else 0) if start is None else start)
        if key not in self._plans:
            plan = self.cfg.plan(*key)
            check_present(self.shards, self.world, plan)
            self._plans = {k: v for k, v in self._plans.items() if k[0] == key[0]}
            self._plans[key] = plan
        return self._plans[key]

    @property
    def batches_per_epoch(self) -> int:
        """A whole epoch's batches on this World (unchanged by ``load_state_dict``)."""
        return self.plan(self.epoch, 0).batches

    def set_epoch(self, epoch: int) -> None:
        """Iterate ``epoch`` next, from its first batch."""
        self.epoch, self._start, self._batch0, self._yielded = epoch, 0, 0, 0

    def _shape(self) -> dict[str, Any]:
        w = self.world
        return {"mode": self.shards.mode, "world_size": w.world_size,
                "num_nodes": w.num_nodes, "local_world_size": w.local_world_size,
                "batch_size": self.batch_size}

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands: the epoch, the batches of it yielded on this World, and the
        samples of each pool's order done (what a resume on another World starts from)."""
        done = self.plan().consumed(self._yielded)
        return {"epoch": self.epoch, "batch": self._batch0 + self._yielded,
                "samples": min(done, self._pool_max), **self._shape()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume where ``state`` (from ``state_dict``, on this World or, in replicate mode,
        on another number of ranks or batch size) stands: each remaining sample of the epoch
        once."""
        epoch, batch = int(state["epoch"]), int(state["batch"])
        full = self.plan(epoch, 0)
        if "samples" not in state or all(state.get(k) == v for k, v in self._shape().items()):
            if not 0 <= batch <= full.batches:
                raise ValueError(f"batch {batch} is outside epoch {epoch}")
            start = full.consumed(batch)
        else:
            self._check_elastic(state)
            start = int(state["samples"])
            batch = int(np.searchsorted(full.done, start, side="right"))
            if not 0 <= start <= self._pool_max:
                raise ValueError(f"samples {start} is outside epoch {epoch}")
        self.plan(epoch, start)  # refuse now if this World cannot be served from there
        self.epoch, self._start, self._batch0, self._yielded = epoch, start, batch, 0

    def _check_elastic(self, state: Mapping[str, Any]) -> None:
        mode = self.shards.mode
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

    def __len__(self) -> int:
        return self.plan().batches

    def _dead_workers(self) -> str:
        """'worker 1 (pid 123, making batch 4 from train-000003.tar, …)' for the workers whose
        recorded pids have exited."""
        plan, dead = self.plan(), []
        for w in range(self.workers):
            pid = self._ring.pid(w)
            if is_dead(pid):
                b = self._ring.making(w)
                names = [self.shards.names[i] for i in
                         np.unique(plan.shards_of(plan.table[b:b + 1])).tolist()]
                more = f", … {len(names)} shards" if len(names) > 3 else ""
                dead.append(f"worker {w} (pid {pid}, making batch {b} from "
                            f"{', '.join(names[:3])}{more})")
        return "; ".join(dead)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        plan = self.plan()
        self._ring.set_epoch(self.epoch, self._start)
        generation = self._ring.new_iteration()  # workers of an abandoned iteration stop
        self._yielded = 0
        try:
            for batch in self._ring.in_order(self._loader, generation, self._pin):
                self._yielded += 1
                yield batch
        except (RuntimeError, ConnectionError, EOFError) as e:
            dead = self._dead_workers() if not isinstance(e, ImgprepError) else ""
            if not dead:
                raise
            raise LoaderError(f"rank {self.world.rank}: loader {dead} died in epoch "
                              f"{self.epoch} at batch {self._batch0 + self._yielded} ({e}); "
                              "rerun to resume from the last checkpoint") from e
        if self._yielded != plan.batches:
            raise LoaderError(f"rank {self.world.rank}: epoch {self.epoch} gave "
                              f"{self._yielded} of {plan.batches} batches; the shards changed "
                              "under the loader")
        full = self.plan(self.epoch, 0).batches  # a finished epoch: the next pass starts over
        self._start, self._batch0, self._yielded = 0, 0, full
