"""Label-list loader, make_loader and the device step, with explicit Worlds in one process.

The list is planned as the shard loader's samples are (``loaders.epochs``, one pool), so its
tails keep the same promises; ``tests/loaders/test_shard_loader.py`` checks every tail on both
loaders over the same samples."""

from __future__ import annotations

import io
import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from imgprep.convert.options import ConvertOptions
from imgprep.convert.run import convert
from imgprep.errors import ManifestError
from imgprep.job.world import World
from loaders import (
    PAD_LABEL,
    DeviceLoader,
    LabelListLoader,
    LoaderError,
    LoaderOptions,
    make_loader,
    normalize,
    worker_count,
)
from loaders.epochs import PAD, plan_epoch
from loaders.labellist import read_label_list
from loaders.order import ORDER_KEY


@pytest.fixture(scope="module")
def listed(bad_sample: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("list")
    convert(ConvertOptions(input=bad_sample / "ILSVRC2012_img_train.tar", out=out, format="list",
                           max_errors=2))
    return out


def _worlds(n: int) -> list[World]:
    return [World(rank=r, world_size=n, local_rank=r, local_world_size=n, node_rank=0, num_nodes=1,
                  launcher="test") for r in range(n)]


def _epoch(loader: LabelListLoader, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader.set_epoch(epoch)
    return [(x.clone(), y.clone()) for x, y in loader]


def test_make_loader_picks_the_label_list(listed: Path) -> None:
    loader = make_loader(listed, "train", World(), LoaderOptions(batch_size=4, workers=0))
    assert isinstance(loader, LabelListLoader)
    assert len(loader.mean) == 3 and len(loader.std) == 3
    direct = make_loader(listed / "train.txt", "train", World(),
                         LoaderOptions(batch_size=4, workers=0))
    assert isinstance(direct, LabelListLoader) and len(direct) == len(loader)


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("tail", ["drop", "short", "pad", "uneven"])
def test_counts_and_coverage(listed: Path, ranks: int, tail: str) -> None:
    loaders = [LabelListLoader(listed / "train.txt", w,
                               LoaderOptions(batch_size=4, workers=0, tail=tail))
               for w in _worlds(ranks)]
    lens = [len(L) for L in loaders]
    labels = []
    for L in loaders:
        batches = _epoch(L, 0)
        assert len(batches) == len(L) == L.batches_per_epoch
        for x, y in batches:
            assert x.dtype == torch.uint8 and x.shape[1:] == (3, 224, 224)
            assert y.dtype == torch.int64
            if tail in ("drop", "pad"):
                assert x.shape[0] == 4
            assert not x[y == PAD_LABEL].any()  # padding is zeros
        labels.append(torch.cat([y for _, y in batches]))
    real = torch.cat(labels)
    real = real[real != PAD_LABEL]
    if tail != "uneven":
        assert len(set(lens)) == 1
    n_images = len(read_label_list(listed / "train.txt").paths)
    if tail == "drop":  # full batches only: what does not fill a step is left out
        assert len(real) == n_images - n_images % (ranks * 4)
    else:  # every image exactly once across ranks
        expected = np.sort(read_label_list(listed / "train.txt").labels)
        assert np.array_equal(np.sort(real.numpy()), expected)


def write_long_list(folder: Path, lines: int) -> Path:
    """A list of ``lines`` entries (files that are never read: only plans are checked)."""
    lst = folder / "long.txt"
    lst.write_text("".join(f"img/{i}.jpg {i % 1000}\n" for i in range(lines)))
    return lst


@pytest.mark.parametrize("tail", ["drop", "short", "pad", "uneven"])
def test_9469_entries_on_2_ranks_of_64_plan_as_shards_do(tmp_path: Path, tail: str) -> None:
    """The reported case: 9,469 entries, 2 ranks x batch 64. drop: 73 full steps, the 125
    that do not fill a 74th left out (the fewest whole batches allow); short: 73 full steps
    and a last one of 63 + 62; pad: 74 full batches, rank 1's last with 3 padding slots;
    uneven: the same without the padding. The plans are the shard loader's for one shard of
    9,469 samples."""
    lst = write_long_list(tmp_path, 9469)
    loaders = [LabelListLoader(lst, w, LoaderOptions(batch_size=64, workers=0, tail=tail),
                               num_classes=1000)
               for w in _worlds(2)]
    plans = [L.plan(0) for L in loaders]
    for w, plan in zip(_worlds(2), plans, strict=True):
        shard = plan_epoch([9469], w, "replicate", 0, 0, 64, 0, tail)
        assert np.array_equal(plan.table, shard.table)
    sizes = [(p.table != PAD).sum(axis=1).tolist() for p in plans]
    seen = np.concatenate([p.table[p.table != PAD] for p in plans])
    assert len(np.unique(seen)) == len(seen)
    want = {"drop": ([64] * 73, [64] * 73, 9469 - 125),
            "short": ([64] * 73 + [63], [64] * 73 + [62], 9469),
            "pad": ([64] * 74, [64] * 73 + [61], 9469),  # real samples; 3 padding slots
            "uneven": ([64] * 74, [64] * 73 + [61], 9469)}[tail]
    assert (sizes[0], sizes[1], len(seen)) == want
    assert [len(L) for L in loaders] == [len(sizes[0]), len(sizes[1])]


def test_order_changes_per_epoch_and_repeats_on_rerun(listed: Path) -> None:
    a = LabelListLoader(listed / "train.txt", World(),
                        LoaderOptions(batch_size=4, workers=0, seed=5))
    b = LabelListLoader(listed / "train.txt", World(),
                        LoaderOptions(batch_size=4, workers=0, seed=5))
    e0, e1 = _epoch(a, 0), _epoch(a, 1)
    assert not all(torch.equal(x[1], y[1]) for x, y in zip(e0, e1, strict=True))
    again = _epoch(b, 1)
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
               for x, y in zip(e1, again, strict=True))


def test_same_batches_for_any_worker_count(listed: Path) -> None:
    runs = [_epoch(LabelListLoader(listed / "train.txt", World(),
                                   LoaderOptions(batch_size=4, workers=w, seed=1)), 2)
            for w in (0, 2)]
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
               for x, y in zip(*runs, strict=True))


