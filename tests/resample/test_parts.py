"""A part of an image resampled with the image's box gives the bytes the whole image gives:
the weights are computed in the image's coordinates and then moved onto the part, never from
a box shifted into the part's own (which rounds differently in the last bits). A part that
does not hold every pixel the filter reads is refused, as are parts outside their image."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from imgprep import resample

pytestmark = pytest.mark.skipif(not resample.AVAILABLE,
                                reason=f"the resampler: {resample.status()}")

FILTERS = (0, 1, 2, 3, 4, 5)  # Pillow's numbers: nearest to hamming
SUPPORT = {0: 0.5, 1: 3.0, 2: 1.0, 3: 2.0, 4: 0.5, 5: 1.0}


def resized(img: np.ndarray, box: tuple[float, ...], out: tuple[int, int], flt: int,
            part: tuple[int, int, int, int] | None = None) -> np.ndarray:
    """``img`` (H x W x 3) resized, or only its rows and columns ``part`` (x0, y0, x1, y1)
    given to the resampler with the image's box."""
    from imgprep import _jpegcrop

    h, w = img.shape[:2]
    x0, y0, x1, y1 = part or (0, 0, w, h)
    src = np.ascontiguousarray(img[y0:y1, x0:x1])
    dst = np.zeros(out[0] * out[1] * 3, np.uint8)
    args: list[Any] = [src, x1 - x0, y1 - y0, (x1 - x0) * 3, 3, box, out[0], out[1],
                       (0, 0, out[0], out[1]), dst, flt, False, False, -1]
    if part is not None:
        args.append((x0, y0, w, h))
    _jpegcrop.resize(*args)
    return dst


def reach(lo: float, hi: float, out: int, limit: int, flt: int) -> tuple[int, int]:
    """The pixels a resample of [lo, hi) to ``out`` may read, with a pixel to spare."""
    s = SUPPORT[flt] * max(1.0, (hi - lo) / out)
    return max(0, int(np.floor(lo - s)) - 1), min(limit, int(np.ceil(hi + s)) + 1)


@pytest.mark.parametrize("flt", FILTERS)
def test_a_part_with_the_images_box_gives_the_whole_images_bytes(flt: int) -> None:
    rng = np.random.default_rng(flt)
    for _ in range(60):
        w, h = (int(v) for v in rng.integers(20, 160, 2))
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        left, top = float(rng.uniform(0, w / 2)), float(rng.uniform(0, h / 2))
        box = (left, top, float(rng.uniform(left + 1, w)), float(rng.uniform(top + 1, h)))
        out = (int(rng.integers(8, 300)), int(rng.integers(8, 300)))
        x0, x1 = reach(box[0], box[2], out[0], w, flt)
        y0, y1 = reach(box[1], box[3], out[1], h, flt)
        whole = resized(img, box, out, flt)
        assert np.array_equal(resized(img, box, out, flt, (x0, y0, x1, y1)), whole), (w, h, box)


@pytest.mark.parametrize("flt", FILTERS)
def test_a_part_short_of_the_filters_reach_is_refused(flt: int) -> None:
    img = np.zeros((100, 100, 3), np.uint8)
    box = (20.0, 20.0, 80.0, 80.0)
    with pytest.raises(ValueError, match="does not hold"):
        resized(img, box, (30, 30), flt, (30, 20, 80, 80))  # columns 20-29 left out


@pytest.mark.parametrize("part", [(-1, 0, 100, 100), (1, 0, 50, 100), (60, 0, 100, 100),
                                  (0, 0, 2**40, 100), (0, 2**62, 100, 100)])
def test_a_part_outside_its_image_is_refused(part: tuple[int, int, int, int]) -> None:
    from imgprep import _jpegcrop

    src = np.zeros(100 * 50 * 3, np.uint8)
    dst = np.zeros(10 * 10 * 3, np.uint8)
    with pytest.raises(ValueError):
        _jpegcrop.resize(src, 50, 100, 150, 3, (0.0, 0.0, 50.0, 100.0), 10, 10,
                         (0, 0, 10, 10), dst, 2, False, False, -1, part)
