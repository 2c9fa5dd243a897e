"""The resampler checks every argument in C: negative, overflowing and inconsistent numbers,
and buffers too short for what they are said to hold, raise ValueError before any pixel is
read or written; and the Python wrapper refuses what would be misread."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from imgprep import resample

pytestmark = pytest.mark.skipif(not resample.AVAILABLE,
                                reason=f"the resampler: {resample.status()}")

W, H = 16, 12
GOOD: dict[str, Any] = {
    "width": W, "height": H, "stride": W * 4, "channels": 4, "box": (0.0, 0.0, W, H),
    "out_width": 8, "out_height": 6, "window": (0, 0, 8, 6), "filter": 2, "flip": False,
    "planar": False, "kernel": -1,
}


def call(src: Any = None, out: Any = None, **changes: Any) -> Any:
    """The extension's resize with GOOD's arguments, ``changes`` applied."""
    from imgprep import _jpegcrop

    a = GOOD | changes
    if src is None:
        src = np.zeros(H * W * 4, np.uint8)
    if out is None:
        out = np.zeros(8 * 6 * 3, np.uint8)
    return _jpegcrop.resize(src, a["width"], a["height"], a["stride"], a["channels"],
                            a["box"], a["out_width"], a["out_height"], a["window"], out,
                            a["filter"], a["flip"], a["planar"], a["kernel"])


def test_good_arguments_are_taken() -> None:
    assert call() is None


@pytest.mark.parametrize("name", ["width", "height", "stride", "channels", "out_width",
                                  "out_height", "filter", "kernel"])
@pytest.mark.parametrize("value", [-1, -2**31, -2**63, 2**31, 2**63, 2**70])
def test_a_negative_or_overflowing_number_raises_valueerror(name: str, value: int) -> None:
    if name == "kernel" and value == -1:
        value = -2  # -1 asks for the best kernel
    with pytest.raises(ValueError):
        call(**{name: value})


@pytest.mark.parametrize("window", [(-1, 0, 8, 6), (0, -1, 8, 6), (0, 0, -8, 6),
                                    (0, 0, 8, -6), (0, 0, 0, 6), (1, 0, 8, 6), (0, 1, 8, 6),
                                    (2**62, 0, 8, 6), (0, 0, 2**63 - 1, 6), (2**70, 0, 1, 1)])
def test_a_window_outside_the_output_raises_valueerror(
        window: tuple[int, int, int, int]) -> None:
    with pytest.raises(ValueError):
        call(window=window)


@pytest.mark.parametrize("box", [(-0.5, 0, W, H), (0, -1, W, H), (0, 0, W + 0.01, H),
                                 (0, 0, W, H + 1), (5, 0, 4, H), (0, 5, W, 4),
                                 (math.nan, 0, W, H), (0, 0, math.inf, H), (0, 0, W, 1e300)])
def test_a_box_outside_the_source_or_not_a_number_raises_valueerror(
        box: tuple[float, float, float, float]) -> None:
    with pytest.raises(ValueError):
        call(box=box)


@pytest.mark.parametrize("changes", [
    {"channels": 2}, {"channels": 5}, {"width": 0}, {"out_height": 0},
    {"width": 2**24 + 1}, {"out_width": 2**24 + 1}, {"filter": 6}, {"kernel": 3},
    {"stride": W * 4 - 1},  # shorter than a row
    {"stride": 2**40},  # rows that far apart
    {"width": 2**24, "height": 2**24, "stride": 2**26},  # sizes whose product overflows
])
def test_inconsistent_sizes_raise_valueerror(changes: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        call(**changes)


def test_a_source_shorter_than_its_rows_raises_valueerror() -> None:
    with pytest.raises(ValueError, match="source holds"):
        call(src=np.zeros(H * W * 4 - 1, np.uint8))
    with pytest.raises(ValueError, match="source holds"):  # padded rows: the last needs less
        call(src=np.zeros((H - 1) * W * 8 + W * 4 - 1, np.uint8), stride=W * 8)
    assert call(src=np.zeros((H - 1) * W * 8 + W * 4, np.uint8), stride=W * 8) is None


@pytest.mark.parametrize("size", [8 * 6 * 3 - 1, 8 * 6 * 3 + 1, 0])
def test_an_output_of_another_size_raises_valueerror(size: int) -> None:
    with pytest.raises(ValueError, match="out holds"):
        call(out=np.zeros(size, np.uint8))


def test_a_read_only_output_is_refused() -> None:
    with pytest.raises(TypeError):
        call(out=bytes(8 * 6 * 3))


def test_a_window_weight_table_too_large_raises_valueerror() -> None:
    """A million-pixel window of an 8 to 2^24 pixels lanczos upscale: 7 million weights."""
    with pytest.raises(ValueError, match="filter weights"):
        call(src=np.zeros(32, np.uint8), width=8, height=1, stride=32, box=(0, 0, 8, 1),
             out_width=2**24, out_height=1, window=(0, 0, 2**20, 1), filter=1,
             out=np.zeros(3 * 2**20, np.uint8))


def test_a_small_window_of_a_huge_resize_keeps_only_its_own_weights() -> None:
    """A 1-pixel window of an 8 to 2^24 pixels lanczos upscale (117 million weights in all):
    every output's weights are computed for the precision, the window's alone are kept."""
    src = np.full(32, 200, np.uint8)
    out = np.zeros(3, np.uint8)
    call(src=src, width=8, height=1, stride=32, box=(0, 0, 8, 1), out_width=2**24,
         out_height=1, window=(2**23, 0, 1, 1), filter=1, out=out)
    assert out.tolist() == [200, 200, 200]


def test_a_resize_needing_over_a_gigabyte_of_scratch_raises_valueerror() -> None:
    """A million-pixel-wide window of a million rows shrunk to one: every row a tap, each
    3 MB between the passes."""
    with pytest.raises(ValueError, match="bytes of scratch"):
        call(src=np.zeros(2**20 * 4, np.uint8), width=1, height=2**20, stride=4,
             box=(0, 0, 1, 2**20), out_width=2**20, out_height=1, window=(0, 0, 2**20, 1),
             out=np.zeros(2**20 * 3, np.uint8))


def test_a_kernel_this_cpu_lacks_is_named_in_the_error() -> None:
    from imgprep import _jpegcrop

    with pytest.raises(ValueError, match="cannot run here"):
        _jpegcrop.resample_kernel(3)
    assert _jpegcrop.resample_kernel(0) == "portable"


@pytest.mark.parametrize("changes", [
    {"out": np.zeros((6, 8, 3), np.uint16)}, {"out": np.zeros((8, 6, 3), np.uint8)},
    {"out": np.zeros((3, 6, 8), np.uint8)}, {"filter": "cubic"}, {"kernel": "sse2"},
    {"src": np.zeros((H, W, 2), np.uint8)}, {"src": np.zeros((H, W, 4), np.float32)},
    {"src": np.zeros((H, W * 2, 4), np.uint8)[:, ::2]},  # pixels not packed
])
def test_the_wrapper_refuses_what_it_would_misread(changes: dict[str, Any]) -> None:
    args: dict[str, Any] = {"src": np.zeros((H, W, 4), np.uint8), "box": (0, 0, W, H),
                            "size": (8, 6), "out": np.zeros((6, 8, 3), np.uint8)} | changes
    with pytest.raises(ValueError):
        resample.resize(args.pop("src"), args.pop("box"), args.pop("size"), args.pop("out"),
                        **args)
