"""Which node holds which shards (imgprep.job.assign) and which rank reads which samples
(loaders.epochs).

Properties are checked with hypothesis over many layouts (nodes x ranks per node), shard counts,
samples per shard, seeds and epochs, across every rank of a World built directly: nodes' shards
partition the set with sample totals within one shard of each other; ranks' samples never
overlap, keep each tail's promise (drop: full batches only, leaving out only what cannot
fill a step; short, pad, uneven: every sample once) with equal step counts, resume on another
World from the samples consumed, and are pure functions of their inputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from imgprep.errors import WorldError
from imgprep.job.assign import MODES, balanced_split, node_shards
from imgprep.job.world import World
from loaders.epochs import PAD, EpochPlan, plan_epoch, pools
from loaders.errors import LoaderError
from loaders.order import ORDER_VERSIONS

PROPS = settings(max_examples=200, deadline=None)

seeds = st.integers(0, 2**32 - 1)
epochs = st.integers(0, 10_000)
sample_counts = st.integers(1, 3000)
versions = st.sampled_from(ORDER_VERSIONS)  # drawn, so both versions cost no extra examples


def worlds(nodes: int, per_node: int) -> list[World]:
    """Every rank of a block layout, in rank order."""
    return [World(rank=k * per_node + lr, world_size=nodes * per_node, local_rank=lr,
                  local_world_size=per_node, node_rank=k, num_nodes=nodes)
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
        plan_epoch([1, 2, 3], World(), "stripe", 0, 0, 1, 1, "drop")


def test_node_shards_example() -> None:
    samples = [1250] * 9 + [1249] * 3
    held = node_shards(samples, 3, "partition", 7)
    assert [len(h) for h in held] == [4, 4, 4]
    assert_partition(held, range(12))
    assert_balanced(samples, held, range(12))
    assert node_shards(samples, 3, "partition", 7) == held


# --- sample-granular epoch plans (loaders.epochs) -------------------------------------------------


def _plans(samples: list[int], nodes: int, per_node: int, mode: str, seed: int, epoch: int,
           batch: int, workers: int, tail: str, start: int | tuple[int, ...] = 0,
           version: int = 2) -> list[EpochPlan]:
    return [plan_epoch(samples, w, mode, seed, epoch, batch, workers, tail, start=start,
                       order_version=version) for w in worlds(nodes, per_node)]


def short_serves(sizes: Sequence[int], group: int, batch: int) -> bool:
    """Whether tail="short" can give every run of every step a sample: at least one per
    run (exactly ``batch`` when the batch is 1)."""
    steps = max(-(-n // (group * batch)) for n in sizes)
    return all(n == steps * group if batch == 1 else n >= steps * group for n in sizes)


def runs_of(plans: Sequence[EpochPlan], worlds_: Sequence[World], mode: str
            ) -> dict[int, np.ndarray]:
    """Per pool, the (steps, group) real samples of each of its ranks' batches."""
    out: dict[int, list[list[int]]] = {}
    for w, p in zip(worlds_, plans, strict=True):
        pool = w.node_rank if mode == "partition" else 0
        out.setdefault(pool, []).append((p.table != PAD).sum(axis=1).tolist())
    return {k: np.array(v).T for k, v in out.items()}


@PROPS
@given(samples=st.lists(st.integers(1, 60), min_size=1, max_size=24), layout=layouts(),
       seed=seeds, epoch=epochs, batch=st.integers(1, 9), workers=st.integers(1, 4),
       tail=st.sampled_from(["drop", "short", "pad", "uneven"]), mode=st.sampled_from(MODES),
       version=versions)
