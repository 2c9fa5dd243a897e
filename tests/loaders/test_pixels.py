"""The loader's pixels and their version: images the crop-aware probe declines (progressive,
trailing data, RGB-coded) and images only Pillow decodes (PNG, CMYK) give pinned bytes
whichever Pillow is installed; the extension's batches stay within a unit or two of Pillow's
own bilinear resize of the same box on the real sample; a loader's state names its pixel
version, and a resume across versions is refused, naming both."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from imgprep import jpegcrop
from imgprep.job.world import World
from loaders import LoaderOptions, ShardLoader
from loaders.decode import PIXELS_IMGPREP, PIXELS_PILLOW, SampleDecoder
from loaders.errors import LoaderError
from loaders.transforms import TrainTransform, Transform, ValTransform, apply
from tests.support import jpeg
from tests.support.images import encode, photo
from tests.support.paths import REAL_DATA
from tests.support.shards import write_split

pytestmark = pytest.mark.skipif(not jpegcrop.AVAILABLE,
                                reason=f"crop-aware decoder: {jpegcrop.status()}")

# Files made with Pillow's encoder (the same bytes with pillow-simd and stock Pillow 13; a
# PIL that encodes them otherwise skips, naming the digest), and the batch rows they give.
FALLBACKS: dict[str, Callable[[], bytes]] = {
    "progressive": lambda: encode(photo((240, 180), 10), "JPEG", quality=90, progressive=True),
    "trailing": lambda: jpeg((150, 150), seed=12) + b"\x00garbage after EOI",
    "rgb-coded": lambda: encode(photo((200, 120), 4), "JPEG", quality=90, keep_rgb=True),
    "cmyk": lambda: jpeg((160, 120), seed=9, mode="CMYK"),
    "png": lambda: encode(photo((120, 90), 11), "PNG"),
}
INPUTS = {"progressive": "2c19b4c35425a912", "trailing": "de468310aef3daec",
          "rgb-coded": "b7660b51cdf52b65", "cmyk": "b424e0145b4d2c5c",
          "png": "3b6e1d19447e9805"}  # the files' sha256, first 16 digits
PINNED = {
    "progressive": "31564f77f2b1ee9fa1fc9a7517e3a866f9845bc8c23b38dd5689c6761860cfbf",
    "trailing": "8fb6f19031f0687f93289d9509f01b0a4cdac554f519a2884fe21bd685484a54",
    "rgb-coded": "6d52e80681a82b67ae92aa8b3b26552c68e5dce1c0c1d872b1f40e0737800a2f",
    "cmyk": "6efc37fcf26a99ed75bdf89475c60c7626d4003e5ac26ccb1f63b2d7ac1b7779",
    "png": "9b708b1c5ad4d1816991ac3259af4fefe499132eee5468869d52d21bcff28c33",
}
GOLDEN_TRANSFORMS: dict[str, Transform] = {"train": TrainTransform(size=56),
                                           "val": ValTransform(size=48, resize=64)}


def rows(data: bytes) -> bytes:
    """The rows the extension's path makes of ``data``: both transforms, 3 seeds, CHW."""
    out = b""
    for t in GOLDEN_TRANSFORMS.values():
        decoder = SampleDecoder(t, fast=True)
        for seed in range(3):
            row = np.empty((3, t.size, t.size), np.uint8)
            decoder(data, np.random.default_rng(seed), row)
            out += row.tobytes()
    return out


@pytest.mark.parametrize("name", FALLBACKS)
def test_fallback_pixels_are_pinned_whichever_pillow_is_installed(name: str) -> None:
    """Decoded whole by the extension's libjpeg-turbo, or by Pillow (PNG, CMYK), then
    resampled by imgprep's resampler: the pins hold with pillow-simd and with stock Pillow."""
    data = FALLBACKS[name]()
    got = hashlib.sha256(data).hexdigest()[:16]
    if got != INPUTS[name]:
        pytest.skip(f"this PIL encodes the {name} file as other bytes (sha256 {got}..., "
                    f"pinned {INPUTS[name]}...)")
    assert jpegcrop.probe(data).reason is not None  # not the region path
    assert hashlib.sha256(rows(data)).hexdigest() == PINNED[name]


BOUND_MAX, BOUND_MEAN = 2, 0.5  # per channel, against Pillow's own bilinear resize


@pytest.mark.realdata
@pytest.mark.slow
@pytest.mark.parametrize("t", [TrainTransform(), ValTransform(size=64, resize=73)],
                         ids=["train224", "val64"])
def test_pixels_stay_within_two_units_of_pillows_resize_of_the_same_box(t: Transform) -> None:
    """Over the 1,000 real sample images (their random-resized-crop boxes, or the val
    resize): per channel, the largest difference from the installed Pillow's path (its
    decode and bilinear resize of the same box) is at most 2 and the mean below 0.5 (0 and
    0 with pillow-simd)."""
    folder = REAL_DATA / "images"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent (the real sample images)")
    decoder = SampleDecoder(t, fast=True)
    most, total, count = np.zeros(3, np.int64), np.zeros(3), 0
    for i, f in enumerate(sorted(folder.iterdir())):
        data = f.read_bytes()
        ours, theirs = (np.empty((3, t.size, t.size), np.uint8) for _ in range(2))
        decoder(data, np.random.default_rng([7, i]), ours)
        apply(data, t, np.random.default_rng([7, i]), theirs)
        diff = np.abs(ours.astype(np.int16) - theirs).reshape(3, -1)
        most = np.maximum(most, diff.max(axis=1))
        total += diff.sum(axis=1)
        count += diff.shape[1]
    mean = total / count
    assert (most <= BOUND_MAX).all() and (mean < BOUND_MEAN).all(), (most, mean)


def loader(folder: Path, crop_decode: bool | None) -> ShardLoader:
    return ShardLoader(folder, "train", World(), LoaderOptions(
        batch_size=2, workers=0, transform=TrainTransform(size=32), crop_decode=crop_decode))


def test_a_state_names_its_pixel_version_and_a_resume_across_versions_is_refused(
        tmp_path: Path) -> None:
    write_split(tmp_path, "train", (5, 4), lambda i: jpeg((64, 48), seed=i))
    ours, pillow = loader(tmp_path, None), loader(tmp_path, False)
    it = iter(ours)
    next(it)
    state = ours.state_dict()
    assert state["pixels"] == PIXELS_IMGPREP and pillow.state_dict()["pixels"] == PIXELS_PILLOW
    with pytest.raises(LoaderError, match="pixel version 'imgprep-1'.*are 'pillow'"):
        pillow.load_state_dict(state)
    loader(tmp_path, True).load_state_dict(state)  # the same version resumes
    old = {k: v for k, v in state.items() if k != "pixels"}
    pillow.load_state_dict(old)  # written before pixel versions were recorded: resumes
