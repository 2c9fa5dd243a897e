"""Tests for imgprep.assign: which node holds which shards and which rank reads which.

Properties are checked with hypothesis over many layouts (nodes x ranks per node), shard counts,
samples per shard, seeds and epochs, across every rank of a World built directly: the ranks'
shards partition what they share, sample totals stay within one shard of each other, outputs are
pure functions of their inputs, and seeds/epochs actually reshuffle.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from imgprep.assign import MODES, balanced_split, node_shards, rank_shards
from imgprep.errors import WorldError
from imgprep.world import World

PROPS = settings(max_examples=200, deadline=None)

seeds = st.integers(0, 2**32 - 1)
epochs = st.integers(0, 10_000)
sample_counts = st.integers(1, 3000)


def worlds(nodes: int, per_node: int) -> list[World]:
    """Every rank of a block layout, in rank order."""
    return [World(k * per_node + lr, nodes * per_node, lr, per_node, k, nodes)
            for k in range(nodes) for lr in range(per_node)]


def totals(samples: Sequence[int], groups: Sequence[Sequence[int]]) -> list[int]:
    return [sum(samples[i] for i in g) for g in groups]


def assert_partition(groups: Sequence[Sequence[int]], items: Sequence[int]) -> None:
    """Every item of ``items`` in exactly one group, nothing else."""
    flat = [i for g in groups for i in g]
    assert len(flat) == len(set(flat)), f"an item is in two groups: {groups}"
    assert sorted(flat) == sorted(items)


def assert_balanced(samples: Sequence[int], groups: Sequence[Sequence[int]],
                    items: Sequence[int]) -> None:
    """Group totals differ by at most the heaviest item's samples."""
    t = totals(samples, groups)
    heaviest = max((samples[i] for i in items), default=0)
    assert max(t) - min(t) <= heaviest, f"totals {t} differ by more than {heaviest}"


def near_equal(total: int, n: int) -> list[int]:
    """Samples per shard as convert cuts them: np.array_split of ``total`` into ``n``."""
    return [len(p) for p in np.array_split(np.arange(total), n)]


@st.composite
def layouts(draw: st.DrawFn, max_nodes: int = 4, max_per_node: int = 4) -> tuple[int, int]:
    return draw(st.integers(1, max_nodes)), draw(st.integers(1, max_per_node))


# --- balanced_split ----------------------------------------------------------------------------


@PROPS
@given(data=st.data(), samples=st.lists(st.integers(0, 5000), min_size=0, max_size=60),
       parts=st.integers(1, 9))
def test_balanced_split_properties(data: st.DataObject, samples: list[int], parts: int) -> None:
    order = data.draw(st.permutations(range(len(samples))).flatmap(
        lambda p: st.integers(0, len(p)).map(lambda k: list(p[:k]))), label="order")
    groups = balanced_split(samples, parts, order)
    assert len(groups) == parts
    assert_partition(groups, order)
    assert_balanced(samples, groups, order)
    assert balanced_split(list(samples), parts, list(order)) == groups  # deterministic
    position = {item: k for k, item in enumerate(order)}
    for g in groups:
        assert [position[i] for i in g] == sorted(position[i] for i in g), \
            f"group {g} is not in the relative order of {order}"


@PROPS
@given(samples=st.lists(sample_counts, min_size=1, max_size=60), parts=st.integers(1, 9))
def test_balanced_split_no_empty_part_with_enough_items(samples: list[int], parts: int) -> None:
    """With positive sample counts and at least as many items as parts, no part is empty."""
    assume(len(samples) >= parts)
    groups = balanced_split(samples, parts, range(len(samples)))
    assert all(groups), groups


