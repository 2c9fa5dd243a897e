"""The nvjpeg backend (``loaders.nvjpeg``) against the Pillow backend, in its CPU form.

Shards are written directly in UNEQUAL sizes (57 samples, each a 256x256 JPEG whose label is
its sample id), as in ``test_shard_loader``. With ``device="cpu"`` the backend decodes with
Pillow and runs its batched crops on the CPU: everything but nvJPEG itself, which needs no
more than torchvision on a GPU. For explicit Worlds of 2 to 4 ranks it must give every rank
the same samples in every step as the Pillow backend, the same batch counts, the same
resume (mid-epoch, 4 -> 2 ranks, and from the Pillow backend's own state) and the same
handling of bad samples; its train crops are the Pillow backend's boxes and flips, and its
val crops of 256 px images are the Pillow backend's pixels. nvJPEG's failures are played by
a stand-in decoder that refuses what it is told to; the tests marked ``gpu`` run the real
one where there is a CUDA device and torchvision.
"""

from __future__ import annotations

import importlib.util
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

from imgprep import World
from loaders import PAD_LABEL, LoaderError, LoaderOptions, ShardLoader, make_loader
from loaders.backends import EncodedSample
from loaders.epochs import TAILS
from loaders.nvjpeg import cpu_decode, decode_samples, jpeg_frame, load_nvjpeg, on_device
from loaders.transforms import SampleError, TrainTransform, ValTransform
from tests.support import REPO, convert_sample, encode, free_port, jpeg, photo
from tests.support.shards import UNEQUAL_SIZES, key_of, run_epoch, write_split

SIZES = UNEQUAL_SIZES
TOTAL = sum(SIZES)
BATCH = 3
SMALL_TRAIN = TrainTransform(size=32)
SMALL_VAL = ValTransform(size=32)
LAYOUTS = {"1x2": (1, 2, "replicate"), "1x3": (1, 3, "replicate"),
           "2x2": (2, 2, "replicate"), "2x2-partition": (2, 2, "partition")}
TRAIN_MEAN_ABS_DIFF = 1.0  # of 255: the same boxes and flips, another resampler
TRAIN = REPO / "scripts" / "train_imagenet.py"

Batch = tuple[torch.Tensor, torch.Tensor]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Read-only: a train and a val split of the same 57 samples."""
    folder = tmp_path_factory.mktemp("shards")
    for split in ("train", "val"):
        write_split(folder, split, SIZES, lambda i: jpeg((256, 256), seed=i))
    return folder


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A train and a val split of 12 converted-size images, 256 px on the short side,
    landscape and portrait."""
    folder = tmp_path_factory.mktemp("wide")
    for split in ("train", "val"):
        write_split(folder, split, (5, 7),
                    lambda i: jpeg((320, 256) if i % 2 else (256, 384), seed=100 + i))
    return folder


def corrupt(folder: Path, sample: int) -> str:
    """Flip the first 16 bytes of ``sample``'s JPEG (not its tar header); its shard."""
    for shard in sorted(folder.glob("train-*.tar")):
        with tarfile.open(shard) as tf:
            if f"{key_of(sample)}.jpg" not in tf.getnames():
                continue
            at = tf.getmember(f"{key_of(sample)}.jpg").offset_data
        with open(shard, "r+b") as f:
            f.seek(at)
            chunk = f.read(16)
            f.seek(at)
            f.write(bytes(b ^ 0xFF for b in chunk))
        return shard.name
    raise AssertionError(f"sample {sample} is in no shard")


def worlds(nodes: int, local: int) -> list[World]:
    return [World(rank=r, world_size=nodes * local, local_rank=r % local,
                  local_world_size=local, node_rank=r // local, num_nodes=nodes)
            for r in range(nodes * local)]


def loader(folder: Path, split: str, world: World, backend: str, **kw: Any) -> ShardLoader:
    """A loader of either backend, decoding in the calling process unless ``workers``."""
    mode = kw.pop("mode", None)
    given = {"batch_size": BATCH, "transform": SMALL_TRAIN if split == "train" else SMALL_VAL,
             "workers": 0, "backend": backend} | kw
    return ShardLoader(folder, split, world, LoaderOptions(**given), mode=mode)


def steps(batches: Sequence[Batch]) -> list[list[int]]:
    return [labels.tolist() for _, labels in batches]


def same_pixels(a: Sequence[Batch], b: Sequence[Batch]) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) for x, y in zip(a, b, strict=True))


