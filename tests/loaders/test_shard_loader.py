"""The shard loader (``loaders.shards``): equal batches, coverage, order, resume (elastic too).

Shards here are written directly with ``ShardWriter`` in UNEQUAL sizes (3, 7, 12, 5, 9, 4, 11,
6 samples: unequal shards are what make naive per-rank splits hang DDP), every sample a
256x256 JPEG whose label is its sample id (0..56), so coverage is checked from labels alone.

Most cases build explicit Worlds for every rank of a job in ONE process (``workers=0`` and
``workers=2``) and check, per epoch: equal batch counts stated before iterating, coverage
(drop: full batches only, no duplicates, only what cannot fill a step left out;
short/pad/uneven: every sample exactly once, padding labelled ``PAD_LABEL`` with zero pixels;
the label-list loader keeps the same promises over the same samples), order (per epoch, per
seed, reproducible), mid-epoch resume on the same World and on another (the state counts
samples of the epoch's order), output format, worker RNG streams, partition and replicate
node-local folders made by ``stage_to_node``, damaged shards, and the tar reader against
``tarfile`` and ``webdataset``.
The ``slow`` cases run real Gloo process groups that all-reduce every step, so unequal batch
counts would hang (and time out) instead of passing.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

from imgprep import resample
from imgprep.convert.options import ConvertOptions
from imgprep.convert.run import convert
from imgprep.errors import WorldError
from imgprep.job.world import World
from imgprep.shards.manifest import read_manifest, write_manifest
from imgprep.shards.tario import iter_members, iter_samples
from imgprep.shards.writers import ShardWriter
from imgprep.stage.options import StageOptions
from imgprep.stage.run import stage_to_node
from loaders import LoaderOptions
from loaders.epochs import TAILS, pools
from loaders.labellist import LabelListLoader
from loaders.order import ORDER_KEY
from loaders.shards import PAD_LABEL, LoaderError, ShardLoader
from loaders.transforms import TrainTransform, ValTransform, into_chw
from tests.support import free_port, jpeg
from tests.support.shards import UNEQUAL_SIZES, key_of, run_epoch, write_split

SIZES = UNEQUAL_SIZES
TOTAL = sum(SIZES)  # 57 samples; sample id == label == index into the class table
BATCH = 3
SMALL_TRAIN = TrainTransform(size=32)
SMALL_VAL = ValTransform(size=32)  # shards hold 256 px images: center 32 px crop
EPOCHS = (0, 1, 2)
LAYOUTS = {"1x2": (1, 2), "2x2": (2, 2), "1x3": (1, 3), "2x1": (2, 1)}  # nodes x local ranks
MODES = ("replicate", "partition")
PROC_TIMEOUT = 120.0

Batch = tuple[torch.Tensor, torch.Tensor]


# ---------------------------------------------------------------------------- data


@dataclass(frozen=True)
class ShardData:
    """A folder with a ``train`` and a ``val`` split of the same samples in unequal shards."""

    folder: Path
    ids: dict[str, list[int]]  # shard file name -> sample ids (= labels) in it, in order
    jpegs: dict[int, bytes]  # sample id -> the JPEG stored for it

    def shard_of(self, sample: int, split: str = "train") -> str:
        return next(n for n, ids in self.ids.items() if n.startswith(split) and sample in ids)




@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> ShardData:
    """Read-only: tests that damage shards work on ``damaged``."""
    folder = tmp_path_factory.mktemp("shards")
    jpegs = {i: jpeg((256, 256), seed=i) for i in range(TOTAL)}
    ids = write_split(folder, "train", SIZES, jpegs.__getitem__)
    ids |= write_split(folder, "val", SIZES, jpegs.__getitem__)
    return ShardData(folder, ids, jpegs)


@pytest.fixture(scope="module")
def same_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 samples in 4 shards, all holding the SAME JPEG: any difference between two output
    images comes from the augmentation's random draws alone."""
    folder = tmp_path_factory.mktemp("same")
    one = jpeg((256, 256), seed=99)
    write_split(folder, "train", (6, 6, 6, 6), lambda i: one)
    return folder


@pytest.fixture
def damaged(data: ShardData, tmp_path: Path) -> ShardData:
    """A private copy of ``data`` to break."""
    folder = tmp_path / "copy"
    shutil.copytree(data.folder, folder)
    return replace(data, folder=folder)


@pytest.fixture(scope="module")
def nodes(data: ShardData, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """``data`` staged in partition mode onto two simulated nodes' local folders."""
    root = tmp_path_factory.mktemp("nodes")
    dirs = [root / f"node{k}" for k in range(2)]
    for k, dst in enumerate(dirs):
        stage_to_node(StageOptions(src=data.folder, dst=dst, mode="partition", jobs=1),
                      World().with_nodes(2, k))
        for split in ("train", "val"):  # the index travels with the shards
            index = read_manifest(dst, split).index
            if index is not None and not (dst / index.name).exists():
                shutil.copy2(data.folder / index.name, dst / index.name)
    return dirs


# ---------------------------------------------------------------------------- helpers


def layout(nodes: int, local: int) -> list[World]:
    """Every rank of a job with ``nodes`` x ``local`` ranks, block placement."""
    return [World(rank=r, world_size=nodes * local, local_rank=r % local, local_world_size=local,
                  node_rank=r // local, num_nodes=nodes)
            for r in range(nodes * local)]


def labels_of(batches: Sequence[Batch]) -> list[int]:
    return [int(x) for _, labels in batches for x in labels]


def images_of(batches: Sequence[Batch]) -> torch.Tensor:
    return torch.cat([images for images, _ in batches]) if batches else torch.empty(0)


def same_batches(a: Sequence[Batch], b: Sequence[Batch]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b, strict=True))


def center_crop(data: bytes, size: int) -> np.ndarray:
    """What the val transform must give for a 256 px image: a numpy center crop, CHW."""
    arr = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    top, left = (arr.shape[0] - size) // 2, (arr.shape[1] - size) // 2
    return arr[top:top + size, left:left + size].transpose(2, 0, 1)


def member(shard: Path, name: str) -> tarfile.TarInfo:
    with tarfile.open(shard) as tf:
        return tf.getmember(name)


def xor_bytes(path: Path, offset: int, count: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        chunk = f.read(count)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in chunk))


def batches_sizes(batches: Sequence[Batch]) -> list[int]:
    return [len(labels) for _, labels in batches]


def position(loader: ShardLoader) -> dict[str, int]:
    """The epoch and batch of ``state_dict()`` (which also holds the samples done)."""
    state = loader.state_dict()
    return {"epoch": state["epoch"], "batch": state["batch"]}


def reads(loader: ShardLoader, name: str, epoch: int = 0) -> bool:
    """Whether the loader's rank reads shard ``name`` in ``epoch`` (from its plan)."""
    i = loader.shards.names.index(name)
    return any(i in shards for shards in loader.plan(epoch).worker_shards)


def rank_totals(loaders: Sequence[ShardLoader], epoch: int) -> list[int]:
    """Each rank's planned samples in ``epoch`` (before batching)."""
    return [sum(loader.plan(epoch).worker_samples) for loader in loaders]


# ---------------------------------------------------------------------------- counts, coverage


