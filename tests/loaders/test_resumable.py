"""``ResumableLoader`` (``loaders.resumable``) and the state ``DeviceLoader`` passes through,
in process: what a training framework reads of a loader (its length, its epochs, its state)
around a resume, on the same World, from rank 0's state on every rank, and elastic.

The data (``tests.support.frameworks``): 46 samples, batches of 4, ``tail="pad"``: 6 steps an
epoch on 2 ranks, 12 on one. Frameworks themselves run in ``tests/frameworks``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from imgprep import World
from loaders import DeviceLoader, LoaderError, ShardLoader
from loaders.resumable import ResumableLoader
from tests.support.frameworks import TOTAL, digest, options, ranks, write_data

Batch = tuple[torch.Tensor, torch.Tensor]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data(tmp_path_factory.mktemp("frameworks"))


def device(folder: Path, world: World) -> DeviceLoader:
    loader = ShardLoader(folder, "train", world, options())
    return DeviceLoader(loader, "cpu", loader.mean, loader.std)


def resumable(folder: Path, world: World, **kw: bool) -> ResumableLoader:
    return ResumableLoader(device(folder, world), **kw)


def digests(batches: list[Batch]) -> list[str]:
    return [digest(images, labels) for images, labels in batches]


def take(loader: ResumableLoader, k: int) -> list[Batch]:
    """The first ``k`` batches of a pass, the pass then left as a framework leaves it."""
    return [b for _, b in zip(range(k), loader, strict=False)]


def labels(batches: list[Batch]) -> list[int]:
    return [int(x) for _, lab in batches for x in lab if x >= 0]


def test_device_loader_state_is_the_wrapped_loaders_as_of_the_batches_out(data: Path) -> None:
    """``DeviceLoader`` passes ``state_dict``/``load_state_dict``/``set_epoch`` through: a
    resume from its state yields the uninterrupted run's rest, pixels included."""
    whole = device(data, World())
    whole.set_epoch(1)
    want = digests(list(whole))
    first = device(data, World())
    first.set_epoch(1)
    got = digests([b for _, b in zip(range(5), first, strict=False)])
    state = first.state_dict()
    assert state == first.loader.state_dict() and state["batch"] == 5  # type: ignore[attr-defined]
    then = device(data, World())
    then.load_state_dict(state)
    assert got + digests(list(then)) == want


def test_device_loader_pairs_each_batch_with_the_state_before_it(data: Path) -> None:
    """On CUDA the next batch is taken before the current one is handed out; each batch
    comes with the state from before it was asked for, which ``state_dict`` gives while the
    batch before it is out (one batch behind the loader)."""
    dev = device(data, World())
    seen = list(dev._with_state(dev.loader))  # type: ignore[arg-type]
    states = [s for s, _ in seen]
    assert [s["batch"] for s in states if s is not None] == list(range(12))
    fresh = ShardLoader(data, "train", World(), options())
    fresh.load_state_dict(states[7] or {})
    assert digests(list(fresh)) == digests([b for _, b in seen[7:]])


def test_device_loader_over_a_loader_without_state_says_what_to_wrap() -> None:
    dev = DeviceLoader([(torch.zeros(1, 3, 2, 2, dtype=torch.uint8), torch.zeros(1))], "cpu",
                       (0.5,) * 3, (0.2,) * 3)
    with pytest.raises(TypeError, match="list.*no state_dict.*ShardLoader or LabelListLoader"):
        dev.state_dict()
    with pytest.raises(TypeError, match="has no state_dict, load_state_dict, set_epoch"):
        ResumableLoader(dev.loader)  # type: ignore[arg-type]


def test_len_is_the_whole_epoch_as_the_framework_counts_it_after_a_resume(data: Path) -> None:
    first = resumable(data, World())
    assert len(first) == first.loader.loader.batches_per_epoch == 12  # type: ignore[attr-defined]
    before = take(first, 5)
    state = first.state_dict()
    assert state["steps"] == first.steps == 5 and state["loader"]["batch"] == 5
    then = resumable(data, World())
    then.load_state_dict(state)
    assert len(then) == 12 and len(then.loader) == 7 and then.steps == 5
    rest = list(then)
    assert len(rest) == 7 and then.steps == 12
    assert sorted(labels(before + rest)) == list(range(TOTAL))


def test_sampler_set_epoch_keeps_a_restored_position_and_starts_every_other_epoch(
        data: Path) -> None:
    """Lightning calls ``loader.sampler.set_epoch(e)`` at each epoch's start, a mid-epoch
    restart included: the restored position of epoch ``e`` is kept; any other call starts
    its epoch; ``set_epoch`` itself always does."""
    whole = resumable(data, World())
    whole.set_epoch(1)
    want = digests(list(whole))
    first = resumable(data, World())
    first.sampler.set_epoch(1)
    got = digests(take(first, 3))
    then = resumable(data, World())
    then.load_state_dict(first.state_dict())
    then.sampler.set_epoch(1)
    then.sampler.set_epoch(1)  # twice: still restored, no pass begun
    assert got + digests(list(then)) == want
    then.sampler.set_epoch(1)  # a pass began since: the epoch starts over
    assert digests(list(then)) == want
    again = resumable(data, World())
    again.load_state_dict(first.state_dict())
    assert again.start_epoch(2) and len(again) == 12 and again.epoch == 2
    plain = resumable(data, World())
    plain.load_state_dict(first.state_dict())
    plain.set_epoch(1)
    assert digests(list(plain)) == want


