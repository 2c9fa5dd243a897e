"""Sample-granular epoch plans: a pure function of (counts, seed, epoch, World, start).

Both loaders plan here: the shard loader over its shards' sample counts, the label-list
loader over its list (one "shard" of all its entries), so their tails are one implementation.

- A *pool* is the samples a group of ranks shares: the whole set in replicate mode (the
  group is every rank), a node's shards in partition mode (the group is the node's ranks).
- A pool is held as its shard ranges (``Pool``: O(shards) memory), order positions mapped to
  sample ids through cumulative counts; nothing a rank computes is pool-sized.
- Epoch e's order is a seeded permutation of the pool (identity without shuffle), of a
  versioned kind (``loaders.order``: version 2 is evaluated at this rank's positions only).
  It does not depend on the World, so a checkpoint can say "the first k samples of the
  order are done" in words any World understands: that is what makes resume elastic.
- Every rank takes the same number of steps; in a step, the g ranks of a group take
  consecutive runs of the pool's order, rank slot r the r-th run (``Cut``). With repeated
  augmentation (``loaders.repeats``: ``repeats`` k > 1) the order is the epoch's repeated
  order and a step's positions go to the slots strided (slot r: the step's r-th, r+g-th, ...
  position, as many as its run is long), so that a sample's consecutive copies go to
  different ranks. The tail decides the runs:

  ``drop``   every run is ``batch_size`` long: full steps only, one batch shape for the
             epoch (as PyTorch's ``drop_last``); fewer than g x batch_size samples of a pool
             are left out (plus what equal step counts across pools need), different ones
             each epoch.
  ``short``  every sample once: full steps, then the rest spread evenly over the last
             step's runs (lengths differ by at most one), or over the fewest last steps
             that give every run at least ``MIN_SHORT`` samples.
  ``pad``    every sample once: full steps; slots past the pool's end are padding (-1).
  ``uneven`` every sample once, no padding: as ``pad`` with the padding cut off, so the
             last batches are short and a rank may have one batch fewer than another.
- A rank's batches go to its workers round-robin (batch b to worker ``b % workers``), so
  worker batch counts differ by at most one and every worker is busy whenever the rank has
  at least ``workers`` batches, whatever the number of shards.

Everything is vectorised numpy over this rank's share: with order version 2 a rank's plan
costs about the same per sample of its share at 100 k and at 13 M samples (``bench.plan``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from imgprep import World, node_shards
from loaders.errors import LoaderError
from loaders.order import ORDER_VERSION, order_at
from loaders.repeats import check_repeats, held

# How an epoch ends (the module docstring, docs/loaders.md "Tails"): full batches only; every
# sample once with short last batches; every sample once with padding; every sample once,
# counts differing between ranks.
TAILS = ("drop", "short", "pad", "uneven")
PAD = -1  # a padding slot in a plan's sample table
MIN_SHORT = 2  # tail="short": the fewest samples a last batch gets where the pool allows


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


@dataclass(frozen=True, eq=False)
class Pool:
    """A pool's samples as ranges of sample ids, in the pool's own order (replicate: one
    range, the whole set; partition: the node's shards): positions ``cum[i] .. cum[i+1]-1``
    are ids ``first[i] ..``. O(ranges) memory, whatever the samples."""

    first: np.ndarray  # first sample id of each (non-empty) range
    cum: np.ndarray  # positions before each range, then the pool's size

    def __len__(self) -> int:
        return int(self.cum[-1])

    def ids(self, positions: np.ndarray) -> np.ndarray:
        """The sample id at each of ``positions`` (each in ``[0, len(self))``)."""
        at = np.asarray(positions, dtype=np.int64)
        i = np.searchsorted(self.cum, at, side="right") - 1
        return self.first[i] + (at - self.cum[i])

    @classmethod
    def of_ranges(cls, first: np.ndarray, counts: np.ndarray) -> Pool:
        keep = counts > 0
        return cls(first=np.asarray(first[keep], np.int64),
                   cum=np.concatenate([[0], np.cumsum(counts[keep], dtype=np.int64)]))


def pools(samples: Sequence[int], num_nodes: int, mode: str, seed: int) -> list[Pool]:
    """Each pool's samples as shard ranges: one pool for replicate, one per node for
    partition (the node's shards, as ``imgprep.job.assign.node_shards`` places them)."""
    counts = np.asarray(samples, np.int64)
    first = np.concatenate([[0], np.cumsum(counts)])
    if mode == "replicate":
        return [Pool.of_ranges(first[:1], first[-1:])]
    return [Pool.of_ranges(first[np.asarray(held, np.int64)], counts[np.asarray(held, np.int64)])
            for held in node_shards(samples, num_nodes, mode, seed)]


def order_positions(n: int, seed: int, epoch: int, pool: int, shuffle: bool,
                    positions: np.ndarray, version: int = ORDER_VERSION, repeats: int = 1
                    ) -> np.ndarray:
    """Epoch ``epoch``'s order of a pool of ``n`` samples at ``positions``: the pool
    position each holds (``loaders.order``; the positions themselves without shuffle); with
    ``repeats`` k > 1, the epoch's repeated order (``loaders.repeats``)."""
    key, at = held(positions, n, epoch, repeats)
    if not shuffle:
        return at
    return order_at(at, n, seed, key, pool, version)


def pool_order(ids: Pool, seed: int, epoch: int, pool: int, shuffle: bool,
               version: int = ORDER_VERSION, repeats: int = 1) -> np.ndarray:
    """Epoch ``epoch``'s whole order of a pool's sample ids (pool-sized: for checks and
    summaries; plans look up only their own positions); with ``repeats`` k > 1 the
    repeated order, each held sample k times."""
    n = len(ids)
    return ids.ids(order_positions(n, seed, epoch, pool, shuffle, np.arange(n), version,
                                   repeats))


@dataclass(frozen=True, kw_only=True)
class Cut:
    """How the rest of an epoch is cut into the steps every rank takes: ``steps`` steps of
    ``group`` runs (one a rank, in slot order). Pool p's runs take ``batch_size`` positions of its
    order in its first ``full[p]`` steps; the later steps share ``rest[p]`` positions evenly,
    the longer runs first."""

    steps: int
    group: int
    batch_size: int
    full: tuple[int, ...]
    rest: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.full) != len(self.rest) or self.steps < 0 or self.group < 1:
            raise ValueError(f"not a cut: {self}")

    def taken(self, pool: int, runs: np.ndarray) -> np.ndarray:
        """Positions of pool ``pool``'s order that its first ``runs`` runs take."""
        f, g = self.full[pool], self.group
        head = np.minimum(runs, f * g) * self.batch_size
        later = (self.steps - f) * g
        if later == 0:
            return head
        q, r = divmod(self.rest[pool], later)
        k = np.maximum(runs - f * g, 0)
        return head + k * q + np.minimum(k, r)

    def runs(self, pool: int, slot: int) -> tuple[np.ndarray, np.ndarray]:
        """Per step, where rank slot ``slot``'s run starts (from the cut's start) and its
        length."""
        k = np.arange(self.steps, dtype=np.int64) * self.group + slot
        a = self.taken(pool, k)
        return a, self.taken(pool, k + 1) - a

    def blocks(self, pool: int) -> np.ndarray:
        """Per step, where its block of pool ``pool``'s positions starts (from the cut's
        start): a step takes the positions from there up to its ``done``."""
        return self.taken(pool, np.arange(self.steps, dtype=np.int64) * self.group)

    def done(self, pool: int) -> np.ndarray:
        """Per step, positions of pool ``pool``'s order taken once the step is done."""
        return self.taken(pool, (np.arange(self.steps, dtype=np.int64) + 1) * self.group)


def _short_full(left: int, steps: int, group: int, batch_size: int) -> int:
    """tail="short": the most full steps a pool with ``left`` samples can take before
    spreading the rest over its remaining steps with at least ``MIN_SHORT`` (else one)
    sample a run; -1 when not even one a run is possible."""
    for least in dict.fromkeys((min(MIN_SHORT, batch_size), 1)):
        if batch_size == least:  # every run must hold exactly ``batch_size``
            if left == steps * group * batch_size:
                return steps
            continue
        spare = left - steps * group * least
        if spare >= 0:
            return spare // (group * (batch_size - least))
    return -1


def cut(remaining: Sequence[int], group: int, batch_size: int, tail: str) -> Cut:
    """The steps every rank takes when each pool has ``remaining`` samples left."""
    if tail not in TAILS:
        raise ValueError(f"tail must be one of {TAILS}")
    per_step = group * batch_size
    left = [max(0, int(r)) for r in remaining]
    if tail == "drop":
        n = min(r // per_step for r in left)
    else:
        n = max(-(-r // per_step) for r in left)
    if tail != "short":
        return Cut(steps=n, group=group, batch_size=batch_size, full=(n,) * len(left),
                   rest=(0,) * len(left))
    full = [_short_full(r, n, group, batch_size) for r in left]
    if min(full) < 0:
        r = left[full.index(min(full))]
        raise LoaderError(
            f"tail='short' cannot give each of {group} ranks {n} batches of at least one "
            f"sample from the {r} samples left (batch size {batch_size}); load with "
            "tail='pad' (every sample once, padding slots) or tail='drop'")
    return Cut(steps=n, group=group, batch_size=batch_size, full=tuple(full),
               rest=tuple(r - f * per_step for r, f in zip(left, full, strict=True)))


def pool_starts(start: int | Sequence[int], sizes: Sequence[int]) -> tuple[int, ...]:
    """Per pool, the positions of its order done: ``start`` is one count for every pool
    (each pool's capped at its size) or one count per pool."""
    if isinstance(start, int | np.integer):
        return tuple(min(max(0, int(start)), n) for n in sizes)
    if len(start) != len(sizes):
        raise ValueError(f"{len(start)} sample counts for {len(sizes)} pools")
    return tuple(min(max(0, int(s)), n) for s, n in zip(start, sizes, strict=True))


def as_samples(done: Sequence[int], sizes: Sequence[int]) -> int | list[int]:
    """``done`` (per pool, each capped at its size) as one count when one count says it for
    every pool, else the list (partition, inside a short tail that pools cut differently)."""
    x = max(done, default=0)
    if all(min(x, n) == d for d, n in zip(done, sizes, strict=True)):
        return int(x)
    return [int(d) for d in done]


@dataclass(frozen=True, eq=False, kw_only=True)
class EpochPlan:
    """One rank's epoch from ``starts`` on: its batches (rows of ``table``, global sample
    ids, ``PAD`` for padding or past a short batch's end) and which worker makes each (batch
    b: worker ``b % workers``)."""

    epoch: int
    starts: tuple[int, ...]  # per pool: positions of its order done before this plan
    group: Group
    workers: int
    table: np.ndarray  # (batches, batch size) int64
    first: np.ndarray  # per batch: the order position of its first slot (seeds its RNG)
    done: np.ndarray  # (pools, batches): positions of each pool's order done after a batch
    sizes: tuple[int, ...]  # samples in each pool
    shard_first: np.ndarray  # first sample id of each shard (+ total)

    def __post_init__(self) -> None:
        rows = len(self.table)
        if (self.table.ndim != 2 or self.first.shape != (rows,)
                or self.done.shape != (len(self.sizes), rows) or self.workers < 1):
            raise ValueError(f"epoch {self.epoch}: a plan's table, first positions and done "
                             "counts must agree on its batches")

    @property
    def batches(self) -> int:
        return len(self.table)

    @property
    def batch_size(self) -> int:
        """Slots a batch of this plan has (the loader's per-rank batch size)."""
        return int(self.table.shape[1])

    @property
    def start(self) -> int:
        """This rank's pool's positions done before this plan."""
        return self.starts[self.group.pool]

    def consumed(self, batches: int) -> int:
        """Positions of this rank's pool's order done after the plan's first ``batches``."""
        return self.position(batches)[self.group.pool]

    def position(self, batches: int) -> tuple[int, ...]:
        """Every pool's positions done (capped at its size) after the first ``batches``."""
        if batches <= 0:
            return self.starts
        return tuple(min(int(d), n) for d, n in zip(self.done[:, batches - 1], self.sizes,
                                                    strict=True))

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
               start: int | Sequence[int] = 0, order_version: int = ORDER_VERSION,
               repeats: int = 1) -> EpochPlan:
    """This rank's plan for ``epoch`` once ``start`` positions of each pool's order are done
    (one count for every pool, or one per pool; 0: the whole epoch), its order of version
    ``order_version`` (``loaders.order``), repeated ``repeats`` times (``loaders.repeats``:
    the slots of a step strided). Every rank computes the same step count from the counts
    alone; with version 2 the rest costs this rank's share, not the pool."""
    repeats = check_repeats(repeats)
    group = group_of(world, mode)
    every = pools(samples, world.num_nodes, mode, seed)
    sizes = tuple(len(p) for p in every)
    starts = pool_starts(start, sizes)
    try:
        c = cut([n - s for n, s in zip(sizes, starts, strict=True)], group.size, batch_size,
                tail)
    except LoaderError as e:
        raise LoaderError(f"rank {world.rank}: {e}") from None
    ids, n = every[group.pool], sizes[group.pool]
    offset, width = c.runs(group.pool, group.slot)
    stride = 1
    if repeats > 1:  # a step's consecutive positions (a sample's copies) to consecutive slots
        offset, stride = c.blocks(group.pool) + group.slot, group.size
    first = starts[group.pool] + offset
    col = np.arange(batch_size, dtype=np.int64)[None, :]
    pos = first[:, None] + stride * col
    real = (col < width[:, None]) & (pos < n)
    table = np.full(pos.shape, PAD, dtype=np.int64)
    if n:  # only this rank's positions are looked up
        at = order_positions(n, seed, epoch, group.pool, shuffle, pos[real], order_version,
                             repeats)
        table[real] = ids.ids(at)
    done = np.stack([s + c.done(p) for p, s in enumerate(starts)]).reshape(len(sizes), -1)
    if tail == "uneven":  # only batches with a real sample (always a leading run of them)
        keep = real.any(axis=1)
        table, first, done = table[keep], first[keep], done[:, keep]
    shard_first = np.concatenate([[0], np.cumsum(np.asarray(samples, np.int64))])
    return EpochPlan(epoch=epoch, starts=starts, group=group, workers=max(1, workers),
                     table=table, first=first, done=done, sizes=sizes, shard_first=shard_first)


@dataclass(frozen=True, kw_only=True)
class JobSummary:
    """What an epoch of a job gives (``job_summary``)."""

    ranks: int
    steps: int  # batches every rank takes
    seen: float  # the share of the set an epoch sees
    busy_workers: int  # of a rank's workers, those with samples to decode
    workers: int
    worker_spread: int  # most minus fewest samples a worker of the rank decodes


def job_summary(samples: Sequence[int], nodes: int, local: int, workers: int,
                batch_size: int, mode: str = "replicate", tail: str = "drop", seed: int = 0
                ) -> JobSummary:
    """What an epoch of a job gives, from the counts alone (rank 0; in partition mode the
    first node's ranks): steps, the share of the set seen, busy workers per rank and the
    spread of worker sample counts."""
    world = World(rank=0, world_size=nodes * local, local_rank=0, local_world_size=local,
                  node_rank=0, num_nodes=nodes)
    group = group_of(world, mode)
    sizes = [len(p) for p in pools(samples, nodes, mode, seed)]
    c = cut(sizes, group.size, batch_size, tail)
    seen = sum(min(n, int(c.done(p)[-1])) for p, n in enumerate(sizes)) if c.steps else 0
    width = c.runs(group.pool, group.slot)[1].tolist()
    per_worker = [sum(width[k::workers]) for k in range(workers)]
    return JobSummary(ranks=nodes * local, steps=c.steps, seen=seen / sum(samples),
                      busy_workers=sum(1 for n in per_worker if n), workers=workers,
                      worker_spread=max(per_worker) - min(per_worker))
