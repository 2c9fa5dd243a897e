"""The shard loader: rank-aware, multiprocess, equal batches, deterministic and resumable.

Planning is a pure function of (manifest, World, seed, epoch, batch size, workers, tail):
- ``imgprep.assign`` gives each rank its shards for the epoch (replicate: reshuffled over all
  ranks; partition: over the node's local ranks), then each rank's shards are split over its
  DataLoader workers, balanced by samples;
- every worker yields a fixed quota of batches, and the rank's batches are the workers'
  batches in round-robin order. Quotas are set so that every rank yields the same number of
  batches (``tail="drop"``: the smallest number of full batches any rank can make, stated
  before the epoch from the manifest alone), or so that every sample is seen once
  (``"pad"``: equal counts, missing slots labelled ``PAD_LABEL``; ``"uneven"``: per-rank
  counts differ);
- a worker reads its shards in order through a seeded shuffle buffer; augmentation draws
  come from a generator seeded by (seed, epoch, rank, worker, batch), so resuming at batch k
  skips the earlier batches without decoding them and yields exactly what an uninterrupted
  run would have.

Workers get the World from the loader, never from environment variables, and read the epoch
and start position from shared memory, so they can stay alive across epochs.
"""

from __future__ import annotations

import multiprocessing as mp
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from imgprep.assign import MODES, all_rank_shards, balanced_split
from imgprep.errors import ImgprepError, ManifestError, WorldError
from imgprep.manifest import read_manifest
from imgprep.shardio import iter_members, iter_samples
from imgprep.world import World
from loaders.transforms import SampleError, TrainTransform, Transform, ValTransform, apply

__all__ = ["PAD_LABEL", "EpochPlan", "LoaderError", "ShardLoader", "ShardSet", "iter_members",
           "iter_samples", "open_shards", "plan_epoch"]

TAILS = ("drop", "pad", "uneven")
PAD_LABEL = -1
ON_ERROR = ("raise", "skip")


class LoaderError(ImgprepError, RuntimeError):
    """The loader cannot go on; the message names the rank, shard and key concerned."""


# ---------------------------------------------------------------------------- the shard set


@dataclass(frozen=True)
class ShardSet:
    """The whole set's shards (the plan is computed from these) and which are in ``folder``."""

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


def open_shards(folder: Path, split: str, mode: str | None = None, seed: int = 0) -> ShardSet:
    """Read ``folder``'s manifest: a full one, or a node-local one from stage-to-node or a
    partitioned convert (which fixes the mode and seed the node's data was laid out with)."""
    m = read_manifest(folder, split)
    if m.format != "shards":
        raise ManifestError(f"{folder}/{split}.json describes a label list; use the "
                            "label-list loader (loaders.make_loader picks it)")
    node = m.node
    if node is not None:
        names = tuple(n for n, _ in node.all_shards)
        samples = tuple(s for _, s in node.all_shards)
        laid_out = node.mode
        if mode is not None and mode != laid_out:
            raise WorldError(f"{folder} holds {laid_out} node-local data (node "
                             f"{node.node_rank} of {node.num_nodes}); load it "
                             f"with mode {laid_out!r}, not {mode!r}")
        mode, seed = laid_out, node.seed
        index = {n: i for i, n in enumerate(names)}
        present = set()
        for s in m.shards:
            i = index.get(s.name)
            if i is None or samples[i] != s.samples:
                raise ManifestError(
                    f"{folder}/{split}.json: shard {s.name} holds {s.samples} samples, the "
                    f"whole set's plan says {samples[i] if i is not None else 'none'}: every "
                    "rank must plan from the same counts; reconvert with --max-errors 0 or "
                    "stage from the full manifest")
            present.add(i)
        nodes: int | None = node.num_nodes
        node_rank: int | None = node.node_rank
    else:
        names = tuple(s.name for s in m.shards)
        samples = tuple(s.samples for s in m.shards)
        present = set(range(len(names)))
        nodes = node_rank = None
        mode = mode or "replicate"
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    return ShardSet(folder, split, names, samples, frozenset(present), mode, seed, nodes,
                    node_rank, tuple(m.mean), tuple(m.std), len(m.classes))