def test_balanced_split_examples() -> None:
    assert balanced_split([7, 3, 3, 1], 2, [0, 1, 2, 3]) == [[0], [1, 2, 3]]
    # equal weights: dealt round-robin in ``order``
    assert balanced_split([5] * 6, 3, [5, 4, 3, 2, 1, 0]) == [[5, 2], [4, 1], [3, 0]]
    # one part takes everything, in order
    assert balanced_split([1, 2, 3], 1, [2, 0, 1]) == [[2, 0, 1]]
    # more parts than items: the rest stay empty
    assert balanced_split([4, 9], 4, [0, 1]) == [[0], [1], [], []]
    # the order decides (a reshuffle moves items), whatever the weights
    assert balanced_split([1, 2, 3, 4], 2, [3, 2, 1, 0]) == [[3, 0], [2, 1]]
    assert balanced_split([1, 2, 3, 4], 2, [0, 1, 2, 3]) == [[0, 2], [1, 3]]
    assert balanced_split([], 2, []) == [[], []]


@pytest.mark.parametrize("parts", [0, -1])
def test_balanced_split_needs_a_part(parts: int) -> None:
    with pytest.raises(ValueError, match="parts must be >= 1"):
        balanced_split([1, 2], parts, [0, 1])


# --- node_shards -------------------------------------------------------------------------------


@PROPS
@given(samples=st.lists(sample_counts, min_size=0, max_size=60), nodes=st.integers(1, 6),
       seed=seeds)
def test_node_shards_replicate(samples: list[int], nodes: int, seed: int) -> None:
    held = node_shards(samples, nodes, "replicate", seed)
    assert held == [list(range(len(samples)))] * nodes


@PROPS
@given(samples=st.lists(sample_counts, min_size=1, max_size=60), nodes=st.integers(1, 6),
       seed=seeds)
def test_node_shards_partition(samples: list[int], nodes: int, seed: int) -> None:
    n = len(samples)
    if n < nodes:
        with pytest.raises(WorldError, match="--shards"):
            node_shards(samples, nodes, "partition", seed)
        return
    held = node_shards(samples, nodes, "partition", seed)
    assert len(held) == nodes
    assert_partition(held, range(n))
    assert_balanced(samples, held, range(n))
    for shards in held:
        assert shards, "a node holds nothing"
        assert shards == sorted(set(shards)), "not ascending"
    assert node_shards(list(samples), nodes, "partition", seed) == held  # deterministic


@settings(max_examples=100, deadline=None)
@given(total=st.integers(8 * 50, 8 * 3000), n=st.integers(8, 60), nodes=st.integers(2, 4),
       first=seeds)
def test_node_shards_seed_changes_partition(total: int, n: int, nodes: int, first: int) -> None:
    """Shards as convert cuts them (np.array_split): ten seeds do not all give one partition."""
    samples = near_equal(total, n)
    parts = {tuple(map(tuple, node_shards(samples, nodes, "partition", (first + s) % 2**32)))
             for s in range(10)}
    assert len(parts) > 1


@pytest.mark.parametrize("profile", ["equal", "array_split", "distinct"])
def test_node_shards_seed_changes_partition_whatever_the_sizes(profile: str) -> None:
    """The seed picks the partition for any shard sizes, not only when sizes tie.

    With distinct sample counts balanced_split sorts heaviest first and the seeded order only
    breaks ties, so every seed gives the same partition."""
    samples = {"equal": [1000] * 16, "array_split": near_equal(16_000 - 5, 16),
               "distinct": [1000 + 7 * i for i in range(16)]}[profile]
    parts = {tuple(map(tuple, node_shards(samples, 2, "partition", seed))) for seed in range(10)}
    assert len(parts) > 1


@pytest.mark.parametrize("n, nodes", [(0, 1), (1, 2), (3, 4), (7, 8)])
def test_node_shards_too_few_shards(n: int, nodes: int) -> None:
    with pytest.raises(WorldError, match=f"{n} shards cannot be partitioned over {nodes} nodes"
                                         ".*--shards") as info:
        node_shards([100] * n, nodes, "partition", 0)
    assert isinstance(info.value, ValueError)


def test_node_shards_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        node_shards([1, 2, 3], 1, "stripe", 0)
    with pytest.raises(ValueError, match="mode must be one of"):
        rank_shards([1, 2, 3], World(), "stripe", 0)


def test_node_shards_example() -> None:
    samples = [1250] * 9 + [1249] * 3
    held = node_shards(samples, 3, "partition", 7)
    assert [len(h) for h in held] == [4, 4, 4]
    assert_partition(held, range(12))
    assert_balanced(samples, held, range(12))
    assert node_shards(samples, 3, "partition", 7) == held


