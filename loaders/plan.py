"""Sample-granular epoch plans: a pure function of (counts, seed, epoch, World, start).

- A *pool* is the samples a group of ranks shares: the whole set in replicate mode (the
  group is every rank), a node's shards in partition mode (the group is the node's ranks).
- Epoch e's order is a seeded permutation of the pool (identity without shuffle). It does not
  depend on the World, so a checkpoint can say "the first k samples of the order are done"
  in words any World understands: that is what makes resume elastic.
- Step s of a group of g ranks consumes positions ``start + s*g*B ...`` of the order; rank
  slot r takes the ``B`` positions from ``start + s*g*B + r*B``. Every rank has the same
  number of steps (``drop``: full steps, then one short step of the same size on every rank,
  so fewer than 2 samples per rank are lost beyond what cross-pool equality needs; ``pad``:
  the last steps are filled with -1, labelled padding; ``uneven``: exact, per-rank counts
  differ).
- A rank's batches go to its workers round-robin (batch b to worker ``b % workers``), so
  worker batch counts differ by at most one and every worker is busy whenever the rank has
  at least ``workers`` batches, whatever the number of shards.

Everything is vectorised numpy: a 1.28M-sample epoch is planned in tens of milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from imgprep.assign import node_shards
from imgprep.world import World
from loaders.common import TAILS

PAD = -1  # a padding slot in a plan's sample table


@dataclass(frozen=True)
class Group:
    """Which pool a rank draws from, how many ranks share it, and the rank's slot in it."""

    pool: int
    size: int
    slot: int


def group_of(world: World, mode: str) -> Group:
    if mode == "replicate":
        return Group(0, world.world_size, world.rank)
    return Group(world.node_rank, world.local_world_size, world.local_rank)


def pools(samples: Sequence[int], num_nodes: int, mode: str, seed: int) -> list[np.ndarray]:
    """The sample ids (shard order) of each pool: one for replicate, one per node for
    partition (the node's shards, as ``imgprep.assign.node_shards`` places them)."""
    first = np.concatenate([[0], np.cumsum(np.asarray(samples, np.int64))])
    if mode == "replicate":
        return [np.arange(first[-1], dtype=np.int64)]
    out = []
    for held in node_shards(samples, num_nodes, mode, seed):
        parts = [np.arange(first[i], first[i + 1], dtype=np.int64) for i in held]
        out.append(np.concatenate(parts) if parts else np.zeros(0, np.int64))
    return out


def pool_order(ids: np.ndarray, seed: int, epoch: int, pool: int, shuffle: bool) -> np.ndarray:
    """Epoch ``epoch``'s order of a pool's samples (a seeded permutation when shuffling)."""
    if not shuffle:
        return ids
    return ids[np.random.default_rng([seed, epoch, 0x5A3, pool]).permutation(len(ids))]


MIN_SHORT = 2  # a last short step needs this many samples per rank (1 breaks batch norm)