def check_world(shards: ShardSet, world: World) -> None:
    """Refuse a World that does not match the node-local data in the folder."""
    if shards.num_nodes is None:
        return
    if world.num_nodes != shards.num_nodes or world.node_rank != shards.node_rank:
        raise WorldError(
            f"rank {world.rank}: {shards.folder} holds the data of node {shards.node_rank} of "
            f"{shards.num_nodes}, but this rank is on node {world.node_rank} of "
            f"{world.num_nodes}; stage with the job's node count"
        )


# ---------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class EpochPlan:
    """One rank's epoch: its workers' shards and batch quotas, and the batch order."""

    epoch: int
    batches: int
    worker_shards: tuple[tuple[int, ...], ...]
    worker_samples: tuple[int, ...]
    worker_quota: tuple[int, ...]
    order: tuple[tuple[int, int], ...]  # global batch i = (worker, that worker's batch j)

    def skip(self, worker: int, start: int) -> int:
        """How many of ``worker``'s batches come before global batch ``start``."""
        return sum(1 for w, _ in self.order[:start] if w == worker)


def _worker_split(samples: Sequence[int], shards: list[int], workers: int
                  ) -> tuple[list[list[int]], list[int]]:
    groups = balanced_split(samples, workers, shards)
    return groups, [sum(samples[i] for i in g) for g in groups]


