"""Repeated augmentation (``LoaderOptions.repeats``, ``loaders.repeats``): an epoch of k
repeats holds about n / k samples, each k times, the copies on different ranks of a step
where the group has k ranks, with every plan promise kept.

Plans are checked for explicit Worlds in one process against the repeated order
(``pool_order(..., repeats=k)``, the World-independent sequence a state's positions count);
the loader's promises (exact and elastic resume, draws, refusals) on a small shard set of 57
samples whose labels are their ids (``tests.support.shards``).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from imgprep.job.world import World
from loaders import LoaderOptions, ShardLoader, TrainTransform
from loaders.epochs import PAD, TAILS, EpochPlan, plan_epoch, pool_order, pools
from loaders.errors import LoaderError
from loaders.repeats import REPEATS_KEY
from tests.support import jpeg
from tests.support.shards import UNEQUAL_SIZES, run_epoch, write_split

SIZES = list(UNEQUAL_SIZES)
TOTAL = sum(SIZES)  # 57 samples; sample id == label
BATCH = 4
SEED = 5  # the seed of the plans and the loaders here (their layout seed too)
Batch = tuple[torch.Tensor, torch.Tensor]


def layout(nodes: int, local: int) -> list[World]:
    return [World(rank=r, world_size=nodes * local, local_rank=r % local,
                  local_world_size=local, node_rank=r // local, num_nodes=nodes)
            for r in range(nodes * local)]


def plans(worlds: Sequence[World], tail: str, repeats: int, epoch: int = 1,
          mode: str = "replicate", start: int | tuple[int, ...] = 0, batch: int = BATCH,
          samples: Sequence[int] = SIZES) -> list[EpochPlan]:
    return [plan_epoch(samples, w, mode, SEED, epoch, batch, 2, tail, start=start,
                       repeats=repeats) for w in worlds]


def repeated(epoch: int, repeats: int, mode: str = "replicate", nodes: int = 1,
             samples: Sequence[int] = SIZES) -> list[np.ndarray]:
    """Each pool's repeated order of ``epoch`` (sample ids)."""
    return [pool_order(p, SEED, epoch, k, True, repeats=repeats)
            for k, p in enumerate(pools(samples, nodes, mode, SEED))]


def real(plan: EpochPlan) -> np.ndarray:
    return plan.table[plan.table != PAD]


# ---------------------------------------------------------------------------- plans


def test_repeats_one_gives_todays_plans() -> None:
    """Tables, first positions and done counts of every tail, mode and a few Worlds and
    starts: the digest recorded before repeats existed."""
    h = hashlib.sha256()
    for tail in TAILS:
        for nodes, local in ((1, 3), (2, 2), (1, 1)):
            for mode in ("replicate", "partition"):
                for start in (0, 7):
                    for p in plans(layout(nodes, local), tail, 1, 3, mode, start):
                        for a in (p.table, p.first, p.done):
                            h.update(np.asarray(a).astype("<i8").tobytes())
    assert h.hexdigest()[:16] == "99c7aecc7ee51972"


