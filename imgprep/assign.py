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


def _share(samples: Sequence[int], pool: list[int], parts: int, seed: int, epoch: int,
           key: int, first_rank: int) -> list[list[int]]:
    if len(pool) < parts:
        raise WorldError(
            f"rank {first_rank}: {len(pool)} shards cannot feed {parts} ranks; reconvert with "
            f"more shards (--shards) or run fewer ranks"
        )
    shuffled = [pool[i] for i in _perm(len(pool), seed, epoch, key)]
    groups = balanced_split(samples, parts, shuffled)
    return [[g[i] for i in _perm(len(g), seed, epoch, key, part, 1)]
            for part, g in enumerate(groups)]


def all_rank_shards(samples: Sequence[int], world: World, mode: str, seed: int,
                    epoch: int = 0) -> list[list[int]]:
    """Every rank's shards in ``epoch`` (index = global rank), in reading order; one pass.

    replicate: the whole set is reshuffled each epoch and split over all ranks;
    partition: each node's shards are reshuffled each epoch and split over its local ranks.
    """
    if mode == "replicate":
        return _share(samples, list(range(len(samples))), world.world_size, seed, epoch,
                      1 << 31, 0)
    out: list[list[int]] = []
    for node, pool in enumerate(node_shards(samples, world.num_nodes, mode, seed)):
        out += _share(samples, pool, world.local_world_size, seed, epoch, node,
                      node * world.local_world_size)
    return out


def rank_shards(samples: Sequence[int], world: World, mode: str, seed: int,
                epoch: int = 0) -> list[int]:
    """The shards ``world.rank`` reads in ``epoch``, in reading order (see all_rank_shards)."""
    if mode == "replicate":
        return _share(samples, list(range(len(samples))), world.world_size, seed, epoch,
                      1 << 31, world.rank)[world.rank]
    pool = node_shards(samples, world.num_nodes, mode, seed)[world.node_rank]
    return _share(samples, pool, world.local_world_size, seed, epoch, world.node_rank,
                  world.rank)[world.local_rank]