def test_an_epoch_is_done_when_its_last_batch_is_handed_out(data: Path) -> None:
    """A framework that knows the length asks for no batch after the last: the loader's pass
    is run to its end first, so the state says the epoch is done and ``len()`` is a whole
    epoch again when the framework reads it before the next ``set_epoch``; a resume from
    that state has nothing left of the epoch, and the next epoch is whole."""
    loader = resumable(data, World())
    got = take(loader, 12)  # the pass is never asked for a 13th batch
    state = loader.state_dict()
    assert len(got) == 12 and state["steps"] == 12 and state["loader"]["batch"] == 12
    assert len(loader) == 12 and state["loader"]["from"] == 0
    then = resumable(data, World())
    then.load_state_dict(state)
    assert len(then) == 12 and len(then.loader) == 0 and list(then) == []
    assert then.start_epoch(1) and len(list(then)) == 12


def test_epochs_go_on_where_a_loaded_state_stands(data: Path) -> None:
    """``for epoch in loader.epochs(n)``: a fresh loader from epoch 0; a restored one from
    its epoch and position, then whole epochs."""
    whole = resumable(data, World())
    want = {e: digests(list(whole)) for e in whole.epochs(3)}
    first = resumable(data, World())
    got: dict[int, list[str]] = {}
    for epoch in first.epochs(3):
        got[epoch] = digests(take(first, 4 if epoch == 1 else 12))
        if epoch == 1:
            break
    then = resumable(data, World())
    then.load_state_dict(first.state_dict())
    for epoch in then.epochs(3):
        got[epoch] = got.get(epoch, []) + digests(list(then))
    assert got == want


def test_a_bare_loader_state_resumes_with_its_batch_as_the_steps(data: Path) -> None:
    first = device(data, World())
    first.set_epoch(1)
    before = [b for _, b in zip(range(4), first, strict=False)]
    then = resumable(data, World())
    then.load_state_dict(first.state_dict())
    assert then.epoch == 1 and then.steps == 4 and len(then) == 12
    assert sorted(labels(before + list(then))) == list(range(TOTAL))


def test_every_rank_resumes_from_rank_zeros_state(data: Path) -> None:
    """Frameworks write rank 0's state alone: each rank of the same World resumes from it
    with its own rest of the epoch, exactly."""
    want = {w.rank: digests(list(resumable(data, w))) for w in ranks(2)}
    first = [resumable(data, w) for w in ranks(2)]
    got = {w.rank: digests(take(loader, 4)) for w, loader in zip(ranks(2), first, strict=True)}
    state = first[0].state_dict()
    assert first[1].state_dict() == state
    for w in ranks(2):
        then = resumable(data, w)
        then.load_state_dict(state)
        assert len(then) == 6
        got[w.rank] += digests(list(then))
    assert got == want


def test_elastic_resume_on_fewer_ranks_counts_the_frameworks_steps(data: Path) -> None:
    """2 ranks -> 1: the framework has counted 2 steps; the one rank has what the two had
    not seen, each sample once, and ``len()`` is the count so far plus that."""
    first = [resumable(data, w, at_most_an_epoch=True) for w in ranks(2)]
    seen = [x for loader in first for x in labels(take(loader, 2))]
    then = resumable(data, World(), at_most_an_epoch=True)
    then.load_state_dict(first[0].state_dict())
    rest = list(then)
    assert len(then.loader) == 12 and then.steps == len(rest) + 2
    assert len(rest) == 8 and len(then) == 12  # the pass done: a whole epoch here again
    assert sorted(seen + labels(rest)) == list(range(TOTAL))


def test_at_most_an_epoch_refuses_a_resume_on_more_ranks_that_would_drop_samples(
        data: Path) -> None:
    """1 rank -> 2 after 4 steps: the framework counts 4 steps, the 2 ranks have 4 of theirs
    left: 8 steps where an epoch has 6, which Lightning would cut at 6. Refused, naming why;
    at an epoch's end there is nothing to drop."""
    first = resumable(data, World())
    take(first, 4)
    then = resumable(data, ranks(2)[0], at_most_an_epoch=True)
    with pytest.raises(LoaderError, match="4 steps of epoch 0 done.*4 batches of it left: 8 "
                       "steps, more than a whole epoch here \\(6\\).*as many ranks"):
        then.load_state_dict(first.state_dict())
    free = resumable(data, ranks(2)[0])
    free.load_state_dict(first.state_dict())  # without the limit: a loop runs it all
    assert len(list(free)) == 4
    take(first, 12)  # a new pass replays the epoch, to its end
    end = resumable(data, ranks(2)[0], at_most_an_epoch=True)
    end.load_state_dict(first.state_dict())
    assert list(end) == [] and end.start_epoch(1) and len(list(end)) == 6


@pytest.mark.gpu
def test_device_loader_on_cuda_states_the_batches_handed_out_not_the_one_ahead(
        data: Path) -> None:
    """On CUDA the loader has given one batch more than is out (the one copied ahead): the
    state is as of the batches out, so a resume from it repeats none and skips none; a
    ResumableLoader over it resumes the same."""
    loader = ShardLoader(data, "train", World(), options(workers=1))
    want = digests([(x.cpu(), y.cpu()) for x, y in
                    DeviceLoader(loader, "cuda", loader.mean, loader.std)])
    first = ResumableLoader(DeviceLoader(ShardLoader(data, "train", World(), options(workers=1)),
                                         "cuda", loader.mean, loader.std))
    got = digests([(x.cpu(), y.cpu()) for x, y in take(first, 5)])
    state = first.state_dict()
    assert state["steps"] == 5 and state["loader"]["batch"] == 5
    then = ResumableLoader(DeviceLoader(ShardLoader(data, "train", World(), options(workers=1)),
                                        "cuda", loader.mean, loader.std))
    then.load_state_dict(state)
    assert got + digests([(x.cpu(), y.cpu()) for x, y in then]) == want