@pytest.mark.parametrize("repeats", [2, 3, 4])
@pytest.mark.parametrize("tail", TAILS)
def test_an_epoch_holds_each_sample_k_times_but_one(tail: str, repeats: int) -> None:
    """Over 3 ranks: ceil(n / k) samples, each k times but at most one (fewer); with every
    tail but drop the epoch is the repeated order's multiset, and drop leaves out only what
    does not fill a step."""
    every = plans(layout(1, 3), tail, repeats)
    seen = Counter(np.concatenate([real(p) for p in every]).tolist())
    short = [c for c in seen.values() if c != repeats]
    assert len(short) <= 1 and all(c < repeats for c in short), seen
    order = repeated(1, repeats)[0]
    if tail == "drop":
        taken = every[0].batches * 3 * BATCH
        assert seen == Counter(order[:taken].tolist()) and TOTAL - taken < 3 * BATCH
    else:
        assert seen == Counter(order.tolist())
        assert len(seen) == -(-TOTAL // repeats)


@settings(max_examples=150, deadline=None)
@given(samples=st.lists(st.integers(1, 30), min_size=1, max_size=8),
       nodes=st.integers(1, 3), local=st.integers(1, 4), batch=st.integers(1, 6),
       tail=st.sampled_from(TAILS), mode=st.sampled_from(["replicate", "partition"]),
       repeats=st.integers(2, 5), epoch=st.integers(0, 20), start=st.integers(0, 60))
def test_each_step_takes_its_block_of_the_repeated_order_strided(
        samples: list[int], nodes: int, local: int, batch: int, tail: str, mode: str,
        repeats: int, epoch: int, start: int) -> None:
    """Step s of a group of g ranks takes positions ``[done[s-1], done[s])`` of its pool's
    repeated order (a World-independent sequence), rank slot r every g-th from the r-th;
    every rank the same step count (uneven: the steps with a sample)."""
    assume(mode == "replicate" or len(samples) >= nodes)
    worlds = layout(nodes, local)
    try:
        every = plans(worlds, tail, repeats, epoch, mode, start, batch, samples)
    except LoaderError:  # short: fewer samples left than batches to give one each
        assume(False)
        return
    orders = repeated(epoch, repeats, mode, nodes, samples)
    group = local if mode == "partition" else nodes * local
    for w, p in zip(worlds, every, strict=True):
        pool, slot = p.group.pool, p.group.slot
        assert (p.group.size, slot) == (group, w.local_rank if mode == "partition" else w.rank)
        done = np.concatenate([[p.start], p.done[pool]])
        for s in range(p.batches):
            block = orders[pool][done[s]:done[s + 1]]
            row = p.table[s]
            assert np.array_equal(row[row != PAD], block[slot::group]), (w.rank, s)
        if tail != "uneven":
            assert p.batches == every[0].batches


def test_copies_are_on_different_ranks_of_one_step_where_the_group_has_k() -> None:
    """g >= k: within every step a sample's copies are on different ranks, across the
    boundaries of full steps too (a short tail's last steps aside); where k divides a full
    step's g x batch positions, all k copies are in one step."""
    for ranks, repeats, batch in ((3, 3, 4), (4, 2, 3), (4, 3, 3), (6, 3, 2), (5, 3, 4)):
        for tail in TAILS:
            every = plans(layout(1, ranks), tail, repeats, batch=batch)
            steps = max(p.batches for p in every)
            where: dict[int, list[tuple[int, int]]] = {}
            for r, p in enumerate(every):
                for s in range(p.batches):
                    for x in p.table[s][p.table[s] != PAD].tolist():
                        where.setdefault(x, []).append((s, r))
            for x, at in where.items():
                per_step = Counter(s for s, _ in at)
                assert len(set(at)) == len(at), (ranks, repeats, tail, x, at)
                if tail != "short":  # full steps: never one rank twice
                    assert len({r for _, r in at}) == len(at), (ranks, repeats, tail, x, at)
                if (ranks * batch) % repeats == 0 and tail in ("drop", "pad"):
                    assert len(per_step) == 1, (ranks, repeats, tail, x, at)
            assert steps >= 2


def test_the_held_samples_change_every_epoch_and_a_cycle_holds_the_pool() -> None:
    """The k epochs of a cycle hold every sample of the pool, fewer than k of them in two
    epochs; every epoch holds another set."""
    for k in (3, 4):
        held = [set(repeated(e, k)[0].tolist()) for e in range(2 * k)]
        for c in range(2):
            cycle = held[c * k:(c + 1) * k]
            assert set().union(*cycle) == set(range(TOTAL))
            assert sum(len(h) for h in cycle) - TOTAL < k
        assert len({frozenset(h) for h in held}) == 2 * k
        partition = [repeated(e, k, "partition", 2) for e in range(k)]
        for pool, ids in enumerate(pools(SIZES, 2, "partition", SEED)):
            every = set(ids.ids(np.arange(len(ids))).tolist())
            assert set().union(*(set(p[pool].tolist()) for p in partition)) == every


def test_repeats_must_be_a_positive_integer() -> None:
    for bad in (0, -1, True, 1.5, "3", np.int64(3)):
        with pytest.raises(ValueError, match="repeats must be an integer >= 1"):
            LoaderOptions(batch_size=4, repeats=bad)  # type: ignore[arg-type]
    assert LoaderOptions(batch_size=4).repeats == 1


# ---------------------------------------------------------------------------- loaders


def image(i: int) -> bytes:
    return jpeg((64 + (i * 7) % 40, 56 + (i * 11) % 40), seed=300 + i)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("repeats")
    write_split(out, "train", SIZES, image)
    return out


def loader(folder: Path, world: World, tail: str, repeats: int) -> ShardLoader:
    return ShardLoader(folder, "train", world, LoaderOptions(
        batch_size=BATCH, workers=0, tail=tail, repeats=repeats, seed=SEED,
        transform=TrainTransform(size=16)))


def labels_of(batches: Sequence[Batch]) -> list[int]:
    return [int(x) for _, labels in batches for x in labels]


def same(a: Sequence[Batch], b: Sequence[Batch]) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
                                    for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("tail", TAILS)
def test_resume_at_every_batch_gives_the_uninterrupted_batches(folder: Path, tail: str
                                                               ) -> None:
    """Rank 1 of 3, repeats 3: stopped after every batch count b, a new loader resumed
    from the state gives the rest; head and rest are the uninterrupted epoch, pixels too."""
    w = layout(1, 3)[1]
    whole = run_epoch(loader(folder, w, tail, 3), 1)
    for b in range(len(whole) + 1):
        first = loader(folder, w, tail, 3)
        first.set_epoch(1)
        head = [x for _, x in zip(range(b), first, strict=False)]
        state = first.state_dict()
        assert state[REPEATS_KEY] == 3
        then = loader(folder, w, tail, 3)
        then.load_state_dict(state)
        assert same(head + list(then), whole), (tail, b)


@pytest.mark.parametrize(("before", "after"), [(3, 2), (2, 3)])
@pytest.mark.parametrize("tail", ["short", "pad", "drop"])
def test_elastic_resume_sees_every_remaining_position_once(folder: Path, before: int,
                                                           after: int, tail: str) -> None:
    """Stopped after k steps on ``before`` ranks, resumed on ``after`` from rank 0's state:
    the samples before are the repeated order's first positions, those after the rest of
    it (drop: all but what does not fill a step of the new World), each position once."""
    k, order = 2, repeated(1, 3)[0]
    first = [loader(folder, w, tail, 3) for w in layout(1, before)]
    seen: list[int] = []
    for x in first:
        x.set_epoch(1)
        seen += labels_of([b for _, b in zip(range(k), x, strict=False)])
    state = first[0].state_dict()
    assert all(x.state_dict() == state for x in first)  # world-independent
    done = state["samples"]
    assert Counter(seen) == Counter(order[:done].tolist())
    rest: list[int] = []
    for w in layout(1, after):
        x = loader(folder, w, tail, 3)
        x.load_state_dict(state)
        rest += [y for y in labels_of(list(x)) if y != -1]
    left = Counter(order[done:].tolist())
    if tail == "drop":
        assert not Counter(rest) - left and sum((left - Counter(rest)).values()) < after * BATCH
    else:
        assert Counter(rest) == left
        assert Counter(seen + rest) == Counter(labels_of_epoch(folder, tail))


def labels_of_epoch(folder: Path, tail: str) -> list[int]:
    """The real labels of the uninterrupted epoch 1 on 3 ranks."""
    return [y for w in layout(1, 3) for y in labels_of(run_epoch(loader(folder, w, tail, 3), 1))
            if y != -1]


@pytest.mark.parametrize("ranks", [3, 1])
def test_copies_of_a_sample_get_different_draws(folder: Path, ranks: int) -> None:
    """Every sample's copies in an epoch are pairwise different images: on 3 ranks (each
    copy in another rank's batch) and on 1 (the copies in one batch)."""
    images: dict[int, list[torch.Tensor]] = {}
    for w in layout(1, ranks):
        for batch, labels in run_epoch(loader(folder, w, "pad", 3), 2):
            for im, y in zip(batch, labels.tolist(), strict=True):
                if y != -1:
                    images.setdefault(y, []).append(im)
    assert sum(len(v) for v in images.values()) == TOTAL
    for y, copies in images.items():
        for i in range(len(copies)):
            for j in range(i):
                assert not torch.equal(copies[i], copies[j]), (ranks, y, i, j)


def test_a_state_of_another_repeat_count_is_refused(folder: Path) -> None:
    """A state records repeats above 1; a loader of another count refuses it naming both,
    and a state without the key (repeats 1, or written before repeats existed) is 1."""
    w = World()
    three = loader(folder, w, "drop", 3)
    next(iter(three))
    state = three.state_dict()
    one = loader(folder, w, "drop", 1)
    with pytest.raises(LoaderError, match="rank 0: .*repeats=3, this loader has repeats=1"
                       ".*repeats=3 to resume"):
        one.load_state_dict(state)
    next(iter(one))
    plain = one.state_dict()
    assert REPEATS_KEY not in plain
    with pytest.raises(LoaderError, match="repeats=1, this loader has repeats=3"):
        three.load_state_dict(plain)
    two = loader(folder, w, "drop", 2)
    with pytest.raises(LoaderError, match="repeats=3, this loader has repeats=2"):
        two.load_state_dict(state)
    three.load_state_dict(state)
    assert three.state_dict() == state
