"""Which node holds which shards: pure functions of their inputs.

stage-to-node, rank-aware convert and the loaders all call these, so a node never needs a
shard it lacks. Balance is by sample count (in a seeded order, every shard goes to the part
with the fewest samples so far), so parts differ by at most one shard's samples.

- ``replicate``: every node holds every shard; each epoch all ranks share all samples.
- ``partition``: node k holds a disjoint ~1/num_nodes of the shards (read once from the file
  server in all); each epoch its local ranks share the node's samples.

Which rank reads which samples each epoch is ``loaders.epochs`` (sample-granular).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from imgprep.errors import WorldError

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
            f"--shards >= {num_nodes}, or use replicate"
        )
    groups = balanced_split(samples, num_nodes, _perm(n, seed, 0x5EED).tolist())
    return [sorted(g) for g in groups]


def partition_owners(samples: Sequence[int], num_nodes: int, seed: int) -> list[int]:
    """For each shard, the node whose partition share holds it (with fewer shards than
    nodes, shard i's is node i): who reads it from the file server in a fan-out."""
    owner = list(range(len(samples)))
    if len(owner) < num_nodes:
        return owner
    for k, share in enumerate(node_shards(samples, num_nodes, "partition", seed)):
        for i in share:
            owner[i] = k
    return owner
