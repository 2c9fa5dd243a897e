"""The decoder backends (``loaders.dali``, ``loaders.nvjpeg``) against the Pillow backend, on
the CPU: every test runs once a backend (DALI's skip where it is not installed).

Shards are written directly in UNEQUAL sizes (57 samples, each a 256x256 JPEG whose label is
its sample id: ``tests.support.backends``), as in ``test_shard_loader``. For explicit Worlds
of 2 to 4 ranks each backend must give every rank the same samples in every step as the
Pillow backend (labels compared batch by batch), the same batch counts stated before the
epoch, the same resume (mid-epoch, 4 -> 2 ranks, and from another backend's state) and the
same handling of a corrupt or cut-short JPEG and of a missing shard; val crops of 256 px
images must be the Pillow backend's pixels within each backend's bound. The trainer runs 2
ranks on each. What one backend alone does: ``test_dali_backend``, ``test_nvjpeg_backend``.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from imgprep import World
from loaders import PAD_LABEL, LoaderError, LoaderOptions, make_loader
from loaders.epochs import TAILS
from loaders.transforms import TrainTransform, ValTransform
from tests.support import REPO, convert_sample, free_port, jpeg
from tests.support.backends import (
    BATCH,
    DALI,
    LAYOUTS,
    NVJPEG,
    SIZES,
    SMALL_TRAIN,
    TOTAL,
    Backend,
    Batch,
    corrupt,
    loader,
    same_pixels,
    steps,
    worlds,
)
from tests.support.shards import key_of, run_epoch, write_split

TRAIN = REPO / "scripts" / "train_imagenet.py"

needs_dali = pytest.mark.skipif(importlib.util.find_spec("nvidia.dali") is None,
                                reason="NVIDIA DALI is not installed (pip install "
                                       "'imgprep[dali]')")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """torch's ops in this process on one thread: the nvjpeg backend's batched crops run them
    here, and torch's default, a thread a core, spinning beside other busy processes (a
    loaded machine, or the test run's other worker) made its tests 3.5 times slower on 2
    cores. The pixels do not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=[pytest.param(DALI, id="dali", marks=needs_dali),
                                        pytest.param(NVJPEG, id="nvjpeg")])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each backend in turn (module scope: a backend's tests run together)."""
    b: Backend = request.param
    return b


# ---------------------------------------------------------------------------- the plan


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_rank_gets_the_pillow_backends_samples_in_every_step(
        backend: Backend, shards: Path, name: str, split: str) -> None:
    """Per tail and rank: the same labels batch by batch as the Pillow backend (padding
    included), the same stated count, equal on every rank (uneven aside), and uint8 NCHW
    batches with int64 labels, padding rows zero."""
    nodes, local, mode = LAYOUTS[name]
    for tail in TAILS:
        counts = []
        for w in worlds(nodes, local):
            pil = loader(shards, split, w, "pillow", tail=tail, mode=mode)
            ld = loader(shards, split, w, backend.name, tail=tail, mode=mode)
            assert ld.batches_per_epoch == pil.batches_per_epoch
            want, got = run_epoch(pil, 1), run_epoch(ld, 1)
            assert steps(got) == steps(want), (tail, w)
            for (images, labels), (p_images, _) in zip(got, want, strict=True):
                assert images.dtype == torch.uint8 and labels.dtype == torch.int64
                assert images.shape == p_images.shape and images.shape[1:] == (3, 32, 32)
                assert not images[labels == PAD_LABEL].any()
            counts.append(len(got))
        if tail != "uneven":
            assert len(set(counts)) == 1, (tail, counts)


def test_full_batches_of_the_requested_size(backend: Backend, shards: Path) -> None:
    batches = run_epoch(loader(shards, "train", World.single(), backend.name, batch_size=8,
                               transform=TrainTransform(size=64)), 0)
    assert len(batches) == TOTAL // 8
    assert all(images.shape == (8, 3, 64, 64) and labels.shape == (8,)
               for images, labels in batches)


def test_a_label_list_gets_the_pillow_backends_batches(backend: Backend,
                                                       converted: dict[str, Path]) -> None:
    """The label-list loader reads files instead of shard offsets; the backend gives the same
    samples per step on 2 ranks."""
    for w in worlds(1, 2):
        got, want = (run_epoch(make_loader(converted["list"], "train", w, LoaderOptions(
                                 batch_size=4, workers=1, seed=3, transform=SMALL_TRAIN,
                                 backend=b)), 1)
                     for b in (backend.name, "pillow"))
        assert steps(got) == steps(want) and len(got) > 0


@pytest.mark.parametrize("split", ["train", "val"])
def test_channels_last_batches_are_the_contiguous_ones(backend: Backend, shards: Path,
                                                       split: str) -> None:
    """memory_format="channels_last": the batches are the contiguous ones, NCHW-shaped with
    channels_last strides (padding rows zero)."""
    want, got = (run_epoch(loader(shards, split, World.single(), backend.name, tail="pad",
                                  memory_format=f), 0) for f in ("contiguous", "channels_last"))
    assert len(got) == len(want) > 0
    for (a, la), (b, lb) in zip(want, got, strict=True):
        assert b.shape == a.shape and b.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(a, b) and torch.equal(la, lb)


# ---------------------------------------------------------------------------- pixels


def test_val_crops_of_256px_images_are_the_pillow_backends_pixels(backend: Backend,
                                                                   wide: Path) -> None:
    """Both center-crop 224 px out of a 256 px short side (the same box, whole pixels, the
    size of the output); each image is within the backend's mean absolute difference of the
    Pillow backend's: nvjpeg's CPU form copies the same libjpeg decode (0: equal), DALI
    decodes with its own libjpeg-turbo (1 of 255)."""
    got, want = (torch.cat([x for x, _ in run_epoch(
        loader(wide, "val", World.single(), b, transform=ValTransform()), 0)])
        for b in (backend.name, "pillow"))
    assert got.shape == want.shape == (12, 3, 224, 224)
    diff = (got.float() - want.float()).abs().mean(dim=(1, 2, 3))
    assert diff.max().item() <= backend.val_mean_abs_diff, diff.tolist()


# ---------------------------------------------------------------------------- seeds, resume


def test_a_rerun_gives_the_same_pixels_and_epochs_differ(backend: Backend, shards: Path) -> None:
    w = worlds(1, 2)[1]
    first = run_epoch(loader(shards, "train", w, backend.name), 2)
    assert same_pixels(first, run_epoch(loader(shards, "train", w, backend.name), 2))
    assert steps(run_epoch(loader(shards, "train", w, backend.name), 3)) != steps(first)


def test_mid_epoch_resume_goes_on_with_the_same_samples(backend: Backend, shards: Path) -> None:
    """A state after 3 batches, loaded by a fresh loader, gives the uninterrupted run's
    remaining samples step by step, and the resumed pass is itself reproducible; nvjpeg's
    batches are the uninterrupted run's pixels too (each batch drawn from its own seed, as
    Pillow's), DALI's are seeded afresh, deterministically."""
    w = worlds(1, 2)[0]
    whole = run_epoch(loader(shards, "train", w, backend.name, tail="pad"), 1)
    ld = loader(shards, "train", w, backend.name, tail="pad")
    ld.set_epoch(1)
    it = iter(ld)
    head = [next(it) for _ in range(3)]
    state = ld.state_dict()
    assert state["batch"] == 3
    rest = []
    for _ in range(2):
        again = loader(shards, "train", w, backend.name, tail="pad")
        again.load_state_dict(state)
        assert len(again) == len(whole) - 3
        rest.append(list(again))
    assert steps(head) + steps(rest[0]) == steps(whole)
    assert same_pixels(*rest)
    if backend.resumes_pixels:
        assert same_pixels(head + rest[0], whole)


@pytest.mark.parametrize("tail", ["pad", "short", "drop"])
def test_elastic_resume_four_ranks_to_two(backend: Backend, shards: Path, tail: str) -> None:
    """4 ranks do 2 steps; rank 0's state resumes on 2 ranks with the Pillow backend's
    batches, and (pad, short) every sample is seen exactly once over both parts."""
    before, state = [], None
    for w in worlds(1, 4):
        ld = loader(shards, "train", w, backend.name, tail=tail)
        ld.set_epoch(0)
        it = iter(ld)
        before += [next(it) for _ in range(2)]
        if w.rank == 0:
            state = ld.state_dict()
    assert state is not None and state["samples"] == 2 * 4 * BATCH
    after: list[Batch] = []
    for w in worlds(1, 2):
        ld, pil = (loader(shards, "train", w, b, tail=tail) for b in (backend.name, "pillow"))
        ld.load_state_dict(state)
        pil.load_state_dict(state)
        got = list(ld)
        assert steps(got) == steps(list(pil))
        after += got
    seen = Counter(int(x) for _, labels in before + after for x in labels if x != PAD_LABEL)
    assert max(seen.values()) == 1
    if tail != "drop":
        assert set(seen) == set(range(TOTAL))


def test_a_resume_across_backends_keeps_the_sample_order(backend: Backend, shards: Path) -> None:
    """A Pillow backend's state resumes on this backend (and back) with the samples an
    uninterrupted run of either gives."""
    w = worlds(1, 2)[1]
    whole = steps(run_epoch(loader(shards, "train", w, "pillow", tail="short"), 4))
    for first, then in (("pillow", backend.name), (backend.name, "pillow")):
        ld = loader(shards, "train", w, first, tail="short")
        ld.set_epoch(4)
        it = iter(ld)
        head = [next(it) for _ in range(4)]
        other = loader(shards, "train", w, then, tail="short")
        other.load_state_dict(ld.state_dict())
        assert steps(head) + steps(list(other)) == whole, (first, then)


# ---------------------------------------------------------------------------- errors


def test_corrupt_jpeg_raises_as_the_pillow_backend_does(backend: Backend, shards: Path,
                                                        tmp_path: Path) -> None:
    folder = shutil.copytree(shards, tmp_path / "copy")
    shard = corrupt(folder, 20)
    errors: dict[str, list[tuple[int, str]]] = {"pillow": [], backend.name: []}
    for name, found in errors.items():
        for w in worlds(1, 2):
            try:
                run_epoch(loader(folder, "train", w, name, tail="pad"), 0)
            except LoaderError as e:
                found.append((w.rank, str(e)))
    assert [r for r, _ in errors[backend.name]] == [r for r, _ in errors["pillow"]]
    assert errors[backend.name]
    message = errors[backend.name][0][1]
    assert shard in message and key_of(20) in message and "on_error='skip'" in message
    assert len(message.splitlines()) == 1


@pytest.mark.parametrize("whole_batch", [False, True], ids=["one", "a-whole-batch-too"])
def test_corrupt_jpeg_skipped_as_the_pillow_backend_does(backend: Backend, shards: Path,
                                                         tmp_path: Path,
                                                         whole_batch: bool) -> None:
    """on_error="skip", the backend decoding in threads: the same labels batch by batch as the
    Pillow backend (a bad slot takes a good sample of its batch, or padding when there is
    none), the same count in ``skipped``, and each stand-in row is its good sample's pixels.
    Sample 20 is bad, and with ``whole_batch`` every sample of rank 1's batch 2 too."""
    folder = shutil.copytree(shards, tmp_path / "copy")
    bad = {20}
    if whole_batch:
        bad |= set(loader(shards, "train", worlds(1, 2)[1], "pillow", tail="pad"
                          ).plan(0).table[2].tolist())
    for sample in bad:
        corrupt(folder, sample)
    skipped = {"pillow": 0, backend.name: 0}
    for w in worlds(1, 2):
        runs = {}
        for name in skipped:
            threads = {"workers": backend.workers[-1]} if name == backend.name else {}
            ld = loader(folder, "train", w, name, tail="pad", on_error="skip", **threads)
            runs[name] = run_epoch(ld, 0)
            skipped[name] += ld.skipped
        got = runs[backend.name]
        assert steps(got) == steps(runs["pillow"])
        if whole_batch and w.rank == 1:
            assert steps(got)[2] == [PAD_LABEL] * BATCH and not got[2][0].any()
        for images, labels in got:
            for i, j in itertools.combinations(range(len(labels)), 2):
                if labels[i] == labels[j] != PAD_LABEL:
                    assert torch.equal(images[i], images[j])
    assert skipped[backend.name] == skipped["pillow"] == len(bad)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_jpeg_missing_its_end_is_handled_as_the_pillow_backend_does(
        backend: Backend, tmp_path: Path, on_error: str) -> None:
    """The last 3 % of sample 20 cut off: libjpeg-turbo would decode it (grey at the bottom),
    the Pillow backend refuses it; the backend must too (the same labels and count, or the
    same error, naming the sample)."""
    def image(i: int) -> bytes:
        data = jpeg((256, 256), seed=i)
        return data[:len(data) * 97 // 100] if i == 20 else data

    write_split(tmp_path, "train", SIZES, image)
    outcome: dict[str, list[Any]] = {"pillow": [], backend.name: []}
    for name, seen in outcome.items():
        for w in worlds(1, 2):
            ld = loader(tmp_path, "train", w, name, tail="pad", on_error=on_error)
            try:
                seen.append((steps(run_epoch(ld, 0)), ld.skipped))
            except LoaderError as e:
                seen.append(str(e))
    assert outcome[backend.name] == outcome["pillow"]
    raised = [x for x in outcome[backend.name] if isinstance(x, str)]
    assert len(raised) == (on_error == "raise") and all(key_of(20) in x for x in raised)


def test_a_missing_shard_is_the_readers_error(backend: Backend, shards: Path,
                                              tmp_path: Path) -> None:
    folder = shutil.copytree(shards, tmp_path / "copy")
    (folder / "train-000002.tar").unlink()
    for workers in backend.workers:
        with pytest.raises(LoaderError, match="train-000002.tar"):
            run_epoch(loader(folder, "train", World.single(), backend.name, workers=workers), 0)


# ---------------------------------------------------------------------------- options


def test_unknown_backend_and_device_are_refused(shards: Path) -> None:
    with pytest.raises(ValueError, match="pillow"):
        make_loader(shards, "train", World(),
                    LoaderOptions(batch_size=BATCH, workers=0, backend="opencv"))
    with pytest.raises(ValueError, match="backend='dali'"):
        make_loader(shards, "train", World(),
                    LoaderOptions(batch_size=BATCH, workers=0, device="gpu"))


def test_gpu_without_cuda_is_refused(backend: Backend, shards: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(LoaderError, match="device='cpu'"):
        make_loader(shards, "train", World.single(), LoaderOptions(
            batch_size=BATCH, workers=1, backend=backend.name, device="gpu"))


# ---------------------------------------------------------------------------- the trainer


@pytest.fixture(scope="module")
def trainer_data(sample: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Read-only: the fake set converted, train and val, for both backends' trainer runs."""
    return convert_sample(sample, tmp_path_factory.mktemp("trainer-data"), train_shards=4,
                          val_shards=2)


@pytest.mark.slow
def test_trainer_runs_two_ranks_on_the_backend(backend: Backend, trainer_data: Path,
                                               tmp_path: Path) -> None:
    """torchrun, 2 Gloo ranks, the tiny net, 4 steps and validation with
    ``--loader-backend``: its loader line, the backend in the summary and the log, the
    replicas identical, finite losses."""
    log = tmp_path / "log.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), str(TRAIN), "--data", str(trainer_data),
           "--arch", "tiny", "--batch-size", "8", "--workers", "1", "--image-size", "64",
           "--epochs", "10", "--warmup-epochs", "1", "--log-every", "1", "--timeout", "60",
           "--steps", "4", "--loader-backend", backend.name, "--log-json", str(log)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    assert out[1] == backend.trainer_line, out[:3]
    which = {"backend": backend.name, "device": "cpu"}
    s = json.loads([line for line in out if line.startswith("{")][-1])
    assert (s["world_size"], s["step"], s["loader"]) == (2, 4, which)
    assert s["replicas_identical"] is True and s["val"]["samples"] == 20
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert {"loader": which} in records
    assert all(np.isfinite(r["loss"]) for r in records if "loss" in r)