def test_workers_resume_exactly_and_keep_their_pids_across_epochs(listed: Path) -> None:
    """Two ring workers: a mid-epoch resume yields the uninterrupted run's batches, and the
    persistent workers serve the next epoch without restarting."""
    loader = LabelListLoader(listed / "train.txt", World(),
                             LoaderOptions(batch_size=4, workers=2, seed=2))
    full = _epoch(loader, 1)
    pids = loader.worker_pids
    assert len(set(pids)) == 2 and min(pids) > 0
    loader.load_state_dict({"epoch": 1, "batch": 3, ORDER_KEY: 2})
    tail = [(x.clone(), y.clone()) for x, y in loader]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for a, b in zip(full[3:], tail, strict=True))
    assert len(tail) == len(full) - 3 and loader.worker_pids == pids
    assert loader.state_dict()["batch"] == len(full)


def test_killed_worker_is_named_by_pid(listed: Path) -> None:
    """SIGKILL of a worker mid-epoch: a LoaderError naming the worker, the pid it recorded
    itself, the batch it was making and that batch's first list line."""
    loader = LabelListLoader(listed / "train.txt", World(),
                             LoaderOptions(batch_size=2, workers=2, seed=0))
    with pytest.raises(LoaderError) as e:
        for i, _ in enumerate(loader):
            if i == 1:
                pid = loader.worker_pids[1]
                os.kill(pid, signal.SIGKILL)
    text = str(e.value)
    m = re.search(r"worker 1 \(pid (\d+), making batch (\d+): .*train.txt:\d+: ", text)
    assert m is not None, text
    assert int(m.group(1)) == pid and int(m.group(2)) % 2 == 1  # worker 1: odd batches
    assert "rank 0" in text and "epoch 0" in text


def test_auto_workers_leave_a_core_to_each_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(16)))
    assert worker_count("auto", World(rank=0, world_size=8, local_rank=0, local_world_size=8,
                                      node_rank=0, num_nodes=1)) == 1  # 2 cores a rank
    assert worker_count("auto", World(rank=0, world_size=2, local_rank=0, local_world_size=2,
                                      node_rank=0, num_nodes=1)) == 7  # 8 cores a rank
    assert worker_count("auto", World()) == 15
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0})
    assert worker_count("auto", World()) == 1
    assert worker_count(0, World()) == 0 and worker_count(3, World()) == 3
    with pytest.raises(ValueError, match="auto"):
        worker_count("many", World())


@pytest.mark.parametrize(("k", "version"), [(0, 2), (1, 1), (3, 2), (5, 1)])
def test_resume_mid_epoch(listed: Path, k: int, version: int) -> None:
    """A state of only epoch and batch (an older checkpoint: order version 1) resumes on a
    loader made with order_version=1; with the version recorded, on its version."""
    loader = LabelListLoader(listed / "train.txt", World(),
                             LoaderOptions(batch_size=4, workers=0, seed=2, order_version=version))
    full = _epoch(loader, 3)
    loader.load_state_dict({"epoch": 3, "batch": k} | ({} if version == 1 else {ORDER_KEY: 2}))
    assert len(loader) == len(full) - k
    tail = [(x, y) for x, y in loader]
    assert len(tail) == len(full) - k
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for a, b in zip(full[k:], tail, strict=True))
    assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (3, len(full))


def test_val_is_a_center_crop(listed: Path) -> None:
    loader = LabelListLoader(listed / "train.txt", World(),
                             LoaderOptions(batch_size=2, workers=0, tail="uneven"), train=False)
    x, _ = next(iter(loader))
    first = read_label_list(listed / "train.txt").paths[0]
    img = np.asarray(Image.open(io.BytesIO((listed / first).read_bytes())).convert("RGB"))
    assert torch.equal(x[0], torch.from_numpy(img[16:240, 16:240].transpose(2, 0, 1).copy()))


