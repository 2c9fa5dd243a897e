"""Epoch orders (``loaders.order``) and pools held as shard ranges (``loaders.epochs.Pool``).

Version 1 is numpy's ``Generator.permutation``, which numpy does not promise stable: its
digests are pinned here so that a numpy upgrade that changes it fails loudly (checkpoints of
version 1 would resume onto other samples). Version 2 is pinned the same way, and checked
to be a permutation of ``[0, n)`` for awkward ``n``, computed position by position.
"""

from __future__ import annotations

import hashlib
import tracemalloc

import numpy as np
import pytest

from imgprep.job.world import World
from loaders.epochs import PAD, Pool, plan_epoch, pool_order, pools
from loaders.order import ORDER_VERSION, ORDER_VERSIONS, check_order_version, order_at

SAMPLES = [100] * 7 + [37, 0, 64]  # an empty shard and a short one


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(a).astype("<i8").tobytes()).hexdigest()[:16]


# (seed, epoch, pool, n) -> first 16 hex digits of sha256 of the whole order (int64 LE)
GOLDEN = {
    1: {(0, 0, 0, 10): "2075fef29e4ba906", (0, 1, 0, 10): "063fe561601fa83a",
        (7, 3, 2, 1000): "5b6033f0c89c653c", (123456789, 41, 15, 4097): "854470f05dc2785d",
        (2**40 + 5, 2, 0, 65536): "1d2bf9d70773d635"},
    2: {(0, 0, 0, 10): "fd685315d666bb29", (7, 3, 2, 1000): "9e052ecf78b2a0f7",
        (2**40 + 5, 2, 0, 65536): "d007961baf39f3c6"},
}
# (version, mode, rank) -> digest of the plan's table: World(rank, 6 ranks, 3 a node, 2
# nodes), layout seed 11, epoch 4, batch 8, 2 workers, tail pad, over SAMPLES
GOLDEN_PLANS = {
    (1, "replicate", 0): "231078143203b3b8", (1, "replicate", 5): "33ce24a5fc59b876",
    (1, "partition", 0): "2e4616f1a3e26d95", (1, "partition", 5): "59e007fa535ac21a",
    (2, "replicate", 5): "eae90697dae7730c", (2, "partition", 5): "ef57109a62cc32e2",
}


@pytest.mark.parametrize("version", ORDER_VERSIONS)
def test_orders_are_pinned(version: int) -> None:
    for (seed, epoch, pool, n), want in GOLDEN[version].items():
        got = order_at(np.arange(n), n, seed, epoch, pool, version)
        assert digest(got) == want, (version, seed, epoch, pool, n)