# --- rank_shards -------------------------------------------------------------------------------


def _all_ranks(samples: list[int], nodes: int, per_node: int, mode: str, seed: int,
               epoch: int) -> list[list[int] | None]:
    """Each rank's shards in order, or None where rank_shards refused with WorldError."""
    out: list[list[int] | None] = []
    for w in worlds(nodes, per_node):
        try:
            out.append(rank_shards(samples, w, mode, seed, epoch))
        except WorldError:
            out.append(None)
    return out


@PROPS
@given(samples=st.lists(sample_counts, min_size=1, max_size=48), layout=layouts(), seed=seeds,
       epoch=epochs)
def test_rank_shards_replicate(samples: list[int], layout: tuple[int, int], seed: int,
                               epoch: int) -> None:
    nodes, per_node = layout
    n, size = len(samples), nodes * per_node
    if n < size:
        for w in worlds(nodes, per_node):
            with pytest.raises(WorldError, match=f"{n} shards cannot feed {size} ranks"):
                rank_shards(samples, w, "replicate", seed, epoch)
        return
    mine = [rank_shards(samples, w, "replicate", seed, epoch) for w in worlds(nodes, per_node)]
    assert_partition(mine, range(n))  # all shards over all ranks, each once
    assert_balanced(samples, mine, range(n))  # globally
    assert all(mine), "a rank reads nothing"
    again = [rank_shards(list(samples), w, "replicate", seed, epoch)
             for w in worlds(nodes, per_node)]
    assert again == mine  # deterministic, order included


@PROPS
@given(samples=st.lists(sample_counts, min_size=1, max_size=48), layout=layouts(), seed=seeds,
       epoch=epochs)
def test_rank_shards_partition(samples: list[int], layout: tuple[int, int], seed: int,
                               epoch: int) -> None:
    nodes, per_node = layout
    n = len(samples)
    if n < nodes:
        for w in worlds(nodes, per_node):
            with pytest.raises(WorldError, match="--shards"):
                rank_shards(samples, w, "partition", seed, epoch)
        return
    held = node_shards(samples, nodes, "partition", seed)
    everyone = worlds(nodes, per_node)
    read: list[int] = []
    for k in range(nodes):
        on_node = [w for w in everyone if w.node_rank == k]
        if len(held[k]) < per_node:
            for w in on_node:
                with pytest.raises(WorldError, match=f"{len(held[k])} shards cannot feed "
                                                     f"{per_node} ranks"):
                    rank_shards(samples, w, "partition", seed, epoch)
            continue
        mine = [rank_shards(samples, w, "partition", seed, epoch) for w in on_node]
        assert_partition(mine, held[k])  # the node's shards over its ranks; nothing it lacks
        assert_balanced(samples, mine, held[k])  # within the node
        assert all(mine), "a rank reads nothing"
        again = [rank_shards(list(samples), w, "partition", seed, epoch) for w in on_node]
        assert again == mine  # deterministic, order included
        read += [i for m in mine for i in m]
    assert len(read) == len(set(read)), "two nodes read the same shard"


@PROPS
@given(samples=st.lists(sample_counts, min_size=8, max_size=48), layout=layouts(), seed=seeds,
       first=epochs, mode=st.sampled_from(MODES))
def test_rank_shards_epochs_differ(samples: list[int], layout: tuple[int, int], seed: int,
                                   first: int, mode: str) -> None:
    """Five consecutive epochs do not all produce one and the same assignment and order."""
    nodes, per_node = layout
    assume(len(samples) >= 2 * nodes * per_node)
    runs = [_all_ranks(samples, nodes, per_node, mode, seed, first + e) for e in range(5)]
    assert any(r is not None for r in runs[0])
    assert any(r != runs[0] for r in runs[1:]), f"all five epochs give {runs[0]}"


@settings(max_examples=100, deadline=None)
@given(total=st.integers(16 * 50, 16 * 3000), n=st.integers(16, 64), layout=layouts(),
       seed=seeds, first=epochs)
