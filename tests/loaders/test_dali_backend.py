"""The DALI backend (``loaders.dali``) against the Pillow backend, on the CPU.

Shards are written directly in UNEQUAL sizes (57 samples, each a 256x256 JPEG whose label is
its sample id), as in ``test_shard_loader``. For explicit Worlds of 2 to 4 ranks both backends
must give every rank the same samples in every step (labels compared batch by batch), the
same batch counts stated before the epoch, the same resume (mid-epoch and 4 -> 2 ranks) and
the same handling of a corrupt JPEG; val pixels must match the Pillow backend's within a
stated bound. The GPU path (``device="gpu"``) cannot run here: its graph is checked to put the
decoder on the GPU ("mixed": CPU bytes in, GPU pixels out), the rest is the CPU path.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from imgprep.job.world import World
from loaders import PAD_LABEL, LoaderError, LoaderOptions, ShardLoader, make_loader
from loaders.epochs import TAILS
from loaders.transforms import TrainTransform, Transform, ValTransform
from tests.support import REPO, convert_sample, free_port, jpeg
from tests.support.shards import UNEQUAL_SIZES, key_of, run_epoch, write_split

SIZES = UNEQUAL_SIZES
TOTAL = sum(SIZES)
BATCH = 3
SMALL_TRAIN = TrainTransform(size=32)
SMALL_VAL = ValTransform(size=32)
LAYOUTS = {"1x2": (1, 2, "replicate"), "1x3": (1, 3, "replicate"),
           "2x2": (2, 2, "replicate"), "2x2-partition": (2, 2, "partition")}
VAL_MEAN_ABS_DIFF = 1.0  # of 255: the bound on val pixels against the Pillow backend
TRAIN = REPO / "scripts" / "train_imagenet.py"

needs_dali = pytest.mark.skipif(importlib.util.find_spec("nvidia.dali") is None,
                                reason="NVIDIA DALI is not installed (pip install "
                                       "'imgprep[dali]')")

Batch = tuple[torch.Tensor, torch.Tensor]


# ---------------------------------------------------------------------------- data




@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Read-only: a train and a val split of the same 57 samples."""
    folder = tmp_path_factory.mktemp("shards")
    for split in ("train", "val"):
        write_split(folder, split, SIZES, lambda i: jpeg((256, 256), seed=i))
    return folder


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A val split of 12 converted-size images, 256 px on the short side, landscape and
    portrait (even margins: both backends' center crops have the same box)."""
    folder = tmp_path_factory.mktemp("wide")
    write_split(folder, "val", (5, 7),
                lambda i: jpeg((320, 256) if i % 2 else (256, 384), seed=100 + i))
    return folder


def corrupt(folder: Path, sample: int) -> str:
    """Flip the first 16 bytes of ``sample``'s JPEG (not its tar header); its shard."""
    for shard in sorted(folder.glob("train-*.tar")):
        with tarfile.open(shard) as tf:
            names = tf.getnames()
            if f"{key_of(sample)}.jpg" not in names:
                continue
            at = tf.getmember(f"{key_of(sample)}.jpg").offset_data
        with open(shard, "r+b") as f:
            f.seek(at)
            chunk = f.read(16)
            f.seek(at)
            f.write(bytes(b ^ 0xFF for b in chunk))
        return shard.name
    raise AssertionError(f"sample {sample} is in no shard")


# ---------------------------------------------------------------------------- helpers


def worlds(nodes: int, local: int) -> list[World]:
    return [World(rank=r, world_size=nodes * local, local_rank=r % local, local_world_size=local,
                  node_rank=r // local, num_nodes=nodes)
            for r in range(nodes * local)]


def loader(folder: Path, split: str, world: World, backend: str, **kw: Any) -> ShardLoader:
    """A loader of either backend: the Pillow one decodes in the calling process, DALI in 2
    threads."""
    mode = kw.pop("mode", None)
    given = {"batch_size": BATCH, "transform": SMALL_TRAIN if split == "train" else SMALL_VAL,
             "workers": 0 if backend == "pillow" else 2, "backend": backend} | kw
    return ShardLoader(folder, split, world, LoaderOptions(**given), mode=mode)


def steps(batches: Sequence[Batch]) -> list[list[int]]:
    return [labels.tolist() for _, labels in batches]


# ---------------------------------------------------------------------------- the plan


@needs_dali
@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_rank_gets_the_pillow_backends_samples_in_every_step(data: Path, name: str,
                                                                    split: str) -> None:
    """Per tail and rank: the same labels batch by batch as the Pillow backend (padding
    included), the same stated count, equal on every rank (uneven aside), and uint8 NCHW
    batches with int64 labels."""
    nodes, local, mode = LAYOUTS[name]
    for tail in TAILS:
        counts = []
        for w in worlds(nodes, local):
            pil = loader(data, split, w, "pillow", tail=tail, mode=mode)
            dal = loader(data, split, w, "dali", tail=tail, mode=mode)
            assert dal.batches_per_epoch == pil.batches_per_epoch
            want, got = run_epoch(pil, 1), run_epoch(dal, 1)
            assert steps(got) == steps(want), (tail, w)
            for (images, labels), (p_images, _) in zip(got, want, strict=True):
                assert images.dtype == torch.uint8 and labels.dtype == torch.int64
                assert images.shape == p_images.shape and images.shape[1:] == (3, 32, 32)
                assert not images[labels == PAD_LABEL].any()  # padding: zero pixels
            counts.append(len(got))
        if tail != "uneven":
            assert len(set(counts)) == 1, (tail, counts)


@needs_dali
def test_full_batches_of_the_requested_size(data: Path) -> None:
    ld = loader(data, "train", World(), "dali", batch_size=8,
                transform=TrainTransform(size=64))
    batches = run_epoch(ld, 0)
    assert len(batches) == TOTAL // 8
    assert all(images.shape == (8, 3, 64, 64) and labels.shape == (8,)
               for images, labels in batches)


@needs_dali
def test_a_label_list_gets_the_pillow_backends_batches(converted: dict[str, Path]) -> None:
    """The label-list loader reads files instead of shard offsets; its DALI backend gives
    the same samples per step on 2 ranks."""
    for w in worlds(1, 2):
        got, want = (run_epoch(make_loader(converted["list"], "train", w,
                                           LoaderOptions(batch_size=4, workers=1, seed=3,
                                                         transform=SMALL_TRAIN, backend=b)), 1)
                     for b in ("dali", "pillow"))
        assert steps(got) == steps(want) and len(got) > 0


@needs_dali
@pytest.mark.parametrize("split", ["train", "val"])
def test_channels_last_batches_are_the_contiguous_ones(data: Path, split: str) -> None:
    """memory_format="channels_last": DALI lays the rows out HWC; the batches are the
    contiguous ones, NCHW-shaped with channels_last strides (padding rows zero)."""
    want, got = (run_epoch(loader(data, split, World(), "dali", tail="pad",
                                  memory_format=f), 0)
                 for f in ("contiguous", "channels_last"))
    assert len(got) == len(want) > 0
    for (a, la), (b, lb) in zip(want, got, strict=True):
        assert b.shape == a.shape and b.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(a, b) and torch.equal(la, lb)


# ---------------------------------------------------------------------------- seeds, resume


@needs_dali
def test_a_rerun_gives_the_same_pixels_and_epochs_differ(data: Path) -> None:
    w = worlds(1, 2)[1]
    first = run_epoch(loader(data, "train", w, "dali"), 2)
    again = run_epoch(loader(data, "train", w, "dali"), 2)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again, strict=True))
    other = run_epoch(loader(data, "train", w, "dali"), 3)
    assert steps(other) != steps(first)