def steps(remaining: Sequence[int], group: int, batch: int, tail: str) -> tuple[int, int]:
    """(full steps, per-rank size of one last short step or 0) that every rank takes when
    each pool has ``remaining`` samples left. drop: full steps, then the largest equal short
    step every pool can fill (so < 1 sample per rank is lost beyond cross-pool equality, or
    < 2 when a short step of one is skipped); pad and uneven: enough steps for every sample."""
    if tail not in TAILS:
        raise ValueError(f"tail must be one of {TAILS}")
    g = group * batch
    rem = [max(0, int(r)) for r in remaining]
    if tail != "drop":
        return max(-(-r // g) for r in rem), 0
    n = min(r // g for r in rem)
    short = min((r - n * g) // group for r in rem)
    return n, (short if short >= MIN_SHORT else 0)


@dataclass(frozen=True, eq=False)
class EpochPlan:
    """One rank's epoch from ``start`` on: its batches (rows of ``table``, global sample ids,
    ``PAD`` for padding or past a short batch's end) and which worker makes each (batch b:
    worker ``b % workers``)."""

    epoch: int
    start: int  # samples of the pool's order consumed before this plan
    group: Group
    batch_size: int
    workers: int
    table: np.ndarray  # (batches, batch_size) int64
    first: np.ndarray  # per batch: the order position of its first slot (seeds its RNG)
    done: np.ndarray  # per batch: samples of the pool's order consumed once it is done
    shard_first: np.ndarray  # first sample id of each shard (+ total)

    @property
    def batches(self) -> int:
        return len(self.table)

    def consumed(self, batches: int) -> int:
        """Samples of the pool's order done after this plan's first ``batches`` batches."""
        return int(self.done[batches - 1]) if batches > 0 else self.start

    def worker_of(self, b: int) -> int:
        return b % self.workers

    def worker_batches(self, w: int) -> range:
        return range(w, self.batches, self.workers)

    @property
    def order(self) -> tuple[tuple[int, int], ...]:
        """Batch b = (worker, that worker's batch number)."""
        return tuple((b % self.workers, b // self.workers) for b in range(self.batches))

    @property
    def worker_samples(self) -> tuple[int, ...]:
        """Real samples each worker decodes."""
        real = (self.table != PAD).sum(axis=1)
        return tuple(int(real[w::self.workers].sum()) for w in range(self.workers))

    def shards_of(self, rows: np.ndarray) -> np.ndarray:
        """The shard index of each (non-padding) sample id in ``rows``."""
        ids = rows[rows != PAD]
        return np.searchsorted(self.shard_first, ids, side="right") - 1

    @property
    def worker_shards(self) -> tuple[tuple[int, ...], ...]:
        """The shards each worker reads from (ascending)."""
        return tuple(tuple(np.unique(self.shards_of(self.table[w::self.workers])).tolist())
                     for w in range(self.workers))


def plan_epoch(samples: Sequence[int], world: World, mode: str, seed: int, epoch: int,
               batch_size: int, workers: int, tail: str, shuffle: bool = True,
               start: int = 0) -> EpochPlan:
    """This rank's plan for ``epoch`` once ``start`` samples of each pool's order are done
    (0: the whole epoch). Every rank computes the same step count from the counts alone."""
    group = group_of(world, mode)
    every = pools(samples, world.num_nodes, mode, seed)
    n, short = steps([len(p) - start for p in every], group.size, batch_size, tail)
    ids = pool_order(every[group.pool], seed, epoch, group.pool, shuffle)
    widths = np.full(n + (short > 0), batch_size, np.int64)
    if short:
        widths[-1] = short
    done = start + group.size * np.cumsum(widths)
    first = done - group.size * widths + group.slot * widths
    col = np.arange(batch_size, dtype=np.int64)[None, :]
    pos = first[:, None] + col
    real = (col < widths[:, None]) & (pos < len(ids))
    table = np.where(real, ids[np.clip(pos, 0, max(0, len(ids) - 1))] if len(ids) else PAD,
                     PAD)
    if tail == "uneven":  # only batches with a real sample
        keep = real.any(axis=1)
        table, first, done = table[keep], first[keep], done[keep]
    shard_first = np.concatenate([[0], np.cumsum(np.asarray(samples, np.int64))])
    return EpochPlan(epoch, start, group, batch_size, max(1, workers), table, first,
                     done, shard_first)


def job_summary(samples: Sequence[int], nodes: int, local: int, workers: int, batch: int,
                mode: str = "replicate", tail: str = "drop", seed: int = 0) -> dict[str, float]:
    """What an epoch of a job gives, from the counts alone (every rank alike): steps, the
    share of the set seen, busy workers per rank and the spread of worker sample counts."""
    world = World(0, nodes * local, 0, local, 0, nodes)
    group = group_of(world, mode)
    sizes = [len(p) for p in pools(samples, nodes, mode, seed)]
    n, short = steps(sizes, group.size, batch, tail)
    widths = [batch] * n + ([short] if short else [])
    take = group.size * sum(widths)
    real = sum(min(size, take) for size in sizes) if tail == "drop" else sum(sizes)
    per_worker = [sum(widths[k::workers]) for k in range(workers)]
    return {"ranks": nodes * local, "steps": len(widths), "seen": real / sum(samples),
            "busy_workers": sum(1 for c in per_worker if c), "workers": workers,
            "worker_spread": max(per_worker) - min(per_worker)}
