"""What the nvjpeg backend (``loaders.nvjpeg``) alone does, in its CPU form; its parity with
the Pillow backend (samples, resume, errors, val pixels, the trainer) is
``test_backend_parity``'s.

With ``device="cpu"`` the backend decodes with Pillow and runs its batched crops on the CPU:
everything but nvJPEG itself, which needs no more than torchvision on a GPU. Its batches made
ahead in threads are the inline ones, a pass left part way stops its thread, and its train
crops are the Pillow backend's boxes and flips. nvJPEG's failures are played by a stand-in
decoder that refuses what it is told to; the tests marked ``gpu`` run the real one where
there is a CUDA device and torchvision.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from imgprep import World
from loaders import LoaderError
from loaders.backends import EncodedSample
from loaders.nvjpeg import cpu_decode, decode_samples, jpeg_frame, load_nvjpeg, on_device
from loaders.transforms import SampleError, TrainTransform
from tests.support import encode, jpeg, photo
from tests.support.backends import (
    BATCH,
    TOTAL,
    loader,
    same_pixels,
    steps,
    worlds,
)
from tests.support.shards import run_epoch

TRAIN_MEAN_ABS_DIFF = 1.0  # of 255: the same boxes and flips, another resampler


# ---------------------------------------------------------------------------- threads


def test_batches_made_ahead_in_threads_are_the_same(shards: Path) -> None:
    """workers=2 makes batches in a thread ahead of the consumer and decodes in a pool: the
    same batches, pixels included, as workers=0."""
    w = worlds(1, 2)[1]
    inline = run_epoch(loader(shards, "train", w, "nvjpeg", tail="pad"), 2)
    ahead = run_epoch(loader(shards, "train", w, "nvjpeg", tail="pad", workers=2,
                             prefetch_factor=3), 2)
    assert steps(ahead) == steps(inline) and same_pixels(ahead, inline)


def test_a_pass_left_part_way_stops_its_thread(shards: Path) -> None:
    ld = loader(shards, "train", World.single(), "nvjpeg", workers=2, prefetch_factor=1)
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


# ---------------------------------------------------------------------------- CUDA only

needs_torchvision = pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                                       reason="torchvision is not installed (its nvJPEG "
                                              "decodes for device='gpu')")


@pytest.mark.gpu
@needs_torchvision
@pytest.mark.parametrize("split", ["train", "val"])
def test_gpu_batches_are_the_cpu_forms_samples_on_the_gpu(shards: Path, split: str) -> None:
    """device="gpu": CUDA batches with the Pillow backend's samples step by step, made ahead
    in a thread or not, within a small bound of the CPU form's pixels (nvJPEG's IDCT and
    upsampling differ from libjpeg-turbo's)."""
    w = worlds(1, 2)[0]
    want = run_epoch(loader(shards, split, w, "nvjpeg", tail="pad"), 1)
    for workers in (0, 2):
        got = run_epoch(loader(shards, split, w, "nvjpeg", tail="pad", device="gpu",
                               workers=workers), 1)
        assert steps(got) == steps(want)
        assert all(x.is_cuda and y.is_cuda for x, y in got)
        diff = [(x.cpu().float() - y.float()).abs().mean().item()
                for (x, _), (y, _) in zip(got, want, strict=True)]
        assert max(diff) < 3.0, diff