# ---------------------------------------------------------------------------- the plan


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_rank_gets_the_pillow_backends_samples_in_every_step(data: Path, name: str,
                                                                    split: str) -> None:
    """Per tail and rank: the same labels batch by batch as the Pillow backend (padding
    included), the same stated count, equal on every rank (uneven aside), and uint8 NCHW
    batches with int64 labels, padding rows zero."""
    nodes, local, mode = LAYOUTS[name]
    for tail in TAILS:
        counts = []
        for w in worlds(nodes, local):
            pil = loader(data, split, w, "pillow", tail=tail, mode=mode)
            nv = loader(data, split, w, "nvjpeg", tail=tail, mode=mode)
            assert nv.batches_per_epoch == pil.batches_per_epoch
            want, got = run_epoch(pil, 1), run_epoch(nv, 1)
            assert steps(got) == steps(want), (tail, w)
            for (images, labels), (p_images, _) in zip(got, want, strict=True):
                assert images.dtype == torch.uint8 and labels.dtype == torch.int64
                assert images.shape == p_images.shape and images.shape[1:] == (3, 32, 32)
                assert not images[labels == PAD_LABEL].any()
            counts.append(len(got))
        if tail != "uneven":
            assert len(set(counts)) == 1, (tail, counts)


def test_full_batches_of_the_requested_size(data: Path) -> None:
    batches = run_epoch(loader(data, "train", World.single(), "nvjpeg", batch_size=8,
                               transform=TrainTransform(size=64)), 0)
    assert len(batches) == TOTAL // 8
    assert all(images.shape == (8, 3, 64, 64) and labels.shape == (8,)
               for images, labels in batches)


def test_a_label_list_gets_the_pillow_backends_batches(converted: dict[str, Path]) -> None:
    """The label-list loader reads files instead of shard offsets; the nvjpeg backend gives
    the same samples per step on 2 ranks."""
    for w in worlds(1, 2):
        got, want = (run_epoch(make_loader(converted["list"], "train", w, LoaderOptions(
                                 batch_size=4, workers=1, seed=3, transform=SMALL_TRAIN,
                                 backend=b)), 1)
                     for b in ("nvjpeg", "pillow"))
        assert steps(got) == steps(want) and len(got) > 0


@pytest.mark.parametrize("split", ["train", "val"])
def test_channels_last_batches_are_the_contiguous_ones(data: Path, split: str) -> None:
    want, got = (run_epoch(loader(data, split, World.single(), "nvjpeg", tail="pad",
                                  memory_format=f), 0) for f in ("contiguous", "channels_last"))
    assert len(got) == len(want) > 0
    for (a, la), (b, lb) in zip(want, got, strict=True):
        assert b.shape == a.shape and b.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_batches_made_ahead_in_threads_are_the_same(data: Path) -> None:
    """workers=2 makes batches in a thread ahead of the consumer and decodes in a pool: the
    same batches, pixels included, as workers=0."""
    w = worlds(1, 2)[1]
    inline = run_epoch(loader(data, "train", w, "nvjpeg", tail="pad"), 2)
    ahead = run_epoch(loader(data, "train", w, "nvjpeg", tail="pad", workers=2,
                             prefetch_factor=3), 2)
    assert steps(ahead) == steps(inline) and same_pixels(ahead, inline)


def test_a_pass_left_part_way_stops_its_thread(data: Path) -> None:
    ld = loader(data, "train", World.single(), "nvjpeg", workers=2, prefetch_factor=1)
    ld.set_epoch(0)
    it = iter(ld)
    first = next(it)
    it.close()  # type: ignore[attr-defined]
    again = run_epoch(ld, 0)  # a new pass from the start
    assert torch.equal(again[0][0], first[0]) and len(again) == TOTAL // BATCH


# ---------------------------------------------------------------------------- pixels


def test_train_crops_are_the_pillow_backends_boxes_and_flips(wide: Path) -> None:
    """224 px random-resized-crops of 256 px images (landscape and portrait): the boxes and
    flips are the Pillow backend's draws, so each image is within ``TRAIN_MEAN_ABS_DIFF``
    (of 255) of the Pillow backend's (another box or flip would be tens of levels off)."""
    got, want = (torch.cat([x for x, _ in run_epoch(
        loader(wide, "train", World.single(), b, transform=TrainTransform(), tail="pad"), 0)])
        for b in ("nvjpeg", "pillow"))
    assert got.shape == want.shape == (12, 3, 224, 224)
    diff = (got.float() - want.float()).abs().mean(dim=(1, 2, 3))
    assert diff.max().item() <= TRAIN_MEAN_ABS_DIFF, diff.tolist()
    assert (got.float() - want.flip(-1).float()).abs().mean(dim=(1, 2, 3)).min() > 2.0