def _counts(totals: list[int], batch: int, tail: str) -> list[int]:
    if tail == "drop":
        return [s // batch for s in totals]
    return [-(-s // batch) for s in totals]


def plan_epoch(shards: ShardSet, world: World, epoch: int, batch_size: int, workers: int,
               tail: str) -> EpochPlan:
    """This rank's plan for ``epoch`` (the same computation on every rank agrees on counts)."""
    if tail not in TAILS:
        raise ValueError(f"tail must be one of {TAILS}")
    w_count = max(1, workers)
    every = all_rank_shards(shards.samples, world, shards.mode, shards.seed, epoch)
    per_rank = [_worker_split(shards.samples, s, w_count) for s in every]
    groups, totals = per_rank[world.rank]
    missing = [shards.names[i] for i in every[world.rank] if i not in shards.present]
    if missing:
        raise LoaderError(
            f"rank {world.rank}: needs {len(missing)} shards that {shards.folder} does not "
            f"hold (first: {missing[0]}); stage them (imgprep stage-to-node) with this job's "
            "node count and mode"
        )
    quota = _counts(totals, batch_size, tail)
    if tail == "drop":
        target = min(sum(_counts(t, batch_size, tail)) for _, t in per_rank)
        while sum(quota) > target:  # take from the largest quotas, lowest worker first
            quota[int(np.argmax(quota))] -= 1
    elif tail == "pad":
        target = max(sum(_counts(t, batch_size, tail)) for _, t in per_rank)
        for k in range(target - sum(quota)):  # padding-only batches, spread over workers
            quota[k % w_count] += 1
    order: list[tuple[int, int]] = []
    made = [0] * w_count
    while len(order) < sum(quota):
        for w in range(w_count):
            if made[w] < quota[w]:
                order.append((w, made[w]))
                made[w] += 1
    return EpochPlan(epoch, len(order), tuple(tuple(g) for g in groups), tuple(totals),
                     tuple(quota), tuple(order))


# ---------------------------------------------------------------------------- the workers


@dataclass(frozen=True)
class _Config:
    shards: ShardSet
    world: World
    batch_size: int
    workers: int
    transform: Transform
    tail: str
    shuffle_buffer: int
    on_error: str
    seed: int


Raw = tuple[str, str, bytes, int]  # shard name, key, jpeg bytes, label


# Shared state, one int64 each: the epoch, its start batch and the iteration's generation,
# then per worker two: the batches the main process has taken out of its ring, and the samples
# the worker skipped. Each slot has one writer, so a worker never takes a lock (one killed
# while holding it would stall the main process).
_EPOCH, _START, _GENERATION, _HEAD = range(4)


def _taken(w: int) -> int:
    return _HEAD + 2 * w


def _skipped(w: int) -> int:
    return _HEAD + 2 * w + 1
_RING_POLL_S = 0.0005


def _rank_errors(samples: Iterator[tuple[str, dict[str, bytes]]], rank: int
                 ) -> Iterator[tuple[str, dict[str, bytes]]]:
    """A damaged or hostile shard's error, as a LoaderError that also names the rank."""
    try:
        yield from samples
    except ImgprepError as e:
        raise LoaderError(f"rank {rank}: {e}") from e


class _EpochStream(IterableDataset):
    """What each DataLoader worker runs: its share of the rank's epoch, as tagged batches.

    With worker processes, batches are decoded straight into the worker's ring of shared
    memory slots (made once, before the workers start) and only a small message travels:
    PyTorch's default would move every batch into a fresh shared-memory segment, a copy and
    thousands of page faults per batch. A slot is reused once the main process has copied it
    out; a worker waiting for a slot gives up when the main process starts a new iteration.
    """

    def __init__(self, cfg: _Config, state: Any, ring: torch.Tensor | None) -> None:
        self.cfg = cfg
        self.state = state
        self.ring = ring  # (workers, slots, batch, 3, size, size) uint8, shared; None in-process

    def _raw(self, shard_ids: Sequence[int]) -> Iterator[Raw]:
        cfg = self.cfg
        for i in shard_ids:
            name = cfg.shards.names[i]
            count = 0
            for key, fields in _rank_errors(iter_samples(cfg.shards.folder / name),
                                            cfg.world.rank):
                if "jpg" not in fields or "cls" not in fields:
                    raise LoaderError(f"{name}: sample {key} has {sorted(fields)}, needs jpg "
                                      "and cls; verify or restage the shard")
                try:
                    label = int(fields["cls"])
                except ValueError:
                    raise LoaderError(f"{name}: sample {key} has label {fields['cls']!r}; "
                                      "verify or restage the shard") from None
                count += 1
                yield name, key, fields["jpg"], label
            if count != cfg.shards.samples[i]:
                raise LoaderError(f"{name} holds {count} samples, the manifest says "
                                  f"{cfg.shards.samples[i]}; verify or restage it")

    def _shuffled(self, raw: Iterator[Raw], rng: np.random.Generator) -> Iterator[Raw]:
        size = self.cfg.shuffle_buffer
        if size <= 1:
            yield from raw
            return
        buf: list[Raw] = []
        for item in raw:
            if len(buf) < size:
                buf.append(item)
                continue
            k = int(rng.integers(len(buf)))
            yield buf[k]
            buf[k] = item
        for k in rng.permutation(len(buf)).tolist():
            yield buf[k]

    def __iter__(self) -> Iterator[tuple[int, Any, Any]]:
        cfg = self.cfg
        info = get_worker_info()
        w = info.id if info is not None else 0
        epoch, start = int(self.state[0]), int(self.state[1])
        plan = plan_epoch(cfg.shards, cfg.world, epoch, cfg.batch_size, cfg.workers, cfg.tail)
        mine = [g for g, (ww, _) in enumerate(plan.order) if ww == w]
        skip = plan.skip(w, start)
        key = (cfg.seed, epoch, cfg.world.rank, w)
        stream = self._shuffled(self._raw(plan.worker_shards[w]),
                                np.random.default_rng([*key, 0xB0F]))
        generation = int(self.state[_GENERATION])
        made = 0
        for j, g in enumerate(mine):
            items = [x for _, x in zip(range(cfg.batch_size), stream, strict=False)]
            if cfg.tail == "drop" and len(items) < cfg.batch_size:
                raise LoaderError(f"rank {cfg.world.rank} worker {w}: shards ran out before "
                                  f"batch {g} of epoch {epoch}; verify the shards")
            if j < skip:
                continue  # resuming: read past, never decode
            n = cfg.batch_size if cfg.tail == "pad" else len(items)
            rng = np.random.default_rng([*key, j])
            if self.ring is None:
                images = np.empty((n, 3, cfg.transform.size, cfg.transform.size), np.uint8)
                labels = self._decode(items, rng, images, w)
                yield g, torch.from_numpy(images), torch.from_numpy(labels)
                continue
            slots = self.ring.shape[1]
            while made - int(self.state[_taken(w)]) >= slots:  # every slot still in use
                if int(self.state[_GENERATION]) != generation:
                    return  # the main process started over: this iteration is abandoned
                time.sleep(_RING_POLL_S)
            slot = made % slots
            labels = self._decode(items, rng, self.ring[w, slot, :n].numpy(), w)
            made += 1
            yield g, (generation, w, slot, n), labels.tobytes()  # by value: no fd to pass
        for _ in stream:  # read what is left, undecoded, so that every shard's count is checked
            pass

    def _decode(self, items: list[Raw], rng: np.random.Generator, images: np.ndarray,
                w: int) -> np.ndarray:
        """Decode and augment ``items`` into ``images`` (n x 3 x size x size); rows past the
        items (``tail="pad"``) are zeroed. Returns the labels, PAD_LABEL for padding."""
        cfg = self.cfg
        n = len(images)
        images[len(items):] = 0
        labels = np.full(n, PAD_LABEL, dtype=np.int64)
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
            self.state[_skipped(w)] += len(bad)
            self._replace_bad(images, labels, bad, len(items))
        return labels

    def _replace_bad(self, images: np.ndarray, labels: np.ndarray, bad: list[int],
                     n: int) -> None:
        """on_error='skip': a bad sample's slot takes a good sample of the same batch (so
        batch counts stay equal) and is counted; a batch with none good is padding."""
        good = [i for i in range(n) if i not in set(bad)]
        for k, i in enumerate(bad):
            if good:
                images[i] = images[good[k % len(good)]]
                labels[i] = labels[good[k % len(good)]]
            else:
                images[i] = 0
                labels[i] = PAD_LABEL


# ---------------------------------------------------------------------------- the loader


class ShardLoader:
    """Iterate ``(images uint8 NCHW, labels int64)`` batches of one rank over an epoch.

    ``len(loader)`` is stated before the epoch, from the manifest; every rank gets the same
    (unless ``tail="uneven"``). ``set_epoch`` picks the epoch; ``load_state_dict`` resumes
    mid-epoch; ``state_dict`` says where iteration stands.
    """

    def __init__(self, folder: Path, split: str, world: World, batch_size: int,
                 workers: int = 4, seed: int = 0, mode: str | None = None,
                 transform: Transform | None = None, tail: str | None = None,
                 shuffle_buffer: int | None = None, on_error: str = "raise",
                 pin_memory: bool | None = None, prefetch_factor: int = 2) -> None:
        if batch_size < 1 or workers < 0:
            raise ValueError("batch_size must be >= 1 and workers >= 0")
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}")
        train = split == "train"
        self.shards = open_shards(Path(folder), split, mode, seed)
        check_world(self.shards, world)
        self.world, self.batch_size, self.workers = world, batch_size, workers
        self.tail = tail or ("drop" if train else "pad")
        self.cfg = _Config(
            self.shards, world, batch_size, workers,
            transform or (TrainTransform() if train else ValTransform()), self.tail,
            (1000 if train else 0) if shuffle_buffer is None else shuffle_buffer, on_error,
            seed)
        self.epoch, self._start, self._position = 0, 0, 0
        self._state = mp.Array("q", [0] * _taken(max(1, workers)), lock=False)
        self._plans: dict[int, EpochPlan] = {}
        self.plan(0)  # fail now, not in a worker, if this World cannot be served
        self._pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        size = self.cfg.transform.size
        # prefetch_factor batches in flight per worker, one being decoded, one spare
        self._ring = torch.empty((workers, prefetch_factor + 2, batch_size, 3, size, size),
                                 dtype=torch.uint8).share_memory_() if workers > 0 else None
        self._loader = DataLoader(
            _EpochStream(self.cfg, self._state, self._ring), batch_size=None,
            num_workers=workers, persistent_workers=workers > 0,
            pin_memory=self._pin and workers == 0,
            prefetch_factor=prefetch_factor if workers > 0 else None)

    @property
    def mean(self) -> tuple[float, ...]:
        return self.shards.mean

    @property
    def std(self) -> tuple[float, ...]:
        return self.shards.std

    @property
    def skipped(self) -> int:
        """Samples replaced because they could not be decoded (on_error='skip'), this epoch."""
        return sum(int(self._state[_skipped(w)]) for w in range(max(1, self.workers)))

    def plan(self, epoch: int | None = None) -> EpochPlan:
        e = self.epoch if epoch is None else epoch
        if e not in self._plans:
            self._plans = {e: plan_epoch(self.shards, self.world, e, self.batch_size,
                                         self.workers, self.tail)}
        return self._plans[e]

    def set_epoch(self, epoch: int) -> None:
        """Iterate ``epoch`` next, from its first batch."""
        self.epoch, self._start, self._position = epoch, 0, 0

    def state_dict(self) -> dict[str, int]:
        """Where iteration stands: the epoch and the batches of it already yielded."""
        return {"epoch": self.epoch, "batch": self._position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume: the next iteration yields batch ``state["batch"]`` of ``state["epoch"]`` on."""
        epoch, start = int(state["epoch"]), int(state["batch"])
        if not 0 <= start <= self.plan(epoch).batches:
            raise ValueError(f"batch {start} is outside epoch {epoch}")
        self.epoch, self._start, self._position = epoch, start, start

    def __len__(self) -> int:
        return self.plan().batches - self._start

    def _dead_workers(self, message: str) -> str:
        """'worker 1 (reading train-000003.tar, …)' for the pids PyTorch's error names."""
        pids = {int(p) for p in re.findall(r"\d{2,}", message.split("pid", 1)[-1])}
        procs = getattr(getattr(self._loader, "_iterator", None), "_workers", None) or []
        plan = self.plan()
        dead = []
        for i, proc in enumerate(procs):
            if proc.pid in pids and i < len(plan.worker_shards):
                names = ", ".join(self.shards.names[k] for k in plan.worker_shards[i])
                dead.append(f"worker {i} (reading {names})")
        return "; ".join(dead) or "a worker"

    def _exited_workers(self) -> str:
        """The same naming as ``_dead_workers``, for workers found to have exited."""
        procs = getattr(getattr(self._loader, "_iterator", None), "_workers", None) or []
        pids = " ".join(str(p.pid) for p in procs if p.exitcode is not None)
        return self._dead_workers("pid " + pids)

    def _take(self, where: tuple[int, int, int, int], generation: int) -> torch.Tensor | None:
        """Copy a batch out of its worker's ring slot and free the slot (None: stale)."""
        gen, w, slot, n = (int(x) for x in where)
        if gen != generation or self._ring is None:
            return None
        out = torch.empty((n, *self._ring.shape[3:]), dtype=torch.uint8, pin_memory=self._pin)
        np.copyto(out.numpy(), self._ring[w, slot, :n].numpy())  # one memcpy, no OpenMP
        self._state[_taken(w)] += 1
        return out

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        plan = self.plan()
        self._state[_EPOCH], self._state[_START] = self.epoch, self._start
        for w in range(max(1, self.workers)):
            self._state[_taken(w)] = self._state[_skipped(w)] = 0
        generation = int(self._state[_GENERATION]) + 1
        self._state[_GENERATION] = generation  # workers of an abandoned iteration stop
        expected = self._position = self._start
        pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        try:
            for g, images, labels in self._loader:
                if not isinstance(images, torch.Tensor):
                    images = self._take(images, generation)
                    if images is None:
                        continue
                    labels = torch.frombuffer(bytearray(labels), dtype=torch.int64)
                pending[int(g)] = (images, labels)
                while expected in pending:
                    batch = pending.pop(expected)
                    expected += 1
                    self._position = expected
                    yield batch
        except (ConnectionError, EOFError) as e:
            # a worker killed while handing over a batch: say which, like PyTorch's check does
            raise LoaderError(f"rank {self.world.rank}: loader {self._exited_workers()} died in "
                              f"epoch {self.epoch} at batch {expected} ({e!r}); rerun to resume "
                              "from the last checkpoint") from e
        except RuntimeError as e:
            if isinstance(e, ImgprepError) or "DataLoader worker" not in str(e):
                raise
            raise LoaderError(f"rank {self.world.rank}: loader {self._dead_workers(str(e))} "
                              f"died in epoch {self.epoch} at batch {expected} ({e}); rerun "
                              "to resume from the last checkpoint") from e
        if expected != plan.batches:
            raise LoaderError(f"rank {self.world.rank}: epoch {self.epoch} gave {expected} of "
                              f"{plan.batches} batches; the shards changed under the loader")
        self._start = 0