@pytest.mark.parametrize(("version", "mode", "rank"), list(GOLDEN_PLANS))
def test_plan_tables_are_pinned(version: int, mode: str, rank: int) -> None:
    world = World(rank=rank, world_size=6, local_rank=rank % 3, local_world_size=3,
                  node_rank=rank // 3, num_nodes=2)
    plan = plan_epoch(SAMPLES, world, mode, 11, 4, 8, 2, "pad", order_version=version)
    assert digest(plan.table) == GOLDEN_PLANS[(version, mode, rank)]


def _awkward_sizes() -> list[int]:
    primes = [3, 5, 7, 11, 13, 31, 97, 257, 1009, 65_537]
    powers = [2**k + d for k in range(1, 17) for d in (-1, 0, 1)]
    return sorted({0, 1, 2, *primes, *powers, 4**6, 4**6 + 1, 100_000})


@pytest.mark.parametrize("n", _awkward_sizes())
def test_version_2_is_a_permutation(n: int) -> None:
    order = order_at(np.arange(n), n, 5, 2, 1, 2)
    assert order.dtype == np.int64 and len(order) == n
    assert np.array_equal(np.sort(order), np.arange(n))


def test_version_2_at_some_positions_is_the_whole_order_there() -> None:
    n = 10_007
    whole = order_at(np.arange(n), n, 3, 9, 0, 2)
    at = np.random.default_rng(0).integers(0, n, 500)
    assert np.array_equal(order_at(at, n, 3, 9, 0, 2), whole[at])
    assert np.array_equal(order_at(at, n, 3, 9, 0, 2), whole[at])  # same on a repeat
    assert len(order_at(np.zeros(0, np.int64), n, 3, 9, 0, 2)) == 0


def test_version_2_differs_by_seed_epoch_and_pool() -> None:
    n = 1000
    orders = {key: tuple(order_at(np.arange(n), n, *key, 2).tolist())
              for key in [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (2**63, 0, 0)]}
    assert len(set(orders.values())) == len(orders)
    moved = np.mean(np.asarray(orders[(0, 0, 0)]) != np.arange(n))
    assert moved > 0.99  # hardly any fixed points


def test_order_versions_are_checked() -> None:
    assert ORDER_VERSION == 2 and check_order_version(1) == 1
    for bad in (0, 3, "2", True, None):
        with pytest.raises(ValueError, match="order_version must be one of"):
            check_order_version(bad)
    with pytest.raises(ValueError, match="order_version"):
        order_at(np.arange(3), 3, 0, 0, 0, 7)


@pytest.mark.parametrize("mode", ["replicate", "partition"])
def test_pools_are_shard_ranges_mapped_through_cumulative_counts(mode: str) -> None:
    every = pools(SAMPLES, 2, mode, 11)
    first = np.concatenate([[0], np.cumsum(SAMPLES)])
    assert sum(len(p) for p in every) == sum(SAMPLES)
    for p in every:
        assert len(p.first) <= len(SAMPLES)  # O(shards), whatever the samples
        ids = p.ids(np.arange(len(p)))
        assert len(np.unique(ids)) == len(ids)
        shards = np.searchsorted(first, ids, side="right") - 1
        assert np.all(np.diff(shards) >= 0) if mode == "replicate" else len(set(shards)) > 1
    assert sorted(np.concatenate([p.ids(np.arange(len(p))) for p in every]).tolist()) == \
        list(range(sum(SAMPLES)))
    empty = Pool.of_ranges(np.array([0, 5]), np.array([0, 0]))
    assert len(empty) == 0


def test_pool_order_without_shuffle_is_the_pools_own_order() -> None:
    p = pools(SAMPLES, 1, "replicate", 0)[0]
    assert np.array_equal(pool_order(p, 0, 0, 0, False), np.arange(sum(SAMPLES)))
    for version in ORDER_VERSIONS:
        order = pool_order(p, 0, 0, 0, True, version)
        assert sorted(order.tolist()) == list(range(sum(SAMPLES)))


@pytest.mark.parametrize("version", ORDER_VERSIONS)
@pytest.mark.parametrize("tail", ["pad", "drop"])
@pytest.mark.parametrize("mode", ["replicate", "partition"])
def test_every_rank_equal_batches_and_each_sample_once(version: int, tail: str, mode: str
                                                       ) -> None:
    """2 nodes x 3 ranks: equal batch counts; pad: every sample once across the ranks; drop:
    a subset, each at most once, of full batches only."""
    worlds = [World(rank=r, world_size=6, local_rank=r % 3, local_world_size=3, node_rank=r // 3,
                    num_nodes=2) for r in range(6)]
    plans = [plan_epoch(SAMPLES, w, mode, 11, 4, 8, 2, tail, order_version=version)
             for w in worlds]
    assert len({p.batches for p in plans}) == 1
    ids = np.concatenate([p.table[p.table != PAD] for p in plans])
    assert len(np.unique(ids)) == len(ids)
    if tail == "pad":
        assert sorted(ids.tolist()) == list(range(sum(SAMPLES)))
    else:
        assert all((p.table != PAD).all() for p in plans) and len(ids) < sum(SAMPLES)


def test_a_version_2_plan_holds_nothing_pool_sized() -> None:
    """1.28 M samples, one of 128 ranks: the plan's peak allocations stay near its share
    (10,000 samples: ~80 kB a table), far from a pool-sized 10 MB array."""
    samples = [1250] * 1024
    world = World(rank=5, world_size=128, local_rank=5, local_world_size=8, node_rank=0,
                  num_nodes=16)
    plan_epoch(samples, world, "replicate", 0, 1, 256, 8, "drop")  # warm imports
    tracemalloc.start()
    try:
        plan = plan_epoch(samples, world, "replicate", 0, 1, 256, 8, "drop")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.table.size == 39 * 256
    assert peak < 2_000_000, peak