def test_replicate_epochs_move_shards_between_ranks(total: int, n: int, layout: tuple[int, int],
                                                    seed: int, first: int) -> None:
    """Replicate reshuffles globally: with shards as convert cuts them, which rank reads which
    shards (not only the order) changes across five epochs."""
    nodes, per_node = layout
    assume(nodes * per_node > 1)
    samples = near_equal(total, n)
    sets = {tuple(frozenset(r or ()) for r in
                  _all_ranks(samples, nodes, per_node, "replicate", seed, first + e))
            for e in range(5)}
    assert len(sets) > 1


@pytest.mark.parametrize("profile", ["equal", "array_split", "distinct"])
def test_replicate_epochs_move_shards_between_ranks_whatever_the_sizes(profile: str) -> None:
    """"replicate: loaders reshuffle shards globally each epoch" holds for any shard sizes.

    With distinct sample counts balanced_split's heaviest-first sort ignores the epoch's
    shuffle, so every epoch each rank reads exactly the same shards (only their order changes).
    """
    samples = {"equal": [1000] * 16, "array_split": near_equal(16_000 - 5, 16),
               "distinct": [1000 + 7 * i for i in range(16)]}[profile]
    sets = {tuple(frozenset(r or ()) for r in _all_ranks(samples, 1, 4, "replicate", 0, e))
            for e in range(5)}
    assert len(sets) > 1


def test_rank_shards_single_process_reads_everything() -> None:
    samples = [10, 20, 30, 40, 50]
    for mode in MODES:
        mine = rank_shards(samples, World(), mode, 3, 0)
        assert sorted(mine) == [0, 1, 2, 3, 4]
        assert rank_shards(samples, World(), mode, 3, 0) == mine


def test_rank_shards_default_epoch_is_zero() -> None:
    w = World(1, 4, 1, 2, 0, 2)
    for mode in MODES:
        assert rank_shards([100] * 12, w, mode, 5) == rank_shards([100] * 12, w, mode, 5, 0)


def test_rank_shards_launcher_does_not_matter() -> None:
    a = World(3, 4, 1, 2, 1, 2, launcher="torchrun")
    b = World(3, 4, 1, 2, 1, 2, launcher="slurm")
    for mode in MODES:
        assert rank_shards([100] * 12, a, mode, 5, 2) == rank_shards([100] * 12, b, mode, 5, 2)


def test_rank_shards_partition_example_two_nodes_by_four() -> None:
    samples = [1250] * 24
    held = node_shards(samples, 2, "partition", 11)
    assert [len(h) for h in held] == [12, 12]
    for epoch in range(3):
        for w in worlds(2, 4):
            mine = rank_shards(samples, w, "partition", 11, epoch)
            assert len(mine) == 3
            assert set(mine) <= set(held[w.node_rank])


@pytest.mark.parametrize("mode, n, layout", [
    ("replicate", 3, (1, 4)),
    ("replicate", 7, (2, 4)),
    ("partition", 1, (2, 1)),
    ("partition", 6, (2, 4)),
    ("partition", 5, (1, 8)),
])
def test_rank_shards_too_few_shards(mode: str, n: int, layout: tuple[int, int]) -> None:
    for w in worlds(*layout):
        with pytest.raises(WorldError, match="--shards"):
            rank_shards([1000] * n, w, mode, 0, 0)


def test_rank_shards_partition_node_with_too_few_shards_is_refused() -> None:
    """Enough shards for all ranks, but one huge shard fills node 0 alone: its ranks get a
    WorldError rather than an empty list, and node 1 still works."""
    samples = [10_000] + [10] * 7
    short_seen = False
    for seed in range(20):
        held = node_shards(samples, 2, "partition", seed)
        out = _all_ranks(samples, 2, 4, "partition", seed, 0)
        for node in (0, 1):
            ranks = out[node * 4:(node + 1) * 4]
            if len(held[node]) < 4:
                short_seen = True
                assert ranks == [None] * 4
            else:
                assert all(ranks)
    assert short_seen  # some seed puts the huge shard on a node with fewer than 4 shards
