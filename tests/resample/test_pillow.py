"""The resampler against the installed Pillow's resize of the same box, on the sample's crops:
within the documented bounds of stock Pillow, and byte for byte pillow-simd's."""

from __future__ import annotations

import importlib.metadata as md

import numpy as np
import PIL
import pytest
from PIL import Image

from imgprep import resample

pytestmark = [pytest.mark.realdata, pytest.mark.slow]
Box = tuple[float, float, float, float]


def pillow_simd() -> bool:
    try:
        return md.version("pillow-simd") == PIL.__version__
    except md.PackageNotFoundError:
        return False


def differences(crops: list[tuple[np.ndarray, Box]], filt: str,
                size: tuple[int, int] = (224, 224)) -> tuple[np.ndarray, np.ndarray]:
    """Per channel, the largest and the mean |ours - Pillow's| over every crop."""
    worst, total, n = np.zeros(3, np.int64), np.zeros(3, np.int64), 0
    out = np.empty((size[1], size[0], 3), np.uint8)
    for frame, box in crops:
        img = Image.frombuffer("RGBX", frame.shape[1::-1], frame, "raw", "RGBX", 0, 1)
        ref = np.asarray(img.resize(size, Image.Resampling[filt.upper()], box=box))[..., :3]
        resample.resize(frame, box, size, out, filter=filt)
        d = np.abs(out.astype(np.int16) - ref.astype(np.int16)).reshape(-1, 3)
        worst = np.maximum(worst, d.max(axis=0))
        total += d.sum(axis=0)
        n += d.shape[0]
    return worst, total / n


def test_bilinear_is_within_two_levels_and_half_a_level_on_average_of_pillows(
        shard_crops: list[tuple[np.ndarray, Box]]) -> None:
    worst, mean = differences(shard_crops, "bilinear")
    assert worst.max() <= 2 and mean.max() < 0.5, (PIL.__version__, worst, mean)


@pytest.mark.skipif(not pillow_simd(), reason=f"PIL {PIL.__version__} is not pillow-simd")
@pytest.mark.parametrize("filt", sorted(resample.FILTERS))
def test_every_filter_gives_pillow_simds_bytes(
        filt: str, shard_crops: list[tuple[np.ndarray, Box]]) -> None:
    worst, _ = differences(shard_crops[::4], filt)
    assert worst.max() == 0, worst


def test_convert_lanczos_downscale_is_within_two_levels_of_pillows(
        shard_crops: list[tuple[np.ndarray, Box]]) -> None:
    """Convert's resize shape: a center square shrunk (here 256 to 192), lanczos."""
    square = [(frame, (0.0, 0.0, 256.0, 256.0)) for frame, _ in shard_crops[::4]]
    worst, mean = differences(square, "lanczos", (192, 192))
    assert worst.max() <= 2 and mean.max() < 0.5, (PIL.__version__, worst, mean)