def test_plans_keep_each_tails_promise(
        samples: list[int], layout: tuple[int, int], seed: int, epoch: int, batch: int,
        workers: int, tail: str, mode: str, version: int) -> None:
    """Whatever the shard count: equal step counts on every rank (all but uneven), no sample
    twice, and per tail: drop: full batches only, leaving out only what does not fill a
    step of every pool; short: every sample once, full batches then runs that differ by at
    most one within a step, never empty; pad: every sample once, full batches of padding
    at the end; uneven: every sample once, no padding, counts within one of each other.
    Worker counts are within one batch; a node's ranks read only the node's shards."""
    nodes, per_node = layout
    assume(mode == "replicate" or len(samples) >= nodes)
    sizes = [len(x) for x in pools(samples, nodes, mode, seed)]
    group = per_node if mode == "partition" else nodes * per_node
    if tail == "short" and not short_serves(sizes, group, batch):
        with pytest.raises(LoaderError, match="tail='pad'"):
            _plans(samples, nodes, per_node, mode, seed, epoch, batch, workers, tail,
                   version=version)
        return
    plans = _plans(samples, nodes, per_node, mode, seed, epoch, batch, workers, tail,
                   version=version)
    if tail != "uneven":
        assert len({p.batches for p in plans}) == 1
    ids = np.concatenate([p.table[p.table != PAD] for p in plans])
    assert len(np.unique(ids)) == len(ids)
    total = sum(samples)
    if tail == "drop":
        steps = min(n // (group * batch) for n in sizes)
        assert {p.batches for p in plans} == {steps}
        assert all((p.table != PAD).all() for p in plans), "a drop batch is not full"
        assert total - len(ids) == sum(n - steps * group * batch for n in sizes)
    else:
        assert len(ids) == total
    if tail == "short":
        for r in runs_of(plans, worlds(nodes, per_node), mode).values():
            assert r.min() >= 1 and (r.max(axis=1) - r.min(axis=1)).max() <= 1
            short = np.flatnonzero(r.min(axis=1) < batch)
            assert (r[:short[0]] == batch).all() if len(short) else True
    if tail == "pad":
        assert all(p.table.shape[1] == batch for p in plans)
    if tail == "uneven" and mode == "replicate":
        assert max(p.batches for p in plans) - min(p.batches for p in plans) <= 1
        assert all((p.table != PAD).any(axis=1).all() for p in plans)
    for p in plans:
        counts = p.worker_samples
        assert max(counts) - min(counts) <= batch
        if p.batches >= workers:
            assert min(len(p.worker_batches(w)) for w in range(workers)) > 0
    if mode == "partition":
        held = node_shards(samples, nodes, mode, seed)
        for w, p in zip(worlds(nodes, per_node), plans, strict=True):
            assert set(np.unique(p.shards_of(p.table)).tolist()) <= set(held[w.node_rank])


@PROPS
@given(samples=st.lists(st.integers(1, 60), min_size=1, max_size=24), layout=layouts(),
       seed=seeds, epoch=epochs, batch=st.integers(1, 9), done=st.integers(0, 40),
       after=layouts(), tail=st.sampled_from(["pad", "short"]), version=versions)
def test_replicate_resume_on_another_world_takes_the_rest_of_the_order(
        samples: list[int], layout: tuple[int, int], seed: int, epoch: int, batch: int,
        done: int, after: tuple[int, int], tail: str, version: int) -> None:
    """Steps done on one World, the rest planned on another from the samples consumed: the
    two together are the epoch's order, each sample once (pad, short)."""
    try:
        first = _plans(samples, *layout, "replicate", seed, epoch, batch, 2, tail,
                       version=version)
        k = min(done, first[0].batches)
        start = min(first[0].consumed(k), sum(samples))
        rest = _plans(samples, *after, "replicate", seed, epoch, batch, 3, tail, start,
                      version)
    except LoaderError:  # short: fewer samples (left) than batches to give one each
        assume(False)
        return
    assert all(p.consumed(k) == start for p in first)  # every rank says the same
    ids = np.concatenate([p.table[:k][p.table[:k] != PAD] for p in first]
                         + [p.table[p.table != PAD] for p in rest])
    assert sorted(ids.tolist()) == list(range(sum(samples)))


@PROPS
@given(samples=st.lists(st.integers(1, 60), min_size=2, max_size=24), per_node=st.integers(1, 4),
       seed=seeds, batch=st.integers(2, 9), done=st.integers(0, 40), after=st.integers(1, 4),
       version=versions)
def test_partition_short_resume_on_other_local_ranks_takes_each_pools_rest(
        samples: list[int], per_node: int, seed: int, batch: int, done: int,
        after: int, version: int) -> None:
    """Partition, tail="short": the pools' tails are cut differently, so after k steps the
    pools have done different counts; a plan from those per-pool counts on another number of
    ranks per node gives every remaining sample once."""
    try:
        first = _plans(samples, 2, per_node, "partition", seed, 0, batch, 2, "short",
                       version=version)
        k = min(done, first[0].batches)
        start = first[0].position(k)
        rest = _plans(samples, 2, after, "partition", seed, 0, batch, 2, "short", start,
                      version)
    except LoaderError:
        assume(False)
        return
    assert all(p.position(k) == start for p in first)
    ids = np.concatenate([p.table[:k][p.table[:k] != PAD] for p in first]
                         + [p.table[p.table != PAD] for p in rest])
    assert sorted(ids.tolist()) == list(range(sum(samples)))


def test_short_spreads_the_rest_over_the_last_step() -> None:
    """57 samples, 2 ranks, batch 4: 7 full steps (56), then 1 left for 2 ranks: too few for
    the last step alone, so the last two steps share 9: runs 3, 2 | 2, 2."""
    plans = _plans([57], 1, 2, "replicate", 0, 0, 4, 1, "short")
    sizes = [(p.table != PAD).sum(axis=1).tolist() for p in plans]
    assert sizes == [[4] * 6 + [3, 2], [4] * 6 + [2, 2]]
    plans = _plans([61], 1, 2, "replicate", 0, 0, 4, 1, "short")  # 5 left: 3 and 2
    assert [(p.table != PAD).sum(axis=1).tolist()[-1] for p in plans] == [3, 2]


@pytest.mark.parametrize("version", ORDER_VERSIONS)
def test_plans_are_pure_and_epochs_and_seeds_reshuffle(version: int) -> None:
    samples = [100] * 12
    a = _plans(samples, 2, 2, "replicate", 5, 3, 8, 2, "drop", version=version)
    b = _plans(list(samples), 2, 2, "replicate", 5, 3, 8, 2, "drop", version=version)
    assert all(np.array_equal(x.table, y.table) for x, y in zip(a, b, strict=True))
    for other in (_plans(samples, 2, 2, "replicate", 5, 4, 8, 2, "drop", version=version),
                  _plans(samples, 2, 2, "replicate", 6, 3, 8, 2, "drop", version=version)):
        assert not np.array_equal(a[0].table, other[0].table)


def test_plans_do_not_depend_on_the_launcher() -> None:
    a = World(rank=1, world_size=4, local_rank=1, local_world_size=2, node_rank=0, num_nodes=2,
              launcher="torchrun")
    b = World(rank=1, world_size=4, local_rank=1, local_world_size=2, node_rank=0, num_nodes=2,
              launcher="slurm")
    for mode in MODES:
        x = plan_epoch([100] * 12, a, mode, 5, 2, 8, 2, "drop")
        y = plan_epoch([100] * 12, b, mode, 5, 2, 8, 2, "drop")
        assert np.array_equal(x.table, y.table)


def test_fewer_shards_than_ranks_is_served() -> None:
    """One shard, eight ranks: every rank gets equal batches (whole-shard plans refused):
    7 full steps of 128 (drop), an eighth for the last 104 (short, pad)."""
    for tail, steps in (("drop", 7), ("short", 8), ("pad", 8)):
        plans = _plans([1000], 2, 4, "replicate", 0, 0, 16, 2, tail)
        assert {p.batches for p in plans} == {steps}
        assert all(min(p.worker_samples) > 0 for p in plans)


def test_partition_node_with_too_few_shards_is_refused() -> None:
    with pytest.raises(WorldError, match="--shards"):
        plan_epoch([100, 100], World(rank=0, world_size=3, local_rank=0, local_world_size=1,
                                     node_rank=0, num_nodes=3), "partition", 0, 0, 8, 2, "drop")
