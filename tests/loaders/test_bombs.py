"""A sample whose header declares more pixels than Pillow's decompression-bomb check allows
(twice ``PIL.Image.MAX_IMAGE_PIXELS``) is a bad sample before any frame is made, in the
crop-aware path and in the Pillow fallback, with the same words; a half-written JPEG (no
end-of-image marker) is one too on both paths. Both follow the loader's ``on_error``."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imgprep import jpegcrop
from imgprep.convert.image import convert_image
from imgprep.errors import ImageError
from imgprep.job.world import World
from imgprep.sections import TransformOptions
from loaders import LoaderError, ShardLoader
from loaders.decode import SampleDecoder
from loaders.transforms import SampleError, TrainTransform, Transform, ValTransform, apply
from tests.support import jpeg
from tests.support.shards import run_epoch, write_split

TRANSFORMS: dict[str, Transform] = {"train": TrainTransform(size=64),
                                    "val": ValTransform(size=64, resize=72)}
REFUSED = ("refused before decoding: Image size (4225000000 pixels) exceeds limit of "
           "178956970 pixels, could be decompression bomb DOS attack. "
           "(PIL.Image.MAX_IMAGE_PIXELS sets the limit)")


def declaring(width: int, height: int) -> bytes:
    """A small real JPEG whose frame header is patched to declare ``width`` x ``height``."""
    data = bytearray(jpeg((64, 48), seed=6))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def half_written() -> bytes:
    whole = jpeg((256, 256), seed=8)
    return whole[:len(whole) // 2] + bytes(1 << 20)


def refusal(decode: SampleDecoder | None, t: Transform, data: bytes) -> str:
    """The SampleError one decode of ``data`` raises (``decode`` None: the Pillow path)."""
    out, rng = np.zeros((3, t.size, t.size), np.uint8), np.random.default_rng(0)
    with pytest.raises(SampleError) as e:
        if decode is None:
            apply(data, t, rng, out, "train-000000.tar/x")
        else:
            decode(data, rng, out, "train-000000.tar/x")
    return str(e.value)


@pytest.mark.parametrize("name", TRANSFORMS)
def test_a_header_claiming_65000_by_65000_is_refused_before_any_frame(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """It used to reach ``Frame.view``, which allocated 65000 x 65000 x 4 bytes (at the DCT
    scale) from the header alone."""
    t, bomb = TRANSFORMS[name], declaring(65_000, 65_000)
    frames: list[tuple[int, int]] = []
    view = jpegcrop.Frame.view

    def spy(self: jpegcrop.Frame, width: int, height: int) -> tuple[np.ndarray, Image.Image]:
        frames.append((width, height))
        return view(self, width, height)

    monkeypatch.setattr(jpegcrop.Frame, "view", spy)
    words = {refusal(None, t, bomb)}
    for fast in ((True, False) if jpegcrop.AVAILABLE else (False,)):
        words.add(refusal(SampleDecoder(t, fast=fast), t, bomb))
    assert words == {f"train-000000.tar/x: {REFUSED}"}
    assert frames == []


def test_the_limit_is_the_one_the_user_gives_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    t, small = TRANSFORMS["train"], jpeg((64, 48), seed=6)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 64 x 48 = 3072 > 2 x 1000
    assert jpegcrop.pixel_limit() == 2000
    decoders = [SampleDecoder(t, fast=True)] if jpegcrop.AVAILABLE else []
    for decode in [None, *decoders]:
        assert "Image size (3072 pixels) exceeds limit of 2000 pixels" in refusal(decode, t,
                                                                                 small)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # the user turned the check off
    assert jpegcrop.pixel_limit() is None
    for decode in [SampleDecoder(t, fast=False), *decoders]:
        decode(small, np.random.default_rng(0), np.zeros((3, 64, 64), np.uint8))


@pytest.mark.parametrize("name", TRANSFORMS)
def test_a_half_written_jpeg_is_a_bad_sample_on_both_paths_as_convert_says(name: str) -> None:
    t = TRANSFORMS[name]
    words = {refusal(None, t, half_written())}
    if jpegcrop.AVAILABLE:
        words.add(refusal(SampleDecoder(t, fast=True), t, half_written()))
    with pytest.raises(ImageError) as converting:  # convert's rule and words
        convert_image(half_written(), TransformOptions())
    assert str(converting.value).startswith("padded JPEG: the image data is followed by ")
    assert words == {f"train-000000.tar/x: {converting.value}"}


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_skips_or_names_them_as_any_bad_sample(tmp_path: Path, workers: int) -> None:
    bad = {3: declaring(65_000, 65_000), 6: half_written()}
    write_split(tmp_path, "train", (5, 5), lambda i: bad.get(i) or jpeg((80, 60), seed=i))

    def loader(on_error: str) -> ShardLoader:
        return ShardLoader(tmp_path, "train", World(), 2, workers=workers,
                           transform=TrainTransform(size=32), on_error=on_error, shuffle=False)

    skipping = loader("skip")
    assert len(run_epoch(skipping, 0)) == 5 and skipping.skipped == 2
    with pytest.raises(LoaderError) as e:
        run_epoch(loader("raise"), 0)
    assert REFUSED in str(e.value) and "train-000000.tar" in str(e.value)
