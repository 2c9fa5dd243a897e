"""How batches are handed over. Channels-last batches (``memory_format="channels_last"``):
the contiguous loader's values, NCHW-shaped with ``torch.channels_last`` strides, from both
loaders, with or without worker processes, for every tail (padding rows zero), with stand-ins
for undecodable samples, and across resume (same World and elastic); ``normalize`` and
``DeviceLoader`` keep them channels_last without transposing them. In-place batches
(``loader.in_place()``): the copied batches' values and every loader promise (resume, elastic
resume, an abandoned pass, on_error, a killed worker), each batch left alone while held and
rewritten once later batches are asked for; ``DeviceLoader`` on the CPU takes them so. Samples
include a grayscale, a CMYK and a PNG image, which the sample decoder's Pillow path writes
(the others take the crop-aware JPEG path where it is built)."""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from imgprep.job.world import World
from loaders import (
    PAD_LABEL,
    DeviceLoader,
    LabelListLoader,
    LoaderError,
    LoaderOptions,
    ShardLoader,
    TrainTransform,
    ValTransform,
    normalize,
)
from loaders.base import PlannedLoader
from loaders.epochs import TAILS
from loaders.ring import Ring
from tests.support import encode, jpeg
from tests.support.images import photo
from tests.support.shards import UNEQUAL_SIZES, run_epoch, write_label_list, write_split

TOTAL = sum(UNEQUAL_SIZES)  # 57 samples, label = sample id
BAD = 20  # the sample the damaged set cannot decode
BATCH = 4
SMALL = {"train": TrainTransform(size=32), "val": ValTransform(size=32)}

Batch = tuple[torch.Tensor, torch.Tensor]