def test_val_crops_of_256px_images_are_the_pillow_backends_pixels(wide: Path) -> None:
    """The center 224 px of a 256 px short side is a whole-pixel box the size of the output:
    copied, not resampled, from the same libjpeg decode."""
    got, want = (torch.cat([x for x, _ in run_epoch(
        loader(wide, "val", World.single(), b, transform=ValTransform()), 0)])
        for b in ("nvjpeg", "pillow"))
    assert got.shape == (12, 3, 224, 224) and torch.equal(got, want)


# ---------------------------------------------------------------------------- resume


def test_a_rerun_gives_the_same_pixels_and_epochs_differ(data: Path) -> None:
    w = worlds(1, 2)[1]
    first = run_epoch(loader(data, "train", w, "nvjpeg"), 2)
    assert same_pixels(first, run_epoch(loader(data, "train", w, "nvjpeg"), 2))
    assert steps(run_epoch(loader(data, "train", w, "nvjpeg"), 3)) != steps(first)


def test_mid_epoch_resume_gives_the_uninterrupted_runs_batches(data: Path) -> None:
    """A state after 3 batches, loaded by a fresh loader: the uninterrupted run's remaining
    batches, pixels included (each batch is drawn from its own seed, as Pillow's)."""
    w = worlds(1, 2)[0]
    whole = run_epoch(loader(data, "train", w, "nvjpeg", tail="pad"), 1)
    ld = loader(data, "train", w, "nvjpeg", tail="pad")
    ld.set_epoch(1)
    it = iter(ld)
    head = [next(it) for _ in range(3)]
    state = ld.state_dict()
    assert state["batch"] == 3
    again = loader(data, "train", w, "nvjpeg", tail="pad")
    again.load_state_dict(state)
    assert len(again) == len(whole) - 3
    assert same_pixels(head + list(again), whole)


@pytest.mark.parametrize("tail", ["pad", "short", "drop"])
def test_elastic_resume_four_ranks_to_two(data: Path, tail: str) -> None:
    """4 ranks do 2 steps; rank 0's state resumes on 2 ranks with the Pillow backend's
    batches, and (pad, short) every sample is seen exactly once over both parts."""
    before, state = [], None
    for w in worlds(1, 4):
        ld = loader(data, "train", w, "nvjpeg", tail=tail)
        ld.set_epoch(0)
        it = iter(ld)
        before += [next(it) for _ in range(2)]
        if w.rank == 0:
            state = ld.state_dict()
    assert state is not None and state["samples"] == 2 * 4 * BATCH
    after: list[Batch] = []
    for w in worlds(1, 2):
        nv, pil = (loader(data, "train", w, b, tail=tail) for b in ("nvjpeg", "pillow"))
        nv.load_state_dict(state)
        pil.load_state_dict(state)
        got = list(nv)
        assert steps(got) == steps(list(pil))
        after += got
    seen = Counter(int(x) for _, labels in before + after for x in labels if x != PAD_LABEL)
    assert max(seen.values()) == 1
    if tail != "drop":
        assert set(seen) == set(range(TOTAL))


def test_a_resume_across_backends_keeps_the_sample_order(data: Path) -> None:
    """A Pillow backend's state resumes on the nvjpeg backend (and back) with the samples an
    uninterrupted run of either gives."""
    w = worlds(1, 2)[1]
    whole = steps(run_epoch(loader(data, "train", w, "pillow", tail="short"), 4))
    for first, then in (("pillow", "nvjpeg"), ("nvjpeg", "pillow")):
        ld = loader(data, "train", w, first, tail="short")
        ld.set_epoch(4)
        it = iter(ld)
        head = [next(it) for _ in range(4)]
        other = loader(data, "train", w, then, tail="short")
        other.load_state_dict(ld.state_dict())
        assert steps(head) + steps(list(other)) == whole, (first, then)


# ---------------------------------------------------------------------------- errors


def test_corrupt_jpeg_raises_as_the_pillow_backend_does(data: Path, tmp_path: Path) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(data, folder)
    shard = corrupt(folder, 20)
    errors: dict[str, list[tuple[int, str]]] = {"pillow": [], "nvjpeg": []}
    for backend, found in errors.items():
        for w in worlds(1, 2):
            try:
                run_epoch(loader(folder, "train", w, backend, tail="pad"), 0)
            except LoaderError as e:
                found.append((w.rank, str(e)))
    assert [r for r, _ in errors["nvjpeg"]] == [r for r, _ in errors["pillow"]]
    assert errors["nvjpeg"]
    message = errors["nvjpeg"][0][1]
    assert shard in message and key_of(20) in message and "on_error='skip'" in message
    assert len(message.splitlines()) == 1