@needs_dali
def test_mid_epoch_resume_goes_on_with_the_same_samples(data: Path) -> None:
    """A state after 3 batches, loaded by a fresh loader, gives the uninterrupted run's
    remaining samples step by step (the pixels are seeded afresh, deterministically)."""
    w = worlds(1, 2)[0]
    whole = steps(run_epoch(loader(data, "train", w, "dali", tail="pad"), 1))
    ld = loader(data, "train", w, "dali", tail="pad")
    ld.set_epoch(1)
    it = iter(ld)
    head = [next(it) for _ in range(3)]
    state = ld.state_dict()
    assert state["batch"] == 3
    rest = []
    for _ in range(2):  # twice: the resumed pass is itself reproducible
        again = loader(data, "train", w, "dali", tail="pad")
        again.load_state_dict(state)
        assert len(again) == len(whole) - 3
        rest.append(list(again))
    assert steps(head) + steps(rest[0]) == whole
    assert all(torch.equal(a[0], b[0]) for a, b in zip(*rest, strict=True))


@needs_dali
@pytest.mark.parametrize("tail", ["pad", "short", "drop"])
def test_elastic_resume_four_ranks_to_two(data: Path, tail: str) -> None:
    """4 ranks do 2 steps; rank 0's state resumes on 2 ranks with the Pillow backend's
    batches, and (pad, short) every sample is seen exactly once over both parts."""
    before, state = [], None
    for w in worlds(1, 4):
        ld = loader(data, "train", w, "dali", tail=tail)
        ld.set_epoch(0)
        it = iter(ld)
        before += [next(it) for _ in range(2)]
        if w.rank == 0:
            state = ld.state_dict()
    assert state is not None and state["samples"] == 2 * 4 * BATCH
    after: list[Batch] = []
    for w in worlds(1, 2):
        dal = loader(data, "train", w, "dali", tail=tail)
        pil = loader(data, "train", w, "pillow", tail=tail)
        dal.load_state_dict(state)
        pil.load_state_dict(state)
        got = list(dal)
        assert steps(got) == steps(list(pil))
        after += got
    seen = Counter(int(x) for _, labels in before + after for x in labels if x != PAD_LABEL)
    assert max(seen.values()) == 1
    if tail != "drop":
        assert set(seen) == set(range(TOTAL))


