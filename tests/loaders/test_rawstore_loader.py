"""The shard loader over stored pixels (``--store yuv420``, ``rgb``, ``mixed``): every loader
promise holds (plans and tails, exact and elastic resume, both layouts, workers 0, 1 and 2
byte-identical), the batches are the JPEG set's where its decode is at DCT scale 1, the
pixel version records the store, and what cannot read stored pixels is refused by name."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from imgprep import jpegcrop
from imgprep.job.world import World
from imgprep.shards.manifest import read_manifest
from loaders import LoaderOptions
from loaders.epochs import TAILS
from loaders.errors import LoaderError
from loaders.shards import PAD_LABEL, ShardLoader
from loaders.transforms import TrainTransform, ValTransform
from tests.support.backends import BATCH, SMALL_TRAIN, TOTAL, worlds
from tests.support.rawstore import stored_sets
from tests.support.shards import run_epoch

pytestmark = pytest.mark.skipif(not jpegcrop.AVAILABLE, reason="stored pixels need the "
                                "extension")
Batch = tuple[torch.Tensor, torch.Tensor]


@pytest.fixture(scope="module")
def sets(shards: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Read-only: the 57 samples (label = sample id) as JPEGs and stored every way."""
    return stored_sets(shards, tmp_path_factory.mktemp("stored"))


def make(folder: Path, world: World | None = None, split: str = "train", **kw: Any
         ) -> ShardLoader:
    given = {"batch_size": BATCH, "workers": 0, "transform": SMALL_TRAIN} | kw
    return ShardLoader(folder, split, world or World(), LoaderOptions(**given))


def same(a: Sequence[Batch], b: Sequence[Batch]) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
                                    for x, y in zip(a, b, strict=True))


def labels(batches: Sequence[Batch]) -> list[list[int]]:
    return [b.tolist() for _, b in batches]


@pytest.mark.parametrize("transform", [TrainTransform(size=224), ValTransform(size=224)],
                         ids=["train224", "val224"])
def test_batches_are_the_jpeg_sets_at_dct_scale_one(sets: dict[str, Path],
                                                    transform: Any) -> None:
    """On 256 px images every 224 px crop decodes at DCT scale 1: stored pixels give the JPEG
    set's batches byte for byte, whatever the store."""
    want = run_epoch(make(sets["jpeg"], transform=transform, batch_size=8), 1)
    for mode in ("yuv420", "rgb", "mixed"):
        assert same(run_epoch(make(sets[mode], transform=transform, batch_size=8), 1), want), mode


@pytest.mark.parametrize("mode", ["yuv420", "mixed"])
def test_workers_and_layouts_give_the_same_batches(sets: dict[str, Path], mode: str) -> None:
    """Workers 0, 1 and 2 byte-identical; channels-last batches hold the same values."""
    runs = [run_epoch(make(sets[mode], workers=w), 2) for w in (0, 1, 2)]
    assert same(runs[0], runs[1]) and same(runs[0], runs[2])
    last = run_epoch(make(sets[mode], workers=2, memory_format="channels_last"), 2)
    assert same([(x.contiguous(), y) for x, y in last], runs[0])


@pytest.mark.parametrize("tail", TAILS)
def test_plans_and_tails_are_the_jpeg_sets(sets: dict[str, Path], tail: str) -> None:
    """Three ranks: each its JPEG twin's batches of labels (one plan), every tail's promise:
    the same batch count on every rank (uneven: within one) and every sample seen."""
    for mode in ("yuv420", "mixed"):
        per_rank = []
        for w in worlds(1, 3):
            got = run_epoch(make(sets[mode], w, tail=tail), 1)
            assert labels(got) == labels(run_epoch(make(sets["jpeg"], w, tail=tail), 1))
            per_rank.append(got)
        counts = [len(b) for b in per_rank]
        assert max(counts) - min(counts) <= (1 if tail == "uneven" else 0)
        real = [x for b in per_rank for row in labels(b) for x in row if x != PAD_LABEL]
        assert len(real) == len(set(real))
        if tail != "drop":
            assert sorted(real) == list(range(TOTAL))


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume_gives_the_uninterrupted_epoch(sets: dict[str, Path],
                                                    workers: int) -> None:
    full = run_epoch(make(sets["yuv420"], workers=workers), 3)
    loader = make(sets["yuv420"], workers=workers)
    loader.set_epoch(3)
    before = []
    for batch in loader:
        before.append(batch)
        if len(before) == 4:
            break
    state = loader.state_dict()
    target = make(sets["yuv420"], workers=workers)
    target.load_state_dict(state)
    assert same(before + list(target), full)


def test_elastic_resume_sees_every_remaining_sample_once(sets: dict[str, Path]) -> None:
    """Stop after 2 steps on 3 ranks, resume on 2 from rank 0's state: every sample once."""
    seen: list[int] = []
    first = [make(sets["mixed"], w, tail="short") for w in worlds(1, 3)]
    for loader in first:
        loader.set_epoch(1)
        seen += [x for _, b in zip(range(2), loader, strict=False) for x in b[1].tolist()]
    state = first[0].state_dict()
    for w in worlds(1, 2):
        loader = make(sets["mixed"], w, tail="short")
        loader.load_state_dict(state)
        seen += [x for _, b in loader for x in b.tolist()]
    assert sorted(seen) == list(range(TOTAL))


def test_pixel_version_records_the_store(sets: dict[str, Path]) -> None:
    jpeg, yuv = make(sets["jpeg"]), make(sets["yuv420"])
    assert yuv.pixels == f"{jpeg.pixels}+yuv420"
    jpeg.set_epoch(0)
    next(iter(jpeg))
    with pytest.raises(LoaderError, match="pixel version"):
        yuv.load_state_dict(jpeg.state_dict())


def test_what_cannot_read_stored_pixels_is_refused(sets: dict[str, Path]) -> None:
    with pytest.raises(LoaderError, match="crop_decode=None"):
        make(sets["yuv420"], crop_decode=False)
    for backend in ("dali", "nvjpeg"):
        with pytest.raises(LoaderError, match="backend='pillow'"):
            make(sets["mixed"], backend=backend)


def test_a_damaged_record_names_its_shard_and_key(sets: dict[str, Path],
                                                  tmp_path: Path) -> None:
    """A record whose header no longer fits its length fails before any pixel is read, as
    a SampleError under the loader's on_error rule."""
    copy = shutil.copytree(sets["yuv420"], tmp_path / "copy")
    shard = copy / read_manifest(copy, "train").shards[0].name
    data = bytearray(shard.read_bytes())
    at = data.index(b"IPXL")
    data[at + 8] ^= 0x01  # the width
    shard.write_bytes(bytes(data))
    with pytest.raises(LoaderError, match=r"train-000000\.tar: sample .*cut short or padded"):
        run_epoch(make(copy, shuffle=False), 0)
    skipping = make(copy, shuffle=False, on_error="skip")
    assert len(run_epoch(skipping, 0)) == len(make(copy, shuffle=False))
    assert skipping.skipped == 1
