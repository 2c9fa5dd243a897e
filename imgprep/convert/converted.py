"""What converting one image gives: the output JPEG, the facts about the original worth
keeping, and (when asked) the output's level counts and pixels for the split's statistics.

Statistics are integers that add up the same in any order (a task sums level histograms and
turns the total into sums once: ``sums_of_histogram``), so mean and std do not depend on the
worker count.
"""

from __future__ import annotations

import array
from dataclasses import dataclass

import numpy as np
from PIL import Image

_LEVELS = np.arange(256, dtype=np.int64)


@dataclass(frozen=True)
class Converted:
    """The encoded output (``size``: its width and height), the original's size, Pillow's
    mode and format names for it, and what was asked for besides: ``histogram`` (the output's
    R, G, B level counts, 768 int64) and ``pixels`` (the output, height x width x 3 uint8);
    ``warning``: what reading a JPEG's data to its end found in an image that is still
    whole (libjpeg's warnings, a few trailing bytes), for the warnings log."""

    jpeg: bytes
    size: tuple[int, int]
    original_size: tuple[int, int]
    original_mode: str
    original_format: str
    histogram: np.ndarray | None = None
    pixels: np.ndarray | None = None
    warning: str = ""  # what reading the whole original found (the warnings log), if anything
    image: tuple[str, bytes] | None = None  # the shard's image member (--store); None: .jpg


def channel_histogram(img: Image.Image) -> np.ndarray:
    """An RGB image's 3 x 256 level counts as one int64 vector."""
    return np.frombuffer(array.array("q", img.histogram()), dtype=np.int64)


def sums_of_histogram(hist: np.ndarray) -> np.ndarray:
    """``[[sum_R, sum_G, sum_B], [sumsq_R, …], [pixels]*3]`` of a (summed) RGB histogram."""
    h = np.asarray(hist, dtype=np.int64).reshape(3, 256)
    return np.stack([h @ _LEVELS, h @ (_LEVELS * _LEVELS), h.sum(axis=1)])


def channel_sums(img: Image.Image) -> np.ndarray:
    """Exact integer ``[[sum_R, sum_G, sum_B], [sumsq_R, …], [pixels]*3]`` of an RGB image."""
    return sums_of_histogram(channel_histogram(img))


def center_pixels(pixels: np.ndarray, size: int) -> np.ndarray:
    """The central ``size`` x ``size`` of height x width x 3 pixels (all of them in
    center-crop mode)."""
    h, w = pixels.shape[:2]
    if (w, h) == (size, size):
        return pixels
    left, top = (w - size) // 2, (h - size) // 2
    return pixels[top:top + size, left:left + size]