# ---------------------------------------------------------------------------- errors


@needs_dali
def test_corrupt_jpeg_raises_as_the_pillow_backend_does(data: Path, tmp_path: Path) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(data, folder)
    shard = corrupt(folder, 20)
    errors: dict[str, list[tuple[int, str]]] = {"pillow": [], "dali": []}
    for backend, found in errors.items():
        for w in worlds(1, 2):
            try:
                run_epoch(loader(folder, "train", w, backend, tail="pad"), 0)
            except LoaderError as e:
                found.append((w.rank, str(e)))
    assert [r for r, _ in errors["dali"]] == [r for r, _ in errors["pillow"]] and errors["dali"]
    message = errors["dali"][0][1]
    assert shard in message and key_of(20) in message and "on_error='skip'" in message
    assert len(message.splitlines()) == 1


@needs_dali
@pytest.mark.parametrize("whole_batch", [False, True], ids=["one", "a-whole-batch-too"])
def test_corrupt_jpeg_skipped_as_the_pillow_backend_does(data: Path, tmp_path: Path,
                                                         whole_batch: bool) -> None:
    """on_error="skip": the same labels batch by batch as the Pillow backend (a bad slot
    takes a good sample of its batch, or padding when there is none), the same count in
    ``skipped``, and each stand-in row is its good sample's pixels. Sample 20 is bad, and
    with ``whole_batch`` every sample of rank 1's batch 2 too."""
    folder = tmp_path / "copy"
    shutil.copytree(data, folder)
    bad = {20}
    if whole_batch:
        bad |= set(loader(data, "train", worlds(1, 2)[1], "pillow", tail="pad"
                          ).plan(0).table[2].tolist())
    for sample in bad:
        corrupt(folder, sample)
    skipped = {"pillow": 0, "dali": 0}
    for w in worlds(1, 2):
        runs = {}
        for backend in skipped:
            ld = loader(folder, "train", w, backend, tail="pad", on_error="skip")
            runs[backend] = run_epoch(ld, 0)
            skipped[backend] += ld.skipped
        assert steps(runs["dali"]) == steps(runs["pillow"])
        if whole_batch and w.rank == 1:
            assert steps(runs["dali"])[2] == [PAD_LABEL] * BATCH
            assert not runs["dali"][2][0].any()
        for images, labels in runs["dali"]:
            for i, j in itertools.combinations(range(len(labels)), 2):
                if labels[i] == labels[j] != PAD_LABEL:
                    assert torch.equal(images[i], images[j])
    assert skipped["dali"] == skipped["pillow"] == len(bad)


