"""Which node holds which shards, and which rank reads which: pure functions of their inputs.

stage-to-node, rank-aware convert and the loaders all call these, so a node never needs a
shard it lacks. Balance is by sample count (in a seeded order, every shard goes to the part with the
fewest samples so far), so parts differ by at most one shard's samples, and each epoch's
reshuffle moves shards between ranks whatever their sizes.

- ``replicate``: every node holds every shard; each epoch all ranks share them all.
- ``partition``: node k holds a disjoint ~1/num_nodes of the shards (read once from the file
  server in all); each epoch its local ranks share the node's shards.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from imgprep.errors import WorldError
from imgprep.world import World

MODES = ("replicate", "partition")


def balanced_split(samples: Sequence[int], parts: int, order: Sequence[int]) -> list[list[int]]:
    """Split the items ``order`` (indices into ``samples``) into ``parts`` groups of near-equal
    total samples: each item, in ``order``, goes to the group with the fewest samples so far
    (ties to the lowest group). Group totals then differ by at most the heaviest item, and
    a different ``order`` (a reshuffle) gives a different split. Groups keep ``order``."""
    if parts < 1:
        raise ValueError("parts must be >= 1")
    weights = np.asarray(samples, dtype=np.int64)
    load = np.zeros(parts, dtype=np.int64)
    groups: list[list[int]] = [[] for _ in range(parts)]
    for i in np.asarray(order, dtype=np.int64).tolist():
        p = int(np.argmin(load))
        groups[p].append(i)
        load[p] += weights[i]
    return groups


def _perm(n: int, *key: int) -> np.ndarray:
    return np.random.default_rng(list(key)).permutation(n)


def node_shards(samples: Sequence[int], num_nodes: int, mode: str, seed: int) -> list[list[int]]:
    """For each node, the indices of the shards it holds (ascending)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    n = len(samples)
    if mode == "replicate":
        return [list(range(n)) for _ in range(num_nodes)]
    if n < num_nodes:
        raise WorldError(
            f"{n} shards cannot be partitioned over {num_nodes} nodes; reconvert with "
            f"--shards >= {num_nodes} x ranks per node x loader workers, or use replicate"
        )
    groups = balanced_split(samples, num_nodes, _perm(n, seed, 0x5EED).tolist())
    return [sorted(g) for g in groups]


def rank_shards(samples: Sequence[int], world: World, mode: str, seed: int,
                epoch: int = 0) -> list[int]:
    """The shards ``world.rank`` reads in ``epoch``, in reading order.

    replicate: the whole set is reshuffled each epoch and split over all ranks;
    partition: the node's shards are reshuffled each epoch and split over its local ranks.
    """
    if mode == "replicate":
        pool, parts, part, key = list(range(len(samples))), world.world_size, world.rank, 1 << 31
    else:
        pool = node_shards(samples, world.num_nodes, mode, seed)[world.node_rank]
        parts, part, key = world.local_world_size, world.local_rank, world.node_rank
    if len(pool) < parts:
        raise WorldError(
            f"rank {world.rank}: {len(pool)} shards cannot feed {parts} ranks; reconvert with "
            f"more shards (--shards) or run fewer ranks"
        )
    shuffled = [pool[i] for i in _perm(len(pool), seed, epoch, key)]
    mine = balanced_split(samples, parts, shuffled)[part]
    return [mine[i] for i in _perm(len(mine), seed, epoch, key, part, 1)]