def image(i: int) -> bytes:
    """Sample ``i``: mostly RGB JPEGs; a grayscale JPEG, a CMYK JPEG and a PNG among them."""
    if i == 5:
        return jpeg((256, 256), seed=i, mode="L")
    if i == 9:
        return jpeg((256, 256), seed=i, mode="CMYK")
    if i == 13:
        return encode(photo((256, 256), i), "PNG")
    return jpeg((256, 256), seed=i)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Shards (train and val) and a list of the same samples, and a damaged copy of each."""
    out = {}
    for name, pick in (("good", image), ("damaged", lambda i: b"not an image" if i == BAD
                                         else image(i))):
        shards = tmp_path_factory.mktemp(f"shards-{name}")
        for split in ("train", "val"):
            write_split(shards, split, UNEQUAL_SIZES, pick)
        out[f"shards-{name}"] = shards
        out[f"list-{name}"] = write_label_list(tmp_path_factory.mktemp(f"list-{name}"),
                                               TOTAL, pick)
    return out


def make(folders: dict[str, Path], source: str, split: str = "train", damaged: bool = False,
         world: World | None = None, **kw: Any) -> PlannedLoader:
    options = LoaderOptions(**{"batch_size": BATCH, "transform": SMALL[split], "workers": 2}
                            | kw)
    world = world or World()
    if source == "shards":
        return ShardLoader(folders[f"shards-{'damaged' if damaged else 'good'}"], split,
                           world, options)
    return LabelListLoader(folders[f"list-{'damaged' if damaged else 'good'}"], world,
                           options, train=split == "train")


def both(folders: dict[str, Path], source: str, **kw: Any
         ) -> tuple[PlannedLoader, PlannedLoader]:
    """The contiguous and the channels_last loader of the same options."""
    return (make(folders, source, **kw),
            make(folders, source, memory_format="channels_last", **kw))


def assert_same(contiguous: list[Batch], channels_last: list[Batch]) -> None:
    assert len(channels_last) == len(contiguous) > 0
    for (a, la), (b, lb) in zip(contiguous, channels_last, strict=True):
        assert a.is_contiguous() and b.shape == a.shape and b.dtype == torch.uint8
        assert b.is_contiguous(memory_format=torch.channels_last)
        assert b.stride() == (a.shape[1] * a.shape[2] * a.shape[3], 1,
                              a.shape[1] * a.shape[3], a.shape[1])  # N, C, H, W over NHWC
        assert torch.equal(a, b) and torch.equal(la, lb)


# ---------------------------------------------------------------------------- the batches


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("source", ["shards", "list"])
@pytest.mark.parametrize("split", ["train", "val"])
def test_channels_last_batches_equal_the_contiguous_ones(folders: dict[str, Path], source: str,
                                                         split: str, workers: int) -> None:
    a, b = both(folders, source, split=split, workers=workers, seed=7)
    for epoch in (0, 1):
        assert_same(run_epoch(a, epoch), run_epoch(b, epoch))


@pytest.mark.parametrize("tail", TAILS)
def test_every_tail_and_its_padding_are_the_contiguous_loaders(folders: dict[str, Path],
                                                               tail: str) -> None:
    world = World(rank=1, world_size=2, local_rank=1, local_world_size=2, node_rank=0, num_nodes=1)
    a, b = both(folders, "shards", world=world, tail=tail, batch_size=5)
    want, got = run_epoch(a, 0), run_epoch(b, 0)
    assert_same(want, got)
    if tail == "pad":
        images, labels = got[-1]
        assert (labels == PAD_LABEL).any() and not images[labels == PAD_LABEL].any()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("source", ["shards", "list"])
def test_stand_ins_for_undecodable_samples_are_the_contiguous_loaders(
        folders: dict[str, Path], source: str, workers: int) -> None:
    a, b = both(folders, source, damaged=True, on_error="skip", workers=workers, tail="pad",
                shuffle=False)
    want, got = run_epoch(a, 0), run_epoch(b, 0)
    assert_same(want, got)
    assert a.skipped == b.skipped == 1
    assert BAD not in [int(x) for _, labels in got for x in labels]


def test_resume_and_elastic_resume_are_the_contiguous_loaders(folders: dict[str, Path]
                                                               ) -> None:
    two = [World(rank=r, world_size=2, local_rank=r, local_world_size=2, node_rank=0,
                 num_nodes=1) for r in range(2)]
    a, b = both(folders, "shards", world=two[0], tail="short")
    a.set_epoch(1)
    b.set_epoch(1)
    for loader in (a, b):
        it = iter(loader)
        for _ in range(3):
            next(it)
    state = b.state_dict()
    assert state == a.state_dict()
    for world in (two[0], World()):  # the same World, then one rank (elastic)
        again = both(folders, "shards", world=world, tail="short")
        for loader in again:
            loader.load_state_dict(state)
        assert_same(list(again[0]), list(again[1]))


def test_without_workers_the_rows_are_decoded_channels_last_not_transposed(
        folders: dict[str, Path]) -> None:
    """The batch is a view of an N x H x W x 3 array: its storage is the rows themselves."""
    b = make(folders, "shards", workers=0, memory_format="channels_last")
    images, _ = next(iter(b))
    nhwc = images.permute(0, 2, 3, 1)
    assert nhwc.is_contiguous() and nhwc.data_ptr() == images.data_ptr()


# ---------------------------------------------------------------------------- the device side


def test_normalize_keeps_channels_last_input_without_a_transpose() -> None:
    x = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    mean = torch.tensor([0.4, 0.5, 0.6]).view(1, 3, 1, 1)
    std = torch.tensor([0.2, 0.25, 0.3]).view(1, 3, 1, 1)
    ref = normalize(x, mean, std)
    last = x.contiguous(memory_format=torch.channels_last)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y = normalize(last, mean, std)
    assert "aten::clone" not in {e.name for e in prof.events()}  # no layout change
    assert y.is_contiguous(memory_format=torch.channels_last) and torch.equal(y, ref)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        normalize(x, mean, std)
    assert "aten::clone" in {e.name for e in prof.events()}  # contiguous input: as before
    flat = normalize(last, mean, std, channels_last=False)
    assert flat.is_contiguous() and torch.equal(flat, ref)
    assert torch.equal(last, x)  # the input is left as it was
    with pytest.raises(ValueError, match="floating point"):
        normalize(x, mean, std, dtype=torch.uint8)


@pytest.mark.parametrize("memory_format", ["contiguous", "channels_last"])
def test_device_loader_on_cpu_gives_the_same_channels_last_floats(folders: dict[str, Path],
                                                                 memory_format: str) -> None:
    contiguous = make(folders, "shards")
    want = [normalize(x, *stats(contiguous)) for x, _ in run_epoch(contiguous, 0)]
    loader = make(folders, "shards", memory_format=memory_format)
    loader.set_epoch(0)
    got = [x for x, _ in DeviceLoader(loader, "cpu", loader.mean, loader.std)]
    assert len(got) == len(want)
    assert all(g.is_contiguous(memory_format=torch.channels_last) and torch.equal(g, w)
               for g, w in zip(got, want, strict=True))
    with pytest.raises(ValueError, match="floating point"):
        DeviceLoader(loader, "cpu", loader.mean, loader.std, dtype=torch.int32)


def stats(loader: PlannedLoader) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.tensor(loader.mean).view(1, 3, 1, 1),
            torch.tensor(loader.std).view(1, 3, 1, 1))



# ---------------------------------------------------------------------------- in place


def in_place_epoch(loader: PlannedLoader, epoch: int | None = None) -> list[Batch]:
    """Every batch of a pass taken in place, each cloned before the next is asked for."""
    if epoch is not None:
        loader.set_epoch(epoch)
    stated = len(loader)
    out = [(images.clone(), labels) for images, labels in loader.in_place()]
    assert len(out) == stated
    return out


def same(a: list[Batch], b: list[Batch]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) and torch.equal(lx, ly)
                                    for (x, lx), (y, ly) in zip(a, b, strict=True))


@pytest.mark.parametrize("memory_format", ["contiguous", "channels_last"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("source", ["shards", "list"])
def test_in_place_batches_are_the_copied_ones(folders: dict[str, Path], source: str,
                                              workers: int, memory_format: str) -> None:
    loader = make(folders, source, workers=workers, memory_format=memory_format, tail="pad")
    for epoch in (0, 1):
        copied = run_epoch(loader, epoch)
        got = in_place_epoch(loader, epoch)
        assert same(copied, got) and len(got) > 0
        assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (epoch, len(got))


def test_a_held_batch_is_left_alone_and_rewritten_once_later_ones_are_asked_for(
        folders: dict[str, Path]) -> None:
    """One worker, rings of 3: while a batch is held its slot stays as it was however long the
    worker runs ahead; once later batches are asked for, the slot holds a later batch."""
    loader = make(folders, "shards", workers=1, prefetch_factor=1)
    copied = run_epoch(loader, 0)
    loader.set_epoch(0)
    it = loader.in_place()
    first, labels = next(it)
    time.sleep(0.5)  # the worker decodes what it may meanwhile
    assert torch.equal(first, copied[0][0]) and torch.equal(labels, copied[0][1])
    rest = [(images.clone(), lab) for images, lab in it]
    assert same(copied[1:], rest)
    assert not torch.equal(first, copied[0][0])  # documented: the view is stale by now
    assert torch.equal(labels, copied[0][1])  # labels are the batch's own


def test_in_place_keeps_state_dict_resume_and_elastic_resume(folders: dict[str, Path]) -> None:
    two = [World(rank=r, world_size=2, local_rank=r, local_world_size=2, node_rank=0,
                 num_nodes=1) for r in range(2)]
    whole = run_epoch(make(folders, "shards", world=two[1], tail="short"), 1)
    loader = make(folders, "shards", world=two[1], tail="short")
    loader.set_epoch(1)
    it = loader.in_place()
    head = [(images.clone(), labels) for images, labels in itertools.islice(it, 3)]
    state = loader.state_dict()
    assert state["batch"] == 3 and same(head, whole[:3])
    fresh = make(folders, "shards", world=two[1], tail="short")
    fresh.load_state_dict(state)
    assert same(in_place_epoch(fresh), whole[3:])
    for world in (World(), two[0]):  # elastic: one rank; and rank 0 of the same World
        copied, placed = (make(folders, "shards", world=world, tail="short") for _ in "ab")
        copied.load_state_dict(state)
        placed.load_state_dict(state)
        assert same(list(copied), in_place_epoch(placed))


def test_an_abandoned_in_place_pass_leaves_the_next_pass_whole(folders: dict[str, Path]
                                                                ) -> None:
    """Breaking out while holding a batch (the workers' rings full, prefetch 1), then passes
    in place and copied, give the whole epoch again."""
    loader = make(folders, "shards", workers=2, prefetch_factor=1)
    whole = run_epoch(loader, 0)
    for _ in range(2):
        loader.set_epoch(0)
        it = loader.in_place()
        next(it)
        next(it)
        time.sleep(0.3)
        del it
        assert same(in_place_epoch(loader, 0), whole)
        assert same(run_epoch(loader, 0), whole)


@pytest.mark.parametrize("source", ["shards", "list"])
def test_in_place_keeps_the_error_rule(folders: dict[str, Path], source: str) -> None:
    skip = make(folders, source, damaged=True, on_error="skip", tail="pad")
    assert same(in_place_epoch(skip, 0), run_epoch(skip, 0)) and skip.skipped == 1
    strict = make(folders, source, damaged=True, tail="pad", shuffle=False)
    with pytest.raises(LoaderError, match=f"{BAD}"):
        in_place_epoch(strict, 0)


def test_in_place_names_a_killed_worker(folders: dict[str, Path]) -> None:
    loader = make(folders, "shards", workers=2, batch_size=2)
    with pytest.raises(LoaderError, match=r"worker 1 \(pid \d+, making batch \d+ from "):
        for i, _ in enumerate(loader.in_place()):
            if i == 1:
                os.kill(loader.worker_pids[1], signal.SIGKILL)


def test_device_loader_on_the_cpu_takes_batches_in_place(folders: dict[str, Path],
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    loader = make(folders, "shards", memory_format="channels_last")
    want = [normalize(x, *stats(loader)) for x, _ in run_epoch(loader, 0)]

    def no_copy(*args: Any) -> None:
        raise AssertionError("DeviceLoader on the CPU copied a batch out of the ring")

    monkeypatch.setattr(Ring, "take", no_copy)
    loader.set_epoch(0)
    got = [x for x, _ in DeviceLoader(loader, "cpu", loader.mean, loader.std)]
    assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want,
                                                                           strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize("memory_format", ["contiguous", "channels_last"])
def test_device_loader_on_cuda_copies_from_page_locked_slots_with_the_cpu_values(
        folders: dict[str, Path], monkeypatch: pytest.MonkeyPatch, memory_format: str) -> None:
    """On CUDA the batches go to the GPU straight from the workers' page-locked shared memory
    (never copied out on the CPU), with small slots that workers rewrite quickly: two
    epochs equal the CPU normalisation of the copied batches, batch for batch."""
    loader = make(folders, "shards", memory_format=memory_format)
    want = [[normalize(x, *stats(loader)) for x, _ in run_epoch(loader, e)] for e in (0, 1)]

    def no_copy(*args: Any) -> None:
        raise AssertionError("DeviceLoader on CUDA copied a batch out of the ring")

    monkeypatch.setattr(Ring, "take", no_copy)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        got = [x.cpu() for x, _ in DeviceLoader(loader, "cuda", loader.mean, loader.std)]
        assert loader.page_locked and len(got) == len(want[epoch])
        assert all(torch.equal(g, w) for g, w in zip(got, want[epoch], strict=True))