@needs_dali
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_jpeg_missing_its_end_is_handled_as_the_pillow_backend_does(
        tmp_path: Path, on_error: str) -> None:
    """The last 3 % of sample 20 cut off: DALI's libjpeg-turbo would decode it (grey at the
    bottom), the Pillow backend refuses it; the DALI backend must too (same labels and
    count, or the same error)."""
    def image(i: int) -> bytes:
        data = jpeg((256, 256), seed=i)
        return data[:len(data) * 97 // 100] if i == 20 else data

    write_split(tmp_path, "train", SIZES, image)
    outcome: dict[str, list[Any]] = {"pillow": [], "dali": []}
    for backend, seen in outcome.items():
        for w in worlds(1, 2):
            ld = loader(tmp_path, "train", w, backend, tail="pad", on_error=on_error)
            try:
                seen.append((steps(run_epoch(ld, 0)), ld.skipped))
            except LoaderError as e:
                seen.append(str(e))
    assert outcome["dali"] == outcome["pillow"]
    assert sum(isinstance(x, str) for x in outcome["dali"]) == (on_error == "raise")


@needs_dali
def test_a_missing_shard_is_the_readers_error(data: Path, tmp_path: Path) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(data, folder)
    (folder / "train-000002.tar").unlink()
    with pytest.raises(LoaderError, match="train-000002.tar"):
        run_epoch(loader(folder, "train", World(), "dali"), 0)


# ---------------------------------------------------------------------------- pixels


@needs_dali
def test_val_pixels_are_the_pillow_backends(wide: Path) -> None:
    """Both center-crop 224 px out of a 256 px short side (the same box); the decoders differ
    (libjpeg-turbo in both here), so the bound is a mean absolute difference of
    ``VAL_MEAN_ABS_DIFF`` (of 255) per image."""
    t = ValTransform()
    got = torch.cat([x for x, _ in run_epoch(loader(wide, "val", World(), "dali", transform=t), 0)])
    want = torch.cat([x for x, _ in run_epoch(loader(wide, "val", World(), "pillow", transform=t),
                                          0)])
    assert got.shape == want.shape == (12, 3, 224, 224)
    diff = (got.float() - want.float()).abs().mean(dim=(1, 2, 3))
    assert diff.max().item() <= VAL_MEAN_ABS_DIFF, diff.tolist()


@needs_dali
def test_train_crops_are_flipped_about_half_the_time(tmp_path: Path) -> None:
    """One symmetric-free image in every slot, crops of the whole image (scale 1, ratio 1):
    each output is the image or its mirror, both appear, and the flip is the coin's."""
    one = jpeg((256, 256), seed=7)
    write_split(tmp_path, "train", (16, 16), lambda i: one)
    t = TrainTransform(size=32, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    images = torch.cat([x for x, _ in run_epoch(loader(tmp_path, "train", World(), "dali",
                                                   transform=t, batch_size=8), 0)])
    plain = images[0] if images[0].float().mean() else images[1]
    mirrored = plain.flip(-1)
    kinds = [0 if (x.float() - plain.float()).abs().mean() < 2 else
             1 if (x.float() - mirrored.float()).abs().mean() < 2 else 2 for x in images]
    assert 2 not in kinds and 4 <= sum(kinds) <= 28, kinds


# ---------------------------------------------------------------------------- options


def test_without_dali_the_error_names_the_extra(data: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # import nvidia.dali fails
    with pytest.raises(LoaderError) as e:
        make_loader(data, "train", World(),
                    LoaderOptions(batch_size=BATCH, workers=1, backend="dali"))
    assert len(str(e.value).splitlines()) == 1
    assert "imgprep[dali]" in str(e.value) and "backend='dali'" in str(e.value)


def test_unknown_backend_and_device_are_refused(data: Path) -> None:
    with pytest.raises(ValueError, match="pillow"):
        make_loader(data, "train", World(),
                    LoaderOptions(batch_size=BATCH, workers=0, backend="opencv"))
    with pytest.raises(ValueError, match="backend='dali'"):
        make_loader(data, "train", World(),
                    LoaderOptions(batch_size=BATCH, workers=0, device="gpu"))


@needs_dali
def test_gpu_without_cuda_is_refused(data: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(LoaderError, match="device='cpu'"):
        make_loader(data, "train", World(),
                    LoaderOptions(batch_size=BATCH, workers=1, backend="dali", device="gpu"))


@needs_dali
@pytest.mark.parametrize("transform", [TrainTransform(), ValTransform()], ids=["train", "val"])
def test_gpu_graph_decodes_on_the_gpu(transform: Transform) -> None:
    """device="gpu" wires a "mixed" decoder (encoded bytes on the CPU in, pixels on the GPU
    out) and the later ops on the GPU; device="cpu" keeps everything on the CPU. The graph
    is defined, not built (building it needs a GPU)."""
    from nvidia.dali import Pipeline, fn, types

    from loaders.dali import decode_graph

    for device, want in (("gpu", "gpu"), ("cpu", "cpu")):
        with Pipeline(batch_size=2, num_threads=1, device_id=None):
            jpegs = fn.external_source(name="jpegs", dtype=types.DALIDataType.UINT8, ndim=1)
            out = decode_graph(jpegs, transform, device)
        node, chain = out, []
        while node.source.inputs:
            chain.append((node.source.name, node.device))
            node = node.source.inputs[0]
        assert node.device == "cpu" and chain[-1][0].startswith("__Image"), chain
        assert {d for _, d in chain} == {want}, chain


# ---------------------------------------------------------------------------- the trainer


@needs_dali
@pytest.mark.slow
def test_trainer_runs_two_ranks_on_the_dali_backend(sample: Path, tmp_path: Path) -> None:
    data = convert_sample(sample, tmp_path / "data", train_shards=4, val_shards=2)
    log = tmp_path / "log.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), str(TRAIN), "--data", str(data),
           "--arch", "tiny", "--batch-size", "8", "--workers", "1", "--image-size", "64",
           "--epochs", "10", "--warmup-epochs", "1", "--log-every", "1", "--timeout", "60",
           "--steps", "4", "--loader-backend", "dali", "--log-json", str(log)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    assert out[1] == "loader: dali backend, decoding on the cpu, 1 DALI thread per rank", out[:3]
    s = json.loads([line for line in out if line.startswith("{")][-1])
    assert (s["world_size"], s["step"], s["loader"]) == (2, 4, {"backend": "dali",
                                                                "device": "cpu"})
    assert s["replicas_identical"] is True and s["val"]["samples"] == 20
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert {"loader": {"backend": "dali", "device": "cpu"}} in records
    assert all(np.isfinite(r["loss"]) for r in records if "loss" in r)