def test_missing_file_names_the_line(listed: Path, tmp_path: Path) -> None:
    lines = (listed / "train.txt").read_text().splitlines()
    bad = tmp_path / "train.txt"
    bad.write_text("\n".join(lines[:3] + ["train/n01440764/gone.jpg 0"]) + "\n")
    loader = LabelListLoader(bad, World(), LoaderOptions(batch_size=2, workers=0, shuffle=False),
                             root=listed)
    with pytest.raises(LoaderError, match=r"train.txt:4: train/n01440764/gone.jpg cannot be read"):
        list(loader)


def test_corrupt_image_raises_or_is_skipped(listed: Path, tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    good = read_label_list(listed / "train.txt").paths[:3]
    for i, rel in enumerate(good):
        (tmp_path / "img" / f"{i}.jpg").write_bytes((listed / rel).read_bytes())
    (tmp_path / "img" / "1.jpg").write_bytes(b"<html>not an image</html>")
    lst = tmp_path / "l.txt"
    lst.write_text("".join(f"img/{i}.jpg {i}\n" for i in range(3)))
    with pytest.raises(LoaderError, match=r"l.txt:2: img/1.jpg"):
        list(LabelListLoader(lst, World(), LoaderOptions(batch_size=3, workers=0, shuffle=False)))
    loader = LabelListLoader(lst, World(),
                             LoaderOptions(batch_size=3, workers=0, shuffle=False, on_error="skip"))
    (x, y), = list(loader)  # as the shard loader: a good image of the batch takes the slot
    assert y.tolist() == [0, 0, 2] and loader.skipped == 1
    assert torch.equal(x[1], x[0])


@pytest.mark.parametrize(("line", "message"), [
    ("a.jpg", "expected 'path label'"), ("a b.jpg 3", "expected 'path label'"),
    ("a.jpg x", "expected 'path label'"), ("../../etc/passwd 1", "outside"),
    ("a.jpg 1000", "outside 0..999"), ("a.jpg -1", "outside"),
])
def test_bad_lines_are_refused(tmp_path: Path, line: str, message: str) -> None:
    lst = tmp_path / "l.txt"
    lst.write_text(f"ok.jpg 1\n{line}\n")
    with pytest.raises(ManifestError, match=message) as e:
        read_label_list(lst, num_classes=1000)
    assert "l.txt:2" in str(e.value)


def test_normalize_matches_the_formula() -> None:
    x = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    mean, std = torch.tensor([0.4, 0.5, 0.6]), torch.tensor([0.2, 0.25, 0.3])
    y = normalize(x, mean.view(1, 3, 1, 1), std.view(1, 3, 1, 1))
    ref = (x.float() / 255 - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    assert torch.allclose(y, ref, atol=1e-5)
    assert y.is_contiguous(memory_format=torch.channels_last)


def test_device_loader_on_cpu(listed: Path) -> None:
    loader = make_loader(listed, "train", World(), LoaderOptions(batch_size=4, workers=0))
    dev = DeviceLoader(loader, "cpu", loader.mean, loader.std, dtype=torch.bfloat16)
    assert len(dev) == len(loader)
    batches = list(dev)
    assert len(batches) == len(loader)
    x, y = batches[0]
    assert x.dtype == torch.bfloat16 and x.shape == (4, 3, 224, 224) and y.dtype == torch.int64
    with pytest.raises(ValueError, match="mean and std"):
        DeviceLoader(loader, "cpu", (0.5,), (0.2,))


def test_class_count_comes_from_the_list_not_imagenet(listed: Path, tmp_path: Path) -> None:
    """A converted list reports its manifest's class table; a bare list beside no class table
    reports its largest label + 1 (never a hard-wired 1000)."""
    from imgprep.shards.manifest import read_manifest

    loader = make_loader(listed, "train", World(), LoaderOptions(batch_size=4, workers=0))
    assert loader.num_classes == len(read_manifest(listed, "train").classes)
    direct = make_loader(listed / "train.txt", "train", World(),
                         LoaderOptions(batch_size=4, workers=0))
    assert direct.num_classes == loader.num_classes  # from classes.txt beside the list
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.jpg").write_bytes((listed / read_label_list(
        listed / "train.txt").paths[0]).read_bytes())
    (tmp_path / "l.txt").write_text("img/a.jpg 6\nimg/a.jpg 2\n")
    assert LabelListLoader(tmp_path / "l.txt", World(),
                           LoaderOptions(batch_size=1, workers=0)).num_classes == 7


def test_batches_per_epoch_survives_a_resume(listed: Path) -> None:
    """The trainer's steps per epoch (its LR schedule) must not shrink after resuming."""
    loader = make_loader(listed, "train", World(), LoaderOptions(batch_size=2, workers=0))
    full = loader.batches_per_epoch
    assert full == len(loader) >= 3
    loader.load_state_dict({"epoch": 0, "batch": 2, ORDER_KEY: 2})
    assert len(loader) == full - 2 and loader.batches_per_epoch == full