@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_counts_and_coverage(data: ShardData, name: str, mode: str, workers: int,
                             tail: str) -> None:
    """Equal counts stated before the epoch and kept; drop yields full batches only and
    leaves out only what cannot fill a step of every pool; short, pad and uneven show every
    sample exactly once across ranks."""
    worlds = layout(*LAYOUTS[name])
    loaders = [ShardLoader(data.folder, "train", w,
                           LoaderOptions(batch_size=BATCH, workers=workers, tail=tail,
                                         transform=SMALL_TRAIN), mode=mode) for w in worlds]
    for epoch in EPOCHS:
        for loader in loaders:
            loader.set_epoch(epoch)
        stated = [len(loader) for loader in loaders]  # before any rank iterates
        if tail != "uneven":
            assert len(set(stated)) == 1, f"epoch {epoch}: unequal counts {stated}"
        totals = rank_totals(loaders, epoch)
        if tail != "drop":
            assert sum(totals) == TOTAL  # every sample planned for exactly one rank
        per_rank = [run_epoch(loader, epoch) for loader in loaders]
        labels: list[int] = []
        for r, batches in enumerate(per_rank):
            assert len(batches) == stated[r]
            for images, lab in batches:
                assert images.dtype == torch.uint8 and lab.dtype == torch.int64
                assert images.shape[1:] == (3, 32, 32) and images.shape[0] == lab.shape[0]
                if tail in ("short", "uneven"):
                    assert 1 <= lab.shape[0] <= BATCH
                else:
                    assert lab.shape[0] == BATCH
                pad = lab == PAD_LABEL
                assert not images[pad].any(), "padding slots must be zero pixels"
                assert all(images[i].any() for i in torch.nonzero(~pad).flatten().tolist())
            real = [x for x in labels_of(batches) if x != PAD_LABEL]
            if tail != "drop":
                assert len(real) == totals[r], f"rank {r} saw {len(real)} of {totals[r]}"
            labels += labels_of(batches)
        real = [x for x in labels if x != PAD_LABEL]
        assert len(set(real)) == len(real), f"epoch {epoch}: a sample was seen twice"
        assert set(real) <= set(range(TOTAL))
        if tail == "drop":
            assert PAD_LABEL not in labels
            # Full steps only: each pool (the set, or a node's shards) gives every step its
            # ranks x BATCH samples, as many steps as the smallest pool fills.
            sizes = [len(p) for p in pools(SIZES, worlds[0].num_nodes, mode, 0)]
            group = worlds[0].local_world_size if mode == "partition" else len(worlds)
            steps = min(n // (group * BATCH) for n in sizes)
            assert stated[0] == steps and len(real) == len(sizes) * steps * group * BATCH
        else:
            assert sorted(real) == list(range(TOTAL)), f"epoch {epoch}: not exact"
            pads = labels.count(PAD_LABEL)
            if tail == "pad":
                assert pads == len(worlds) * stated[0] * BATCH - TOTAL
            else:
                assert pads == 0


@pytest.fixture(scope="module")
def listed_data(data: ShardData, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``data``'s samples as a label list: ``img/<id>.jpg <id>``, the same JPEG bytes."""
    folder = tmp_path_factory.mktemp("listed")
    (folder / "img").mkdir()
    for i, jpg in data.jpegs.items():
        (folder / "img" / f"{i}.jpg").write_bytes(jpg)
    (folder / "train.txt").write_text("".join(f"img/{i}.jpg {i}\n" for i in range(TOTAL)))
    return folder / "train.txt"


def both_loaders(data: ShardData, listed: Path, world: World, tail: str
                 ) -> dict[str, ShardLoader | LabelListLoader]:
    return {"shards": ShardLoader(data.folder, "train", world,
                                  LoaderOptions(batch_size=BATCH, workers=0, tail=tail,
                                                transform=SMALL_TRAIN)),
            "list": LabelListLoader(listed, world,
                                    LoaderOptions(batch_size=BATCH, workers=0, tail=tail,
                                                  transform=SMALL_TRAIN))}


@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("ranks", [3, 4])
def test_both_loaders_keep_each_tails_promise(data: ShardData, listed_data: Path, ranks: int,
                                              tail: str) -> None:
    """The shard and label-list loaders over the same 57 samples, 3 or 4 ranks x batch 3:
    every rank the same number of batches (uneven: within one); drop: every batch full, the
    epoch's samples all but the TOTAL % (ranks x BATCH) that cannot fill a step; short:
    every sample exactly once, full batches then runs within one of each other; pad: full
    batches, every sample at least once, the rest padding; uneven: every sample once. Both
    loaders yield the same batches (one plan, one augmentation stream)."""
    per_loader: dict[str, list[list[Batch]]] = {"shards": [], "list": []}
    for w in layout(1, ranks):
        for name, loader in both_loaders(data, listed_data, w, tail).items():
            per_loader[name].append(run_epoch(loader, 1))
    for name, per_rank in per_loader.items():
        counts = [len(b) for b in per_rank]
        assert max(counts) - min(counts) <= (1 if tail == "uneven" else 0), (name, counts)
        sizes = np.array([batches_sizes(b) for b in per_rank]) if tail != "uneven" else None
        labels = [x for b in per_rank for x in labels_of(b)]
        real = [x for x in labels if x != PAD_LABEL]
        assert len(real) == len(set(real)), f"{name}: a sample twice"
        if tail == "drop":
            assert sizes is not None and (sizes == BATCH).all()
            assert len(real) == TOTAL - TOTAL % (ranks * BATCH)
        elif tail == "short":
            assert sizes is not None and sizes.min() >= 1
            assert (sizes.max(axis=0) - sizes.min(axis=0)).max() <= 1
            partial = np.flatnonzero(sizes.min(axis=0) < BATCH)
            assert (sizes[:, :partial[0]] == BATCH).all() if len(partial) else True
        elif tail == "pad":
            assert sizes is not None and (sizes == BATCH).all()
            assert labels.count(PAD_LABEL) == ranks * counts[0] * BATCH - TOTAL
        if tail != "drop":
            assert sorted(real) == list(range(TOTAL)), f"{name}: not every sample once"
    for a, b in zip(per_loader["shards"], per_loader["list"], strict=True):
        assert same_batches(a, b), "the two loaders planned or augmented differently"


def test_list_elastic_resume_sees_every_remaining_sample_once(data: ShardData,
                                                              listed_data: Path) -> None:
    """The label-list loader resumes on another number of ranks as the shard loader does:
    stop after 2 steps on 3 ranks, resume on 2 from rank 0's state: every sample once."""
    first = [LabelListLoader(listed_data, w,
                             LoaderOptions(batch_size=BATCH, workers=0, tail="short",
                                           transform=SMALL_TRAIN)) for w in layout(1, 3)]
    seen: list[int] = []
    for loader in first:
        loader.set_epoch(1)
        seen += labels_of([b for _, b in zip(range(2), loader, strict=False)])
    state = first[0].state_dict()
    for w in layout(1, 2):
        loader = LabelListLoader(listed_data, w,
                                 LoaderOptions(batch_size=BATCH, workers=0, tail="short",
                                               transform=SMALL_TRAIN))
        loader.load_state_dict(state)
        seen += labels_of(list(loader))
    assert sorted(seen) == list(range(TOTAL))


@pytest.mark.parametrize("workers", [0, 2])
def test_val_defaults_are_exact(data: ShardData, workers: int) -> None:
    """The val split defaults to ``tail="pad"``, no shuffle and the center crop."""
    worlds = layout(1, 3)
    loaders = [ShardLoader(data.folder, "val", w,
                           LoaderOptions(batch_size=4, workers=workers, transform=SMALL_VAL))
               for w in worlds]
    assert {loader.options.tail for loader in loaders} == {"pad"}
    assert len({len(loader) for loader in loaders}) == 1
    seen = Counter(x for loader in loaders for x in labels_of(run_epoch(loader, 0)))
    pads = seen.pop(PAD_LABEL, 0)
    assert seen == Counter(range(TOTAL))
    assert pads == 3 * len(loaders[0]) * 4 - TOTAL


# ---------------------------------------------------------------------------- order


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", MODES)
def test_order_per_epoch_rerun_and_seed(data: ShardData, mode: str, workers: int) -> None:
    """Epoch e's order is a pure function of (seed, e, World): the same from a fresh loader,
    different for another epoch or another seed."""
    for world in layout(2, 1):
        def make(seed: int, w: World = world) -> ShardLoader:
            return ShardLoader(data.folder, "train", w,
                               LoaderOptions(batch_size=BATCH, workers=workers, seed=seed,
                                             transform=SMALL_TRAIN), mode=mode)

        first = make(0)
        runs = {e: run_epoch(first, e) for e in (0, 1)}
        assert labels_of(runs[0]) != labels_of(runs[1]), f"rank {world.rank}: same order"
        again = make(0)
        for e in (1, 0):  # another epoch first: no state carried between epochs
            assert same_batches(run_epoch(again, e), runs[e])
        other = make(1)
        assert labels_of(run_epoch(other, 0)) != labels_of(runs[0])


# ---------------------------------------------------------------------------- resume


@pytest.mark.parametrize(("workers", "tail", "version"), [
    (0, "drop", 2), (0, "short", 2), (0, "pad", 1), (2, "drop", 2), (2, "short", 1),
    (2, "pad", 2)])
def test_resume_yields_the_tail(data: ShardData, workers: int, tail: str, version: int
                                ) -> None:
    """load_state_dict({"epoch": e, "batch": k, "order_version": v}) then iterating gives
    exactly batches k.. of an uninterrupted epoch e, from the same loader or a fresh one,
    with either order version."""
    world = layout(1, 2)[1]

    def make() -> ShardLoader:
        return ShardLoader(data.folder, "train", world,
                           LoaderOptions(batch_size=2, workers=workers, tail=tail,
                                         transform=SMALL_TRAIN, order_version=version))

    loader = make()
    epoch = 1
    full = run_epoch(loader, epoch)
    n = len(full)
    assert n >= 4
    for k in sorted({0, 1, n // 2, n - 1, n}):
        for target in (loader, make()):
            target.load_state_dict({"epoch": epoch, "batch": k, ORDER_KEY: version})
            assert len(target) == n - k
            got = []
            for i, batch in enumerate(target):
                got.append(batch)
                assert position(target) == {"epoch": epoch, "batch": k + i + 1}
            assert same_batches(got, full[k:]), f"resume at batch {k} differs"
    # Once a resumed epoch is done, the next pass over it starts from its first batch.
    assert len(loader) == n
    assert same_batches(list(loader), full)


@pytest.mark.parametrize("workers", [0, 2])
def test_checkpoint_mid_epoch_and_restart(data: ShardData, workers: int) -> None:
    """A trainer's flow: stop after k batches, save state_dict(), resume from it: the
    batches before and after the stop make the uninterrupted epoch."""
    world = layout(2, 2)[3]

    def make() -> ShardLoader:
        return ShardLoader(data.folder, "train", world,
                           LoaderOptions(batch_size=2, workers=workers, transform=SMALL_TRAIN),
                           mode="partition")

    full = run_epoch(make(), 2)
    loader = make()
    loader.set_epoch(2)
    before: list[Batch] = []
    for batch in loader:
        before.append(batch)
        if len(before) == 2:
            break
    state = loader.state_dict()
    assert position(loader) == {"epoch": 2, "batch": 2}
    for target in (loader, make()):  # the same loader (its workers stay alive) or a new one
        target.load_state_dict(state)
        assert same_batches(before + list(target), full)


def test_state_dict_right_after_load_state_dict(data: ShardData) -> None:
    """A checkpoint taken after resuming but before the next batch keeps the position."""
    loader = ShardLoader(data.folder, "train", World(),
                         LoaderOptions(batch_size=4, workers=0, transform=SMALL_TRAIN))
    assert position(loader) == {"epoch": 0, "batch": 0}
    loader.load_state_dict({"epoch": 1, "batch": 3, ORDER_KEY: 2})
    assert position(loader) == {"epoch": 1, "batch": 3}


def test_state_dict_right_after_set_epoch(data: ShardData) -> None:
    """After a finished epoch, set_epoch(e + 1) starts a new epoch with no batch done."""
    loader = ShardLoader(data.folder, "train", World(),
                         LoaderOptions(batch_size=4, workers=0, transform=SMALL_TRAIN))
    run_epoch(loader, 1)
    assert position(loader) == {"epoch": 1, "batch": len(loader)}
    loader.set_epoch(2)
    assert position(loader) == {"epoch": 2, "batch": 0}
    # Resuming from that checkpoint must give the whole of epoch 2, not nothing.
    fresh = ShardLoader(data.folder, "train", World(),
                        LoaderOptions(batch_size=4, workers=0, transform=SMALL_TRAIN))
    fresh.load_state_dict(loader.state_dict())
    assert len(fresh) == len(loader)


def test_abandoned_epoch_with_full_rings_does_not_hang(data: ShardData) -> None:
    """Breaking out mid-epoch while the workers wait for free ring slots (prefetch 1: rings
    of 3), then iterating again, gives the same epoch again, and resuming still works."""
    loader = ShardLoader(data.folder, "train", layout(1, 1)[0],
                         LoaderOptions(batch_size=2, workers=2, transform=SMALL_TRAIN,
                                       prefetch_factor=1))
    full = run_epoch(loader, 0)
    for _ in range(2):
        loader.set_epoch(0)
        it = iter(loader)
        next(it)
        time.sleep(0.3)  # the workers fill their rings and block
        del it
        again = run_epoch(loader, 0)
        assert len(again) == len(full)
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                   for a, b in zip(full, again, strict=True))
    loader.load_state_dict({"epoch": 0, "batch": 3, ORDER_KEY: 2})
    tail = list(loader)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(full[3:], tail, strict=True))


def test_killed_worker_names_its_shards(data: ShardData) -> None:
    """SIGKILL of a worker mid-epoch: a LoaderError naming the worker (from the pid it
    recorded itself), the batch it was making and that batch's shards."""
    loader = ShardLoader(data.folder, "train", World(),
                         LoaderOptions(batch_size=2, workers=2, transform=SMALL_TRAIN))
    plan = loader.plan(0)
    with pytest.raises(LoaderError) as e:
        for i, _ in enumerate(loader):
            if i == 1:
                os.kill(loader.worker_pids[1], signal.SIGKILL)
    text = str(e.value)
    b = int(re.search(r"worker 1 \(pid \d+, making batch (\d+) from ", text).group(1))
    assert b % 2 == 1  # worker 1 makes the odd batches
    names = sorted({loader.shards.names[k] for k in plan.shards_of(plan.table[b:b + 1])})
    assert all(n in text for n in names[:3])
    assert "rank 0" in text and "epoch 0" in text


def test_resume_outside_the_epoch_is_refused(data: ShardData) -> None:
    loader = ShardLoader(data.folder, "train", World(),
                         LoaderOptions(batch_size=4, workers=0, transform=SMALL_TRAIN))
    n = len(loader)
    for bad in (-1, n + 1):
        with pytest.raises(ValueError, match="outside epoch"):
            loader.load_state_dict({"epoch": 0, "batch": bad, ORDER_KEY: 2})


# ---------------------------------------------------------------------------- output format


@pytest.mark.parametrize("workers", [0, 2])
def test_train_batches_are_uint8_nchw(data: ShardData, workers: int) -> None:
    """Default train transform: (B, 3, 224, 224) uint8, contiguous NCHW; labels int64."""
    loader = ShardLoader(data.folder, "train", World(),
                         LoaderOptions(batch_size=4, workers=workers))
    batches = run_epoch(loader, 0)
    assert len(batches) == TOTAL // 4
    for images, labels in batches:
        assert images.dtype == torch.uint8 and images.shape == (4, 3, 224, 224)
        assert images.is_contiguous()
        assert labels.dtype == torch.int64 and labels.shape == (4,)
    assert loader.mean == (0.485, 0.456, 0.406) and loader.std == (0.229, 0.224, 0.225)


@pytest.mark.parametrize("workers", [0, 2])
def test_val_transform_is_center_crop(data: ShardData, workers: int) -> None:
    """Default val transform of a 256 px image: exactly its center 224 px crop."""
    loader = ShardLoader(data.folder, "val", World(), LoaderOptions(batch_size=5, workers=workers))
    seen = set()
    for images, labels in run_epoch(loader, 0):
        assert images.shape == (5, 3, 224, 224)
        for image, label in zip(images, labels.tolist(), strict=True):
            if label == PAD_LABEL:
                assert not image.any()
                continue
            assert np.array_equal(image.numpy(), center_crop(data.jpegs[label], 224))
            seen.add(label)
    assert seen == set(range(TOTAL))


def test_into_chw_is_the_transposed_pixel_array() -> None:
    hwc = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    out = np.zeros((3, 37, 53), np.uint8)
    into_chw(Image.fromarray(hwc), out)
    assert np.array_equal(out, hwc.transpose(2, 0, 1))


def test_train_crop_is_a_resize_of_the_image_or_its_mirror(data: ShardData) -> None:
    """With the crop pinned to the whole image, every output is the image resized to 160 px
    (too big for JPEG draft to scale the decode; by imgprep's resampler, whichever Pillow is
    installed, or Pillow's without the extension), or its mirror, and both occur: the flip
    is random, the pixels are the image's."""
    t = TrainTransform(size=160, scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=True)
    loader = ShardLoader(data.folder, "train", World(),
                         LoaderOptions(batch_size=4, workers=0, transform=t))
    flips = []
    for images, labels in run_epoch(loader, 0):
        for image, label in zip(images, labels.tolist(), strict=True):
            img = Image.open(io.BytesIO(data.jpegs[label])).convert("RGB")
            if resample.AVAILABLE:
                want = np.empty((3, 160, 160), np.uint8)
                resample.resize(np.asarray(img), (0, 0, *img.size), (160, 160), want,
                                planar=True)
            else:
                want = np.asarray(img.resize((160, 160), Image.Resampling.BILINEAR))
                want = want.transpose(2, 0, 1)
            got = image.numpy()
            plain, mirror = np.array_equal(got, want), np.array_equal(got, want[:, :, ::-1])
            assert plain or mirror, f"sample {label}: neither the image nor its mirror"
            flips.append(mirror)
    assert 0 < sum(flips) < len(flips)


# ---------------------------------------------------------------------------- augmentation RNG


def same_image_run(folder: Path, world: World, seed: int = 0, epoch: int = 0,
                   workers: int = 2) -> list[Batch]:
    loader = ShardLoader(folder, "train", world,
                         LoaderOptions(batch_size=3, workers=workers, seed=seed,
                                       transform=SMALL_TRAIN))
    return run_epoch(loader, epoch)


def test_workers_draw_distinct_augmentations(same_image: Path) -> None:
    """Every sample holds the same JPEG, so equal output images would mean equal random
    draws: worker 0's and worker 1's first batches (and every two samples) must differ."""
    batches = same_image_run(same_image, World())
    plan = ShardLoader(same_image, "train", World(), LoaderOptions(batch_size=3, workers=2)).plan(0)
    assert plan.order[0][0] != plan.order[1][0]  # batches 0 and 1 come from two workers
    assert not torch.equal(batches[0][0], batches[1][0])
    flat = images_of(batches)
    distinct = {bytes(image.numpy()) for image in flat}
    assert len(distinct) == len(flat) == 24


def test_augmentation_is_reproducible_per_seed_epoch_rank(same_image: Path) -> None:
    """Augmentation is a function of (seed, epoch, rank, worker): the same on a rerun,
    different when any of seed, epoch or rank changes."""
    base = images_of(same_image_run(same_image, World()))
    assert torch.equal(images_of(same_image_run(same_image, World())), base)
    assert not torch.equal(images_of(same_image_run(same_image, World(), seed=1)), base)
    assert not torch.equal(images_of(same_image_run(same_image, World(), epoch=1)), base)
    ranks = [images_of(same_image_run(same_image, w)) for w in layout(1, 2)]
    assert not torch.equal(ranks[0][:12], ranks[1][:12])


# ---------------------------------------------------------------------------- partition, node-local


def node_ids(data: ShardData, folder: Path, split: str = "train") -> set[int]:
    return {i for s in read_manifest(folder, split).shards for i in data.ids[s.name]}


def test_staged_nodes_split_the_set(data: ShardData, nodes: list[Path]) -> None:
    """Sanity of the fixture: each node holds its shards only, together all of them once."""
    held = [sorted(p.name for p in d.glob("train-*.tar")) for d in nodes]
    listed = [sorted(s.name for s in read_manifest(d, "train").shards) for d in nodes]
    assert held == listed
    assert all(held) and not set(held[0]) & set(held[1])
    assert sorted(held[0] + held[1]) == sorted(n for n in data.ids if n.startswith("train"))


@pytest.mark.parametrize("tail", ["drop", "short", "pad"])
@pytest.mark.parametrize("workers", [0, 2])
def test_partition_from_node_local_dirs(data: ShardData, nodes: list[Path], workers: int,
                                        tail: str) -> None:
    """2 nodes x 2 local ranks, each rank on its node's folder: equal counts over all four
    ranks, and a node's ranks read only that node's samples."""
    worlds = layout(2, 2)
    loaders = [ShardLoader(nodes[w.node_rank], "train", w,
                           LoaderOptions(batch_size=BATCH, workers=workers, tail=tail,
                                         transform=SMALL_TRAIN)) for w in worlds]
    assert {loader.shards.mode for loader in loaders} == {"partition"}
    for epoch in EPOCHS:
        for loader in loaders:
            loader.set_epoch(epoch)
        stated = [len(loader) for loader in loaders]
        assert len(set(stated)) == 1, f"epoch {epoch}: unequal counts {stated}"
        seen: list[int] = []
        for w, loader in zip(worlds, loaders, strict=True):
            for shards in loader.plan(epoch).worker_shards:
                assert set(shards) <= loader.shards.present
            mine = [x for x in labels_of(run_epoch(loader, epoch)) if x != PAD_LABEL]
            assert set(mine) <= node_ids(data, nodes[w.node_rank]), \
                f"rank {w.rank} read a sample of the other node"
            seen += mine
        assert len(seen) == len(set(seen))
        if tail != "drop":
            assert sorted(seen) == list(range(TOTAL))


@pytest.mark.parametrize("world", [
    World(rank=2, world_size=4, local_rank=0, local_world_size=2, node_rank=1,
          num_nodes=2),  # node 1's rank on node 0's folder
    World(rank=0, world_size=2, local_rank=0, local_world_size=2, node_rank=0,
          num_nodes=1),  # one node: the folder holds half of the data
    World(rank=0, world_size=3, local_rank=0, local_world_size=1, node_rank=0,
          num_nodes=3),  # three nodes: staged for two
], ids=["other-node", "one-node", "three-nodes"])
def test_world_must_match_node_local_manifest(nodes: list[Path], world: World) -> None:
    with pytest.raises(WorldError, match="node"):
        ShardLoader(nodes[0], "train", world, LoaderOptions(batch_size=BATCH, workers=0))


def stage_node0(data: ShardData, dst: Path, mode: str, nodes: int) -> Path:
    """Node 0's copy of ``data`` staged in ``mode`` for a job of ``nodes`` nodes."""
    stage_to_node(StageOptions(src=data.folder, dst=dst, mode=mode, jobs=1, split="train"),
                  World().with_nodes(nodes, 0))
    return dst


@pytest.mark.parametrize("nodes", [1, 2])
def test_replicate_copy_loads_on_any_node_count(data: ShardData, tmp_path: Path,
                                                nodes: int) -> None:
    """A replicate copy staged on 3 nodes holds every shard: a job of 1 or 2 nodes (the
    copy on each node, as an elastic resume on fewer nodes has it) loads it, each rank on
    its own node, and the epoch covers every sample once."""
    copy = stage_node0(data, tmp_path / "node0", "replicate", 3)
    node = read_manifest(copy, "train").node
    assert node is not None and (node.mode, node.num_nodes, node.node_rank) == ("replicate",
                                                                                3, 0)
    seen: list[int] = []
    for w in layout(nodes, 2):
        loader = ShardLoader(copy, "train", w,
                             LoaderOptions(batch_size=BATCH, workers=0, tail="pad",
                                           transform=SMALL_TRAIN))
        assert loader.shards.mode == "replicate"
        seen += [x for x in labels_of(run_epoch(loader, 0)) if x != PAD_LABEL]
    assert sorted(seen) == list(range(TOTAL))


def test_partition_copy_refuses_another_node_count(data: ShardData, tmp_path: Path) -> None:
    """A partition copy staged on 3 nodes holds node 0's share of a 3-node layout: a job of
    2 nodes is refused, naming the node count it was staged with."""
    copy = stage_node0(data, tmp_path / "node0", "partition", 3)
    with pytest.raises(WorldError, match="node 0 of 3.*node 0 of 2.*node count"):
        ShardLoader(copy, "train", layout(2, 1)[0], LoaderOptions(batch_size=BATCH, workers=0))
    ShardLoader(copy, "train", layout(3, 1)[0],
                LoaderOptions(batch_size=BATCH, workers=0))  # its own job loads it


def test_mode_must_match_node_local_manifest(nodes: list[Path]) -> None:
    with pytest.raises(WorldError, match="partition"):
        ShardLoader(nodes[0], "train", layout(2, 2)[0], LoaderOptions(batch_size=BATCH, workers=0),
                    mode="replicate")


def test_shard_missing_from_node_manifest(data: ShardData, nodes: list[Path],
                                          tmp_path: Path) -> None:
    """A node-local manifest without one of the node's shards: every rank of that node
    (each reads from all of its node's shards) fails with a LoaderError naming it, before
    reading anything; the other node's ranks are unaffected."""
    folder = tmp_path / "node0"
    shutil.copytree(nodes[0], folder)
    m = read_manifest(folder, "train")
    gone = max(m.shards, key=lambda s: s.samples)
    kept = [s for s in m.shards if s != gone]
    write_manifest(folder, replace(m, shards=kept, total_samples=sum(s.samples for s in kept)))
    (folder / gone.name).unlink()
    worlds = layout(2, 2)
    for w in worlds[:2]:
        with pytest.raises(LoaderError, match=re.escape(gone.name)):
            ShardLoader(folder, "train", w,
                        LoaderOptions(batch_size=BATCH, workers=0, transform=SMALL_TRAIN))
    for w in worlds[2:]:
        run_epoch(ShardLoader(nodes[1], "train", w,
                              LoaderOptions(batch_size=BATCH, workers=0, transform=SMALL_TRAIN)), 0)


@pytest.mark.parametrize("workers", [0, 2])
def test_shard_file_missing(damaged: ShardData, workers: int) -> None:
    """A shard the manifest lists but the disk lacks: the rank reading it fails naming it."""
    gone = "train-000002.tar"
    (damaged.folder / gone).unlink()
    errors, readers = [], 0
    for w in layout(1, 2):
        loader = ShardLoader(damaged.folder, "train", w,
                             LoaderOptions(batch_size=BATCH, workers=workers,
                                           transform=SMALL_TRAIN))
        readers += reads(loader, gone)
        try:
            list(loader)
        except LoaderError as e:
            errors.append(str(e))
    assert readers and len(errors) == readers and all(gone in e for e in errors)


# ---------------------------------------------------------------------------- damaged shards


def corrupt_jpeg(d: ShardData, sample: int) -> str:
    """Flip the first bytes of ``sample``'s JPEG data (not its tar header); its shard's name."""
    name = d.shard_of(sample)
    shard = d.folder / name
    info = member(shard, f"{key_of(sample)}.jpg")
    xor_bytes(shard, info.offset_data, 16)
    with tarfile.open(shard) as tf:  # the tar itself is intact
        assert len(tf.getmembers()) == 2 * len(d.ids[name])
    return name


@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_jpeg_names_shard_and_key(damaged: ShardData, workers: int) -> None:
    bad = 20
    name = corrupt_jpeg(damaged, bad)
    errors = []
    for w in layout(1, 2):
        loader = ShardLoader(damaged.folder, "train", w,
                             LoaderOptions(batch_size=BATCH, workers=workers, tail="pad",
                                           transform=SMALL_TRAIN))
        try:
            run_epoch(loader, 0)
        except LoaderError as e:
            errors.append(str(e))
    assert len(errors) == 1, errors
    assert name in errors[0] and key_of(bad) in errors[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_jpeg_skipped(damaged: ShardData, workers: int) -> None:
    """on_error="skip": the epoch completes with equal counts, the bad sample's slot is
    filled, and the sample is counted in ``skipped`` (per epoch)."""
    bad = 20
    corrupt_jpeg(damaged, bad)
    loaders = [ShardLoader(damaged.folder, "train", w,
                           LoaderOptions(batch_size=BATCH, workers=workers, tail="pad",
                                         on_error="skip",
                                         transform=SMALL_TRAIN)) for w in layout(1, 2)]
    for epoch in (0, 1):
        for loader in loaders:
            loader.set_epoch(epoch)
        stated = [len(loader) for loader in loaders]
        assert stated[0] == stated[1]
        seen: list[int] = []
        for loader in loaders:
            seen += labels_of(run_epoch(loader, epoch))
        assert [loader.skipped for loader in loaders].count(1) == 1
        assert sum(loader.skipped for loader in loaders) == 1
        real = Counter(x for x in seen if x != PAD_LABEL)
        assert bad not in real
        assert set(real) == set(range(TOTAL)) - {bad}


def epoch_errors(folder: Path, workers: int, tail: str | None = None) -> list[str]:
    """Run epoch 0 on each rank of a 1x2 layout; the LoaderError messages the ranks raised."""
    errors = []
    for world in layout(1, 2):
        loader = ShardLoader(folder, "train", world,
                             LoaderOptions(batch_size=BATCH, workers=workers, tail=tail,
                                           transform=SMALL_TRAIN))
        try:
            run_epoch(loader, 0)
        except LoaderError as e:
            errors.append(str(e))
    return errors


@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_tar_header(damaged: ShardData, workers: int) -> None:
    name = "train-000006.tar"
    shard = damaged.folder / name
    info = member(shard, f"{key_of(damaged.ids[name][3])}.cls")
    xor_bytes(shard, info.offset + 5, 1)  # a byte of the member's name: checksum no longer fits
    errors = epoch_errors(damaged.folder, workers=workers, tail="pad")
    assert len(errors) == 1 and name in errors[0]  # the one rank that reads that sample


@pytest.mark.parametrize("tail", ["drop", "pad"])
def test_shard_shorter_than_manifest(damaged: ShardData, tail: str) -> None:
    """A shard holding fewer samples than its manifest entry: LoaderError naming it."""
    name = "train-000002.tar"
    ids = damaged.ids[name][:-2]
    with ShardWriter(damaged.folder / name) as w:
        for i in ids:
            w.add(key_of(i), {"jpg": damaged.jpegs[i], "cls": str(i).encode()})
    errors = epoch_errors(damaged.folder, workers=2, tail=tail)
    assert errors and all(name in e and "manifest" in e for e in errors)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("extra", [-2, 2], ids=["fewer", "more"])
def test_val_shard_count_mismatch_anywhere(damaged: ShardData, extra: int,
                                           workers: int) -> None:
    """Exact validation (val split: tail="pad", no shuffle): a shard holding fewer
    or more samples than its manifest entry must fail the epoch naming it, whichever shard
    it is (the first, a middle or the last one a worker reads); otherwise the epoch drops or
    adds samples silently."""
    silent = []
    original = {n: (damaged.folder / n).read_bytes() for n in damaged.ids}
    for name in (n for n in damaged.ids if n.startswith("val")):
        ids = damaged.ids[name]
        ids = ids[:extra] if extra < 0 else ids + [900 + i for i in range(extra)]
        with ShardWriter(damaged.folder / name) as w:
            for i in ids:
                w.add(key_of(i), {"jpg": damaged.jpegs[i % TOTAL], "cls": str(i).encode()})
        loader = ShardLoader(damaged.folder, "val", World(),
                             LoaderOptions(batch_size=BATCH, workers=workers, transform=SMALL_VAL))
        try:
            labels = labels_of(run_epoch(loader, 0))
            silent.append(f"{name}: labels {sorted(set(labels) - set(range(TOTAL)))}")
        except LoaderError as e:
            assert name in str(e) and "manifest" in str(e)
        (damaged.folder / name).write_bytes(original[name])
    assert not silent, f"count mismatch not detected for {silent}"


# ---------------------------------------------------------------------------- the tar reader


LONG_KEY = "n01440764_" + "x" * 140  # a 144-char member name: needs a pax header


@pytest.fixture(scope="module")
def odd_shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ShardWriter shard with short, long (pax) and non-ASCII keys and three fields."""
    path = tmp_path_factory.mktemp("odd") / "odd-000000.tar"
    with ShardWriter(path) as w:
        for i, key in enumerate(["n01440764_1", LONG_KEY, "n01443537_\u00e9t\u00e9_2",
                                 "ILSVRC2012_val_00000001", "y" * 99]):
            w.add(key, {"jpg": jpeg((40, 30), seed=i), "cls": str(i).encode(),
                        "json": json.dumps({"i": i, "pad": "z" * (i * 300)}).encode()})
    return path


def tarfile_members(path: Path) -> list[tuple[str, bytes]]:
    out = []
    with tarfile.open(path) as tf:
        for m in tf:
            if m.isreg():
                f = tf.extractfile(m)
                assert f is not None
                out.append((m.name, f.read()))
    return out


def test_iter_members_matches_tarfile(odd_shard: Path) -> None:
    got = list(iter_members(odd_shard))
    assert got == tarfile_members(odd_shard)
    assert f"{LONG_KEY}.jpg" in [name for name, _ in got]


def test_iter_samples_matches_webdataset(odd_shard: Path) -> None:
    ours = [(key, fields) for key, fields in iter_samples(odd_shard)]
    theirs = [(s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")})
              for s in wds.WebDataset(str(odd_shard), shardshuffle=False)]
    assert ours == theirs
    assert [key for key, _ in ours][1] == LONG_KEY


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT],
                         ids=["pax", "gnu", "ustar"])
def test_iter_members_reads_every_long_name_form(tmp_path: Path, fmt: int) -> None:
    """Long names the three ways tar writes them: pax records, GNU ``L`` members and the
    ustar prefix field (a name > 100 chars split at a slash)."""
    # 100 chars exactly (no NUL in the name field), a prefix/name split, a short name
    names = ["a.jpg", "d" * 60 + "/" + "e" * 90 + ".jpg", "f" * 96 + ".cls", "short.cls"]
    if fmt != tarfile.USTAR_FORMAT:  # ustar cannot hold these
        names += ["g" * 101 + ".cls", "h" * 200 + ".json"]
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=fmt) as tf:
        for i, name in enumerate(names):
            payload = bytes([i]) * (i * 700 + 1)
            ti = tarfile.TarInfo(name)
            ti.size = len(payload)
            tf.addfile(ti, io.BytesIO(payload))
    got = list(iter_members(path))
    assert [n for n, _ in got] == names
    assert got == tarfile_members(path)


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax", "gnu"])
def test_long_name_of_a_directory_is_not_given_to_the_next_file(tmp_path: Path,
                                                                fmt: int) -> None:
    """A tar made from a folder (``tar cf`` of a directory with a long name) holds a directory
    member whose long name comes in a pax/GNU header; the file after it keeps its own name."""
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=fmt) as tf:
        d = tarfile.TarInfo("d" * 120)
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        ti = tarfile.TarInfo("n01440764_1.jpg")
        ti.size = 3
        tf.addfile(ti, io.BytesIO(b"abc"))
    assert list(iter_members(path)) == tarfile_members(path) == [("n01440764_1.jpg", b"abc")]


# ---------------------------------------------------------------------------- from convert


def test_loader_over_converted_shards(sample: Path, tmp_path: Path) -> None:
    """Shards made by ``imgprep convert`` (unequal, with .json members): exact validation
    over three ranks gives every sample once, with the manifest's labels."""
    out = tmp_path / "conv"
    convert(ConvertOptions(input=sample / "ILSVRC2012_img_train.tar", out=out, num_shards=5))
    m = read_manifest(out, "train")
    want = Counter(int(f["cls"]) for s in m.shards for _, f in iter_samples(out / s.name))
    loaders = [ShardLoader(out, "train", w,
                           LoaderOptions(batch_size=4, workers=0, tail="pad", transform=SMALL_VAL))
               for w in layout(1, 3)]
    assert len({len(loader) for loader in loaders}) == 1
    got = Counter(x for loader in loaders for x in labels_of(run_epoch(loader, 0)))
    got.pop(PAD_LABEL, None)
    assert got == want and sum(want.values()) == m.total_samples


# ---------------------------------------------------------------------------- real processes

RANK_SCRIPT = r'''
"""One rank of a Gloo job: train 2 epochs and validate once, all-reducing every step."""
import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from imgprep.job.world import World
from loaders import PAD_LABEL, LabelListLoader, LoaderOptions, ShardLoader
from loaders.epochs import TAILS, pools
from loaders.transforms import TrainTransform, ValTransform

cfg = json.loads(sys.argv[1])
world = World(**cfg["world"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}",
                        rank=world.rank, world_size=world.world_size,
                        timeout=timedelta(seconds=60))
report = {"rank": world.rank, "train": []}
train = ShardLoader(cfg["folder"], "train", world, LoaderOptions(
    batch_size=cfg["batch"], workers=2, transform=TrainTransform(size=32)), mode=cfg["mode"])
for epoch in range(2):
    train.set_epoch(epoch)
    stated, steps, labels = len(train), 0, []
    for images, lab in train:
        step = torch.tensor([steps, images.shape[0]], dtype=torch.int64)
        dist.all_reduce(step, op=dist.ReduceOp.MAX)
        assert step.tolist() == [steps, images.shape[0]], "ranks out of step"
        steps += 1
        labels += lab.tolist()
    report["train"].append({"stated": stated, "steps": steps, "labels": labels})
val = ShardLoader(cfg["folder"], "val", world, LoaderOptions(
    batch_size=cfg["batch"], workers=2, transform=ValTransform(size=32)), mode=cfg["mode"])
seen = torch.zeros(1000, dtype=torch.int64)
stated, steps = len(val), 0
for images, lab in val:
    dist.all_reduce(torch.ones(1))
    seen += torch.bincount(lab[lab != PAD_LABEL], minlength=1000)
    steps += 1
dist.all_reduce(seen)
report["val"] = {"stated": stated, "steps": steps, "seen": seen.tolist()}
dist.barrier()
dist.destroy_process_group()
Path(cfg["out"]).write_text(json.dumps(report))
'''


def run_ranks(tmp_path: Path, worlds: Sequence[World], folders: Sequence[Path],
              mode: str | None, text: str = RANK_SCRIPT, **extra: Any) -> list[dict[str, Any]]:
    """Run one process per World; all must exit 0 within PROC_TIMEOUT (else killed).
    ``extra`` goes into every rank's configuration."""
    script = tmp_path / "rank.py"
    script.write_text(text)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs = contextlib.ExitStack()
    for w, folder in zip(worlds, folders, strict=True):
        numbers = ("rank", "world_size", "local_rank", "local_world_size", "node_rank",
                   "num_nodes")
        cfg = {"world": {f: getattr(w, f) for f in numbers}, "port": port,
               "folder": str(folder), "mode": mode, "batch": BATCH,
               "out": str(tmp_path / f"rank{w.rank}.json"), **extra}
        log = logs.enter_context(open(tmp_path / f"rank{w.rank}.log", "wb"))
        procs.append(subprocess.Popen([sys.executable, str(script), json.dumps(cfg)],
                                      stdout=log, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True))
    deadline = time.monotonic() + PROC_TIMEOUT
    try:
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        hung = [p for p in procs if p.poll() is None]
        for p in hung:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        logs.close()
    out = {w.rank: (tmp_path / f"rank{w.rank}.log").read_text(errors="replace")[-3000:]
           for w in worlds}
    assert not hung, f"ranks hung past {PROC_TIMEOUT} s (killed): {out}"
    for w, p in zip(worlds, procs, strict=True):
        assert p.returncode == 0, f"rank {w.rank} exited {p.returncode}:\n{out[w.rank]}"
    return [json.loads((tmp_path / f"rank{w.rank}.json").read_text()) for w in worlds]


def check_job(reports: list[dict[str, Any]]) -> None:
    """Equal stated and yielded counts on every rank; validation saw every sample once."""
    for epoch in range(2):
        counts = {(r["train"][epoch]["stated"], r["train"][epoch]["steps"]) for r in reports}
        assert len(counts) == 1, f"epoch {epoch}: (stated, yielded) per rank differ: {counts}"
        (stated, steps), = counts
        assert stated == steps > 0
        labels = [x for r in reports for x in r["train"][epoch]["labels"]]
        assert len(labels) == len(set(labels))
    assert len({(r["val"]["stated"], r["val"]["steps"]) for r in reports}) == 1
    seen = reports[0]["val"]["seen"]
    assert seen[:TOTAL] == [1] * TOTAL and not any(seen[TOTAL:])


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3])
def test_gloo_ranks_in_lockstep_over_unequal_shards(data: ShardData, tmp_path: Path,
                                                    n: int) -> None:
    """n real processes (2 loader workers each), one all-reduce per step: unequal batch
    counts would leave a rank waiting in all_reduce until the job is killed."""
    worlds = [World(rank=r, world_size=n, local_rank=r, local_world_size=n, node_rank=0,
                    num_nodes=1) for r in range(n)]
    check_job(run_ranks(tmp_path, worlds, [data.folder] * n, "replicate"))


@pytest.mark.slow
def test_gloo_partition_two_nodes_in_lockstep(data: ShardData, nodes: list[Path],
                                              tmp_path: Path) -> None:
    """2 nodes x 1 rank, each process reading only its node-local folder."""
    worlds = [World(rank=r, world_size=2, local_rank=0, local_world_size=1, node_rank=r,
                    num_nodes=2) for r in range(2)]
    reports = run_ranks(tmp_path, worlds, nodes, None)
    check_job(reports)
    for w, r in zip(worlds, reports, strict=True):
        for epoch in range(2):
            assert set(r["train"][epoch]["labels"]) <= node_ids(data, nodes[w.node_rank])


# ---------------------------------------------------------------------------- elastic resume


@pytest.mark.parametrize("version", [2, 1])
def test_elastic_resume_sees_every_remaining_sample_once(data: ShardData, version: int
                                                         ) -> None:
    """Replicate mode: stop after k steps on W ranks, resume on W' ranks from rank 0's
    state_dict: the batches before and after cover the epoch, each sample once (pad, short),
    or all but what does not fill a step of W' (drop). Order version 1: one W -> W'."""
    moves = ((3, 2), (2, 3), (1, 2), (2, 2)) if version == 2 else ((3, 2),)
    for before, after in moves:
        for tail in ("pad", "short", "drop"):
            for k in (1, 3):
                first = [ShardLoader(data.folder, "train", w,
                                     LoaderOptions(batch_size=BATCH, workers=0, tail=tail,
                                                   transform=SMALL_TRAIN, order_version=version))
                         for w in layout(1, before)]
                seen: list[int] = []
                for loader in first:
                    loader.set_epoch(1)
                    seen += labels_of([b for _, b in zip(range(k), loader, strict=False)])
                state = first[0].state_dict()
                assert all(x.state_dict() == state for x in first)  # world-independent
                for w in layout(1, after):
                    loader = ShardLoader(data.folder, "train", w,
                                         LoaderOptions(batch_size=BATCH, workers=0, tail=tail,
                                                       transform=SMALL_TRAIN,
                                                       order_version=version))
                    loader.load_state_dict(state)
                    seen += labels_of(list(loader))
                real = [x for x in seen if x != PAD_LABEL]
                assert len(real) == len(set(real)), (before, after, tail, k)
                lost = TOTAL - len(real)
                assert lost == 0 if tail != "drop" else lost < after * BATCH, (before, after, k)


def test_resume_with_another_batch_size_continues_the_order(data: ShardData) -> None:
    first = ShardLoader(data.folder, "train", World(),
                        LoaderOptions(batch_size=4, workers=0, tail="pad", transform=SMALL_TRAIN))
    first.set_epoch(2)
    seen = labels_of([b for _, b in zip(range(3), first, strict=False)])
    then = ShardLoader(data.folder, "train", World(),
                       LoaderOptions(batch_size=5, workers=0, tail="pad", transform=SMALL_TRAIN))
    then.load_state_dict(first.state_dict())
    seen += labels_of(list(then))
    assert sorted(x for x in seen if x != PAD_LABEL) == list(range(TOTAL))


def test_partition_resume_on_another_node_count_is_refused(data: ShardData) -> None:
    loader = ShardLoader(data.folder, "train", layout(2, 1)[0],
                         LoaderOptions(batch_size=BATCH, workers=0, transform=SMALL_TRAIN),
                         mode="partition")
    next(iter(loader))
    state = loader.state_dict()
    other = ShardLoader(data.folder, "train", layout(3, 1)[0],
                        LoaderOptions(batch_size=BATCH, workers=0, transform=SMALL_TRAIN),
                        mode="partition")
    with pytest.raises(WorldError, match="2 nodes.*this job has 3.*same node count"):
        other.load_state_dict(state)
    same_nodes = ShardLoader(data.folder, "train", layout(2, 2)[0],
                             LoaderOptions(batch_size=BATCH, workers=0, transform=SMALL_TRAIN),
                             mode="partition")
    same_nodes.load_state_dict(state)  # more ranks per node: the node's data is the same


def test_a_state_of_another_order_version_is_refused_naming_both(data: ShardData) -> None:
    """A state records its epoch order's version; a loader of another version refuses it,
    naming both and the option that resumes it; a state without the key (written before
    versions were recorded) is version 1."""
    new = ShardLoader(data.folder, "train", World(),
                      LoaderOptions(batch_size=BATCH, workers=0, transform=SMALL_TRAIN))
    next(iter(new))
    state = new.state_dict()
    assert state[ORDER_KEY] == 2
    old = ShardLoader(data.folder, "train", World(),
                      LoaderOptions(batch_size=BATCH, workers=0, transform=SMALL_TRAIN,
                                    order_version=1))
    with pytest.raises(LoaderError, match="rank 0: .*version 2, this loader's is version 1"
                       ".*order_version=2"):
        old.load_state_dict(state)
    before = {k: v for k, v in state.items() if k != ORDER_KEY}
    with pytest.raises(LoaderError, match="version 1 .*no 'order_version'.*this loader's is "
                       "version 2.*order_version=1"):
        new.load_state_dict(before)
    old.load_state_dict(before)  # what the checkpoint's loader ran: resumed exactly
    assert old.state_dict()[ORDER_KEY] == 1 and old.state_dict()["batch"] == 1
    assert labels_of(run_epoch(old, 0)) != labels_of(run_epoch(new, 0))  # orders differ


ELASTIC_SCRIPT = r'''
"""One rank: with phase "first", take `steps` all-reduced steps of epoch 1 and save rank 0's
state; "resume": load that state and finish the epoch; "whole": the whole epoch. Reports
labels, counts, the worker pids and the plan's samples per worker."""
import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from imgprep.job.world import World
from loaders import LoaderOptions, ShardLoader, TrainTransform

cfg = json.loads(sys.argv[1])
world = World(**cfg["world"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}",
                        rank=world.rank, world_size=world.world_size,
                        timeout=timedelta(seconds=60))
loader = ShardLoader(cfg["folder"], "train", world, LoaderOptions(
    batch_size=cfg["batch"], workers=2, tail=cfg["tail"], transform=TrainTransform(size=32)))
state_file = Path(cfg["state"])
loader.set_epoch(1)
if cfg["phase"] == "resume":
    loader.load_state_dict(json.loads(state_file.read_text()))
labels, stated, steps = [], len(loader), 0
for images, lab in loader:
    dist.all_reduce(torch.ones(1))
    labels += lab.tolist()
    steps += 1
    if cfg["phase"] == "first" and steps == cfg["steps"]:
        break
if cfg["phase"] == "first" and world.rank == 0:
    state_file.write_text(json.dumps(loader.state_dict()))
plan = loader.plan(1, 0)
report = {"labels": labels, "stated": stated, "steps": steps, "pids": loader.worker_pids,
          "worker_samples": plan.worker_samples}
dist.barrier()
dist.destroy_process_group()
Path(cfg["out"]).write_text(json.dumps(report))
'''


@pytest.mark.slow
def test_gloo_elastic_resume_three_ranks_to_two(data: ShardData, tmp_path: Path) -> None:
    """Checkpoint on 3 Gloo ranks (2 workers each) after 2 steps, resume on 2: every
    remaining sample of the epoch once, padding aside."""
    state = tmp_path / "state.json"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = run_ranks(tmp_path / "a", layout(1, 3), [data.folder] * 3, None, ELASTIC_SCRIPT,
                      phase="first", steps=2, tail="pad", state=str(state))
    then = run_ranks(tmp_path / "b", layout(1, 2), [data.folder] * 2, None, ELASTIC_SCRIPT,
                     phase="resume", steps=0, tail="pad", state=str(state))
    assert {r["steps"] for r in first} == {2} and len({r["steps"] for r in then}) == 1
    assert all(r["stated"] == r["steps"] for r in then)
    real = [x for r in first + then for x in r["labels"] if x != PAD_LABEL]
    assert sorted(real) == list(range(TOTAL))


@pytest.mark.slow
def test_gloo_one_shard_per_rank_keeps_both_workers_busy(tmp_path: Path) -> None:
    """2 Gloo ranks x 2 workers over 2 shards: whole-shard plans left one worker idle per
    rank; sample plans give both workers batches, and both workers really ran."""
    folder = tmp_path / "two"
    folder.mkdir()
    write_split(folder, "train", (12, 12), lambda i: jpeg((64, 64), seed=i))
    reports = run_ranks(tmp_path, layout(1, 2), [folder] * 2, None, ELASTIC_SCRIPT,
                        phase="whole", steps=0, tail="drop",
                        state=str(tmp_path / "none.json"))
    for r in reports:
        assert len(r["worker_samples"]) == 2 and min(r["worker_samples"]) > 0
        assert len(set(r["pids"])) == 2 and min(r["pids"]) > 0
        assert r["steps"] == r["stated"] == 4
