"""Size schedules (``loaders.schedule``): each epoch at its size with every loader promise
kept — the same batches as a loader made at that size, equal counts on every rank, exact and
elastic resume mid-epoch (also across a size change), both layouts, both decode paths, the
workers kept through size changes, the DCT scale still the largest that keeps the crop at
least the output size; and the validation transform's crop ratio."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from imgprep import World, jpegcrop
from loaders import (
    LoaderError,
    LoaderOptions,
    ShardLoader,
    SizeSchedule,
    TrainTransform,
    ValTransform,
)
from loaders.schedule import ramp_size
from tests.support import jpeg
from tests.support.shards import UNEQUAL_SIZES, run_epoch, write_split

TOTAL = sum(UNEQUAL_SIZES)  # 57 samples
SCHEDULE = SizeSchedule.table({0: 32, 1: 48, 3: 40})  # sizes the small images allow
Batch = tuple[torch.Tensor, torch.Tensor]
needs_extension = pytest.mark.skipif(not jpegcrop.AVAILABLE,
                                     reason=f"the crop-aware decoder is {jpegcrop.status()}")
DECODE_PATHS = [pytest.param(True, marks=needs_extension, id="crop-aware"),
                pytest.param(False, id="pillow")]


def image(i: int) -> bytes:
    return jpeg((96 + (i * 37) % 160, 80 + (i * 53) % 170), seed=2000 + i)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("schedule")
    write_split(out, "train", UNEQUAL_SIZES, image)
    write_split(out, "val", UNEQUAL_SIZES, image)
    return out


def ranks(n: int) -> list[World]:
    return [World(rank=r, world_size=n, local_rank=r, local_world_size=n) for r in range(n)]


def loader(data: Path, world: World | None = None, split: str = "train", **options: object
           ) -> ShardLoader:
    given: dict[str, object] = {"batch_size": 4, "workers": 0, "seed": 3,
                                "size_schedule": SCHEDULE}
    return ShardLoader(data, split, world or World(), LoaderOptions(**(given | options)))


def labels_of(batches: Sequence[Batch]) -> list[int]:
    return [int(x) for _, labels in batches for x in labels]


def sizes_of(batches: Sequence[Batch]) -> set[tuple[int, ...]]:
    return {tuple(images.shape[1:]) for images, _ in batches}


def same(a: Sequence[Batch], b: Sequence[Batch]) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
                                    for x, y in zip(a, b, strict=True))


# -- the schedule itself

def test_the_ramp_is_ffcvs_get_resolution_rounded_half_to_even() -> None:
    """FFCV's ResNet-50 recipe (160 -> 192 over epochs 11-13): 176 px at epoch 12 rounds to
    192 (5.5 steps of 32, half to even); a 160 -> 224 ramp over 4 epochs shows both ways."""
    assert str(SizeSchedule.ramp(160, 192, 11, 13)) == "0=160,12=192"
    assert str(SizeSchedule.ramp(160, 224, 0, 4)) == "0=160,1=192,4=224"
    ramp = SizeSchedule.ramp(128, 256, 2, 10, step=16)
    assert [ramp.size_at(e) for e in range(14)] == [ramp_size(e, 128, 256, 2, 10, 16)
                                                   for e in range(14)]
    assert ramp.size_at(10_000) == 256 and ramp.largest == 256 and ramp.sizes[0] == 128


def test_every_spelling_parses_to_the_one_the_state_records() -> None:
    for text, table in [("160:192@11-13", "0=160,12=192"), ("0=128, 5=160", "0=128,5=160"),
                        ("224", "0=224"), ("160:224@0-4/32", "0=160,1=192,4=224")]:
        s = SizeSchedule.parse(text)
        assert str(s) == table and SizeSchedule.parse(str(s)) == s


@pytest.mark.parametrize("text", ["", "1=160", "0=160,0=192", "0=160,5=0", "192:160@3-3",
                                  "abc", "0=160,3"])
def test_a_schedule_that_is_not_one_is_refused_naming_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match="size schedule"):
        SizeSchedule.parse(text)


def test_a_schedule_needs_rising_epochs_and_changing_sizes() -> None:
    with pytest.raises(ValueError, match="rising epochs"):
        SizeSchedule(((0, 160), (4, 192), (2, 224)))
    with pytest.raises(ValueError, match="size_schedule must be a SizeSchedule"):
        LoaderOptions(batch_size=4, size_schedule="0=160")  # type: ignore[arg-type]
    assert SizeSchedule.table([160, 160, 192, 192]) == SizeSchedule(((0, 160), (2, 192)))


# -- the loader: each epoch at its size

def test_each_epochs_plan_carries_its_size_and_the_options_hold_it_once(data: Path) -> None:
    """The options keep one size: a transform given with a schedule is held at the
    schedule's first size; each epoch's plan carries the epoch's transform (its size), and
    its batch generators are those of the seed, epoch, pool and first position."""
    options = LoaderOptions(batch_size=4, transform=TrainTransform(size=224, flip=False),
                            size_schedule=SCHEDULE)
    assert options.transform == TrainTransform(size=32, flip=False)
    val = LoaderOptions(batch_size=4, transform=ValTransform(size=64, resize=80),
                        size_schedule=SCHEDULE)
    assert val.transform == ValTransform(size=32, crop_ratio=0.8)
    scheduled = loader(data, transform=TrainTransform(size=224, flip=False))
    assert scheduled.output_sizes == (32, 40, 48)
    for epoch in range(5):
        plan = scheduled.plan(epoch)
        assert plan.size == SCHEDULE.size_at(epoch)
        assert plan.transform == TrainTransform(size=plan.size, flip=False)
        first = np.random.default_rng([3, epoch, 0, int(plan.first[1])]).random(4)
        assert np.array_equal(plan.batch_rng(1).random(4), first)
    plain = loader(data, size_schedule=None, transform=ValTransform(size=56, crop_ratio=0.7))
    assert plain.output_sizes == (56,) and plain.plan(7).transform == plain.options.transform


@pytest.mark.parametrize("crop_decode", DECODE_PATHS)
@pytest.mark.parametrize("memory_format", ["contiguous", "channels_last"])
@pytest.mark.parametrize("workers", [0, 2])
def test_each_epoch_is_the_batches_of_a_loader_made_at_its_size(
        data: Path, crop_decode: bool, memory_format: str, workers: int) -> None:
    scheduled = loader(data, workers=workers, memory_format=memory_format,
                       crop_decode=crop_decode)
    for epoch in range(4):
        size = SCHEDULE.size_at(epoch)
        fixed = loader(data, workers=0, memory_format=memory_format, crop_decode=crop_decode,
                       size_schedule=None, transform=TrainTransform(size=size))
        got = run_epoch(scheduled, epoch)
        assert sizes_of(got) == {(3, size, size)}
        assert all(images.is_contiguous(memory_format=torch.channels_last)
                   == (memory_format == "channels_last") for images, _ in got)
        assert same(got, run_epoch(fixed, epoch)), f"epoch {epoch} at {size} px"


def test_the_workers_live_through_size_changes_in_slots_of_the_largest(data: Path) -> None:
    scheduled = loader(data, workers=2)
    assert scheduled._decoder.ring.size == SCHEDULE.largest == 48  # type: ignore[attr-defined]
    run_epoch(scheduled, 0)
    pids = scheduled.worker_pids
    assert sizes_of(run_epoch(scheduled, 1)) == {(3, 48, 48)}
    assert sizes_of(run_epoch(scheduled, 3)) == {(3, 40, 40)}
    assert scheduled.worker_pids == pids and all(pids)


def test_every_rank_makes_the_same_count_at_the_same_size(data: Path) -> None:
    for epoch in range(3):
        runs = [run_epoch(loader(data, w), epoch) for w in ranks(3)]
        assert len({len(r) for r in runs}) == 1
        size = SCHEDULE.size_at(epoch)
        assert {s for r in runs for s in sizes_of(r)} == {(3, size, size)}


@pytest.mark.parametrize("backend", [
    pytest.param("dali", marks=pytest.mark.skipif(
        importlib.util.find_spec("nvidia.dali") is None,
        reason="NVIDIA DALI is not installed (pip install 'imgprep[dali]')")),
    "nvjpeg"])
def test_the_other_backends_follow_the_schedule_and_resume_across_a_size_change(
        data: Path, backend: str) -> None:
    """DALI draws its own crops (docs/dali.md) and nvjpeg resamples on its own
    (docs/nvjpeg.md), so their samples and sizes are the Pillow backend's, not their
    pixels (both on the CPU here)."""
    dali = loader(data, backend=backend, workers=1)
    pillow = loader(data)
    for epoch in range(4):
        got = run_epoch(dali, epoch)
        size = SCHEDULE.size_at(epoch)
        assert sizes_of(got) == {(3, size, size)}
        assert labels_of(got) == labels_of(run_epoch(pillow, epoch))
    dali.set_epoch(1)
    it = iter(dali)
    head = [next(it) for _ in range(3)]
    resumed = loader(data, backend=backend, workers=1)
    resumed.load_state_dict(dali.state_dict())
    rest = list(resumed)
    assert labels_of(head + rest) == labels_of(run_epoch(pillow, 1))
    assert sizes_of(rest) == {(3, 48, 48)}


# -- resume

@pytest.mark.parametrize("crop_decode", DECODE_PATHS)
@pytest.mark.parametrize("workers", [0, 1])
def test_a_resumed_epoch_gives_the_rest_at_its_size_across_a_size_change(
        data: Path, crop_decode: bool, workers: int) -> None:
    """Epoch 0 at 32 px done, epoch 1 (48 px) stopped after 3 batches: a new loader resumed
    from the state makes exactly the uninterrupted run's remaining batches, at 48 px, then
    epoch 2 at 48 and epoch 3 at 40."""
    whole = loader(data, workers=workers, crop_decode=crop_decode)
    first = run_epoch(whole, 0)
    epoch1 = run_epoch(whole, 1)
    later = [run_epoch(whole, e) for e in (2, 3)]
    cut = loader(data, workers=workers, crop_decode=crop_decode)
    assert same(run_epoch(cut, 0), first)
    cut.set_epoch(1)
    it = iter(cut)
    head = [next(it) for _ in range(3)]
    state = cut.state_dict()
    assert state["size_schedule"] == "0=32,1=48,3=40"
    resumed = loader(data, workers=workers, crop_decode=crop_decode)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert same(head + rest, epoch1) and sizes_of(rest) == {(3, 48, 48)}
    assert same(run_epoch(resumed, 2), later[0]) and same(run_epoch(resumed, 3), later[1])
    assert sizes_of(later[1]) == {(3, 40, 40)}


@pytest.mark.parametrize("crop_decode", DECODE_PATHS)
def test_an_elastic_resume_from_3_ranks_on_2_gives_every_remaining_sample_once_at_its_size(
        data: Path, crop_decode: bool) -> None:
    three = [loader(data, w, crop_decode=crop_decode) for w in ranks(3)]
    seen: list[int] = []
    for ld in three:
        ld.set_epoch(1)
        it = iter(ld)
        seen += labels_of([next(it) for _ in range(2)])
    state = three[0].state_dict()
    two = [loader(data, w, crop_decode=crop_decode) for w in ranks(2)]
    for ld in two:
        ld.load_state_dict(state)
    rest = [list(ld) for ld in two]
    assert len(rest[0]) == len(rest[1])  # equal batches on the new World
    done = sorted(seen + [x for r in rest for x in labels_of(r)])
    whole = sorted(labels_of(run_epoch(loader(data), 1)))  # tail="drop": the epoch's samples
    assert len(set(seen)) == len(seen) and done == whole
    assert {s for r in rest for s in sizes_of(r)} == {(3, 48, 48)}
    assert [ld.state_dict()["size_schedule"] for ld in two] == ["0=32,1=48,3=40"] * 2


def test_a_resume_with_another_schedule_or_none_is_refused_naming_both(data: Path) -> None:
    ld = loader(data)
    ld.set_epoch(1)
    next(iter(ld))
    state = ld.state_dict()
    other = loader(data, size_schedule=SizeSchedule.ramp(32, 64, 0, 2))
    with pytest.raises(LoaderError, match=r"schedule '0=32,1=48,3=40', this loader has "
                                          r"'0=32,1=64'"):
        other.load_state_dict(state)
    with pytest.raises(LoaderError, match="this loader has none"):
        loader(data, size_schedule=None).load_state_dict(state)
    plain = loader(data, size_schedule=None)
    assert "size_schedule" not in plain.state_dict()
    with pytest.raises(LoaderError, match="written with size schedule none"):
        loader(data).load_state_dict(plain.state_dict())


# -- the DCT scale at every size

@pytest.mark.parametrize("size", SizeSchedule.ramp(128, 256, 0, 4).sizes + (32, 48))
def test_the_dct_scale_is_the_largest_that_keeps_the_crop_at_least_the_size(size: int) -> None:
    """Per image and draw, at each size of a schedule: the crop decoded at the scale the
    draft picks is at least ``size`` px both ways (or the scale is 1: a crop smaller than
    ``size`` is upsampled from full resolution), and at twice that scale it would be under
    ``size + 1`` px one way (the draft's rounding up is the one pixel)."""
    t = TrainTransform().at_size(size)
    rng = np.random.default_rng(size)
    scales = set()
    for w, h in [(500, 375), (256, 256), (1200, 900), (333, 500), (4000, 3000), (2048, 300)]:
        for _ in range(50):
            g = t.geometry(w, h, rng)
            assert g.draft is not None and g.box is not None and g.resize == (size, size)
            scale = jpegcrop.draft_scale(w, h, g.draft)
            cw, ch = g.box[2] - g.box[0], g.box[3] - g.box[1]
            assert scale == 1 or (cw / scale >= size and ch / scale >= size)
            if scale < 8:
                assert min(cw / (2 * scale), ch / (2 * scale)) < size + 1
            scales.add(scale)
    assert len(scales) >= 2  # the draws reach more than one scale


# -- validation: size and crop ratio

def test_the_val_transform_takes_a_crop_ratio_or_a_resize() -> None:
    assert ValTransform() == ValTransform(size=224, resize=256) == ValTransform(crop_ratio=0.875)
    assert ValTransform(size=256, crop_ratio=0.875).resize == round(256 / 0.875) == 293
    assert ValTransform(size=192, resize=256).crop_ratio == 0.75
    assert ValTransform(size=192, resize=256).at_size(160).resize == round(160 / 0.75)
    with pytest.raises(ValueError, match="give one of them"):
        ValTransform(size=224, resize=240, crop_ratio=0.875)
    with pytest.raises(ValueError, match=r"crop_ratio must be in \(0, 1\]"):
        ValTransform(crop_ratio=1.5)


@pytest.mark.parametrize("workers", [0, 1])
def test_validation_at_its_own_size_and_ratio_sees_every_sample_once(data: Path,
                                                                      workers: int) -> None:
    val = ValTransform(size=56, crop_ratio=0.7)
    batches = run_epoch(loader(data, split="val", workers=workers, transform=val,
                               size_schedule=None), 0)
    assert sorted(x for x in labels_of(batches) if x >= 0) == list(range(TOTAL))
    assert sizes_of(batches) == {(3, 56, 56)} and val.resize == math.floor(56 / 0.7 + 0.5)