@pytest.mark.parametrize("whole_batch", [False, True], ids=["one", "a-whole-batch-too"])
def test_corrupt_jpeg_skipped_as_the_pillow_backend_does(data: Path, tmp_path: Path,
                                                         whole_batch: bool) -> None:
    """on_error="skip": the same labels batch by batch as the Pillow backend (a bad slot
    takes a good sample of its batch, or padding when there is none), the same count in
    ``skipped``, and each stand-in row is its good sample's pixels."""
    folder = tmp_path / "copy"
    shutil.copytree(data, folder)
    bad = {20}
    if whole_batch:
        bad |= set(loader(data, "train", worlds(1, 2)[1], "pillow", tail="pad"
                          ).plan(0).table[2].tolist())
    for sample in bad:
        corrupt(folder, sample)
    skipped = {"pillow": 0, "nvjpeg": 0}
    for w in worlds(1, 2):
        runs = {}
        for backend in skipped:
            ld = loader(folder, "train", w, backend, tail="pad", on_error="skip", workers=1)
            runs[backend] = run_epoch(ld, 0)
            skipped[backend] += ld.skipped
        assert steps(runs["nvjpeg"]) == steps(runs["pillow"])
        if whole_batch and w.rank == 1:
            assert steps(runs["nvjpeg"])[2] == [PAD_LABEL] * BATCH
            assert not runs["nvjpeg"][2][0].any()
        for images, labels in runs["nvjpeg"]:
            for i in range(len(labels)):
                for j in range(i + 1, len(labels)):
                    if labels[i] == labels[j] != PAD_LABEL:
                        assert torch.equal(images[i], images[j])
    assert skipped["nvjpeg"] == skipped["pillow"] == len(bad)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_jpeg_missing_its_end_is_handled_as_the_pillow_backend_does(
        tmp_path: Path, on_error: str) -> None:
    def image(i: int) -> bytes:
        data = jpeg((256, 256), seed=i)
        return data[:len(data) * 97 // 100] if i == 20 else data

    write_split(tmp_path, "train", SIZES, image)
    outcome: dict[str, list[Any]] = {"pillow": [], "nvjpeg": []}
    for backend, seen in outcome.items():
        for w in worlds(1, 2):
            ld = loader(tmp_path, "train", w, backend, tail="pad", on_error=on_error)
            try:
                seen.append((steps(run_epoch(ld, 0)), ld.skipped))
            except LoaderError as e:
                seen.append(("raised", key_of(20) in str(e)))
    assert outcome["nvjpeg"] == outcome["pillow"]
    assert outcome["nvjpeg"].count(("raised", True)) == (on_error == "raise")


def test_a_missing_shard_is_the_readers_error(data: Path, tmp_path: Path) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(data, folder)
    (folder / "train-000002.tar").unlink()
    for workers in (0, 2):
        with pytest.raises(LoaderError, match="train-000002.tar"):
            run_epoch(loader(folder, "train", World.single(), "nvjpeg", workers=workers), 0)


# ---------------------------------------------------------------------------- decoding


def sample(data: bytes, n: int = 0) -> EncodedSample:
    return EncodedSample(where=f"shard.tar: key{n}", data=data, label=n)


def test_only_whole_huffman_jpegs_of_one_or_three_components_go_to_nvjpeg() -> None:
    rgb = jpeg((40, 30))
    assert jpeg_frame(rgb) == (0xC0, 40, 30, 3) and on_device(rgb)
    assert on_device(jpeg((40, 30), mode="L"))
    progressive = encode(photo((40, 30), 1), "JPEG", quality=90, progressive=True)
    assert jpeg_frame(progressive) == (0xC2, 40, 30, 3) and on_device(progressive)
    assert jpeg_frame(jpeg((40, 30), mode="CMYK"))[3] == 4  # type: ignore[index]
    assert not on_device(jpeg((40, 30), mode="CMYK"))
    assert not on_device(rgb[:-10])  # cut short: no end marker
    assert jpeg_frame(encode(photo((40, 30), 1), "PNG")) is None and jpeg_frame(b"") is None


def refusing(bad: set[bytes], calls: list[int]) -> Any:
    """A stand-in for nvJPEG: decodes as Pillow does, and fails a whole batch, as
    torchvision does, when it holds a sample of ``bad``; ``calls`` gets each batch's size."""
    def decode(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        calls.append(len(encoded))
        datas = [bytes(t.numpy()) for t in encoded]
        if any(d in bad for d in datas):
            raise RuntimeError("Error while decoding JPEG images")
        return [cpu_decode(d, "nvjpeg").to(device) for d in datas]
    return decode


def test_what_nvjpeg_refuses_falls_back_to_the_cpu_decode() -> None:
    """A batch nvJPEG fails is decoded one sample at a time; the sample it fails again is
    decoded by Pillow (the same pixels here), one Pillow cannot decode either is bad, and
    what nvJPEG is never given (a PNG) goes straight to Pillow."""
    good, png = [jpeg((48, 32), seed=i) for i in range(4)], encode(photo((20, 20), 1), "PNG")
    refused = jpeg((48, 32), seed=9)
    broken = b"\xff\xd8" + jpeg((48, 32), seed=8)[2:200] + b"\xff\xd9"
    items = [sample(d, n) for n, d in enumerate([good[0], refused, good[1], png, broken])]
    calls: list[int] = []
    decoded, on_cpu = decode_samples(items, refusing({refused, broken}, calls),
                                     torch.device("cpu"), lambda f, a: list(map(f, a)))
    assert calls == [4, 1, 1, 1, 1]  # the batch, then each of its samples
    assert on_cpu == 3 and isinstance(decoded[4], SampleError) and "key4" in str(decoded[4])
    for d, image in zip([good[0], refused, good[1], png], decoded, strict=False):
        assert isinstance(image, torch.Tensor) and torch.equal(image, cpu_decode(d, "x"))
    assert decoded[3].shape == (3, 20, 20)  # type: ignore[union-attr]


def test_without_torchvision_the_gpu_decoder_says_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision fails
    monkeypatch.setitem(sys.modules, "torchvision.io", None)
    with pytest.raises(LoaderError) as e:
        load_nvjpeg(3)
    text = str(e.value)
    assert len(text.splitlines()) == 1 and text.startswith("rank 3: backend='nvjpeg'")
    assert "--no-deps" in text and "device='cpu'" in text


def test_gpu_without_cuda_is_refused(data: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(LoaderError, match="device='cpu'"):
        make_loader(data, "train", World.single(), LoaderOptions(
            batch_size=BATCH, workers=1, backend="nvjpeg", device="gpu"))


# ---------------------------------------------------------------------------- the trainer


@pytest.mark.slow
def test_trainer_runs_two_ranks_on_the_nvjpeg_backend(sample: Path, tmp_path: Path) -> None:
    data = convert_sample(sample, tmp_path / "data", train_shards=4, val_shards=2)
    log = tmp_path / "log.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), str(TRAIN), "--data", str(data),
           "--arch", "tiny", "--batch-size", "8", "--workers", "1", "--image-size", "64",
           "--epochs", "10", "--warmup-epochs", "1", "--log-every", "1", "--timeout", "60",
           "--steps", "4", "--loader-backend", "nvjpeg", "--log-json", str(log)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    assert out[1] == "loader: nvjpeg backend, decoding on the cpu, 1 worker per rank", out[:3]
    s = json.loads([line for line in out if line.startswith("{")][-1])
    assert (s["world_size"], s["step"], s["loader"]) == (2, 4, {"backend": "nvjpeg",
                                                                "device": "cpu"})
    assert s["replicas_identical"] is True and s["val"]["samples"] == 20
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert all(np.isfinite(r["loss"]) for r in records if "loss" in r)


# ---------------------------------------------------------------------------- CUDA only

needs_torchvision = pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                                       reason="torchvision is not installed (its nvJPEG "
                                              "decodes for device='gpu')")


@pytest.mark.gpu
@needs_torchvision
@pytest.mark.parametrize("split", ["train", "val"])
def test_gpu_batches_are_the_cpu_forms_samples_on_the_gpu(data: Path, split: str) -> None:
    """device="gpu": CUDA batches with the Pillow backend's samples step by step, made ahead
    in a thread or not, within a small bound of the CPU form's pixels (nvJPEG's IDCT and
    upsampling differ from libjpeg-turbo's)."""
    w = worlds(1, 2)[0]
    want = run_epoch(loader(data, split, w, "nvjpeg", tail="pad"), 1)
    for workers in (0, 2):
        got = run_epoch(loader(data, split, w, "nvjpeg", tail="pad", device="gpu",
                               workers=workers), 1)
        assert steps(got) == steps(want)
        assert all(x.is_cuda and y.is_cuda for x, y in got)
        diff = [(x.cpu().float() - y.float()).abs().mean().item()
                for (x, _), (y, _) in zip(got, want, strict=True)]
        assert max(diff) < 3.0, diff
