"""Each op's answer on tiny images worked out by hand from Pillow's arithmetic
(docs/augment.md), the two layouts agreeing, and Pillow's matrices."""

from __future__ import annotations

import math

import numpy as np
import pytest

from imgprep import augment
from imgprep.augment import Op

pytestmark = pytest.mark.skipif(not augment.AVAILABLE, reason="augmentation ops not built")


def run(rows: list[list[tuple[int, int, int]]], *ops: Op) -> np.ndarray:
    """``ops`` on the image ``rows`` (H x W pixels of RGB) as rows of pixels."""
    img = np.array(rows, np.uint8)
    augment.apply(img, ops, planar=False)
    return img


def grey(*values: int) -> list[list[tuple[int, int, int]]]:
    """One row of grey pixels."""
    return [[(v, v, v) for v in values]]


def channel(img: np.ndarray) -> list[int]:
    """The first channel of a one-row image."""
    return [int(v) for v in img[0, :, 0]]


def test_invert_posterize_and_solarize_are_their_tables() -> None:
    assert channel(run(grey(0, 1, 254, 255), Op("invert"))) == [255, 254, 1, 0]
    assert channel(run(grey(191, 31, 255), Op("posterize", (3,)))) == [160, 0, 224]
    assert channel(run(grey(191, 31, 255), Op("posterize", (0,)))) == [0, 0, 0]
    assert channel(run(grey(191, 31, 255), Op("posterize", (8,)))) == [191, 31, 255]
    # a float threshold: values below it kept, the others inverted
    assert channel(run(grey(0, 128, 129, 255), Op("solarize", (128.5,)))) == [0, 128, 126, 0]


def test_solarize_add_adds_below_the_threshold_rounding_half_to_even() -> None:
    assert channel(run(grey(127, 128, 0), Op("solarize_add", (10, 128)))) == [137, 128, 10]
    assert channel(run(grey(250), Op("solarize_add", (10, 256)))) == [255]
    # Image.point rounds the table with Python's round(): 1.5 -> 2, 2.5 -> 2
    assert channel(run(grey(1, 2, 3), Op("solarize_add", (0.5, 3)))) == [2, 2, 3]
    assert channel(run(grey(1, 200), Op("solarize_add", (-5, 256)))) == [0, 195]


def test_brightness_scales_in_float_and_truncates() -> None:
    # 0.5 x 255 = 127.5 -> 127, 0.5 x 3 = 1.5 -> 1
    assert channel(run(grey(255, 3, 0, 128), Op("brightness", (0.5,)))) == [127, 1, 0, 64]
    # 1.5 x 200 = 300 -> 255, 1.5 x 101 = 151.5 -> 151
    assert channel(run(grey(200, 101, 0), Op("brightness", (1.5,)))) == [255, 151, 0]


def test_contrast_blends_against_the_rounded_grey_mean() -> None:
    # L of black and white: 0 and 255; mean 127.5, int(127.5 + 0.5) = 128
    assert channel(run(grey(0, 255), Op("contrast", (0.0,)))) == [128, 128]
    # 128 + 0.5 x (0 - 128) = 64; 128 + 0.5 x (255 - 128) = 191.5 -> 191
    assert channel(run(grey(0, 255), Op("contrast", (0.5,)))) == [64, 191]
    assert channel(run(grey(0, 255), Op("contrast", (2.0,)))) == [0, 255]


def test_color_blends_each_pixel_with_its_luma() -> None:
    # L of pure red: (255 x 19595 + 0x8000) >> 16 = 76
    assert run([[(255, 0, 0)]], Op("color", (0.0,))).tolist() == [[[76, 76, 76]]]
    # 76 + 2 x (255 - 76) clips to 255, 76 + 2 x (0 - 76) to 0
    assert run([[(255, 0, 0)]], Op("color", (2.0,))).tolist() == [[[255, 0, 0]]]


def test_autocontrast_stretches_each_channel_alone() -> None:
    # red: 10..95, scale 255 / 85 = 3, offset -30: 10 -> 0, 50 -> 120, 95 -> 255; green and
    # blue hold one level each and are left as they are
    img = run([[(10, 7, 9), (50, 7, 9), (95, 7, 9)]], Op("autocontrast"))
    assert img.tolist() == [[[0, 7, 9], [120, 7, 9], [255, 7, 9]]]


def test_equalize_maps_each_level_to_the_pixels_below_it() -> None:
    # 256 pixels: 128 at 10, 127 at 20, 1 at 30; step = (256 - 1) // 255 = 1, so each level
    # maps to (0 + the count below it) // 1: 0, 128, 255
    values = [10] * 128 + [20] * 127 + [30]
    img = np.array([[(v, v, v) for v in values]], np.uint8).reshape(16, 16, 3)
    augment.apply(img, [Op("equalize")], planar=False)
    assert sorted(set(img[..., 0].ravel().tolist())) == [0, 128, 255]
    assert img[0, 0, 0] == 0 and img[15, 15, 0] == 255 and img[8, 0, 0] == 128


def test_sharpness_blends_with_smooth_inside_and_keeps_the_edges() -> None:
    # SMOOTH at the centre of a lone 130: 0.5 + 130 x 5/13 = 50.5 -> 50; the edge pixels are
    # SMOOTH's own source pixels, so blending leaves them as they were
    rows = [[(0, 0, 0)] * 3, [(0, 0, 0), (130, 130, 130), (0, 0, 0)], [(0, 0, 0)] * 3]
    assert run(rows, Op("sharpness", (0.0,)))[1, 1].tolist() == [50, 50, 50]
    sharp = run(rows, Op("sharpness", (2.0,)))  # 50 + 2 x (130 - 50) = 210
    assert sharp[1, 1].tolist() == [210, 210, 210]
    assert int(sharp.sum()) == 3 * 210
    # too small for SMOOTH's 3 x 3: unchanged
    assert run([[(9, 8, 7), (1, 2, 3)]], Op("sharpness", (2.0,))).tolist() == [
        [[9, 8, 7], [1, 2, 3]]]


def test_affine_nearest_takes_the_pixel_under_each_centre_and_fills_outside() -> None:
    row = [[(10, 10, 10), (20, 20, 20), (30, 30, 30)]]
    shifted = run(row, Op("affine", augment.translate_matrix(1, 0), fill=(1, 2, 3)))
    assert shifted.tolist() == [[[20, 20, 20], [30, 30, 30], [1, 2, 3]]]
    # rotating 90 degrees counter-clockwise: [[1, 2], [3, 4]] -> [[2, 4], [1, 3]]
    square = [[(1, 1, 1), (2, 2, 2)], [(3, 3, 3), (4, 4, 4)]]
    turned = run(square, Op("affine", augment.rotate_matrix(90, 2, 2)))
    assert turned[..., 0].tolist() == [[2, 4], [1, 3]]


def test_affine_interpolates_as_pillow() -> None:
    # half a pixel: output 0 samples 1.0, which is 0.5 between the two centres
    half = augment.translate_matrix(0.5, 0)
    assert channel(run(grey(0, 100), Op("affine", half, "bilinear", (7, 7, 7)))) == [50, 7]
    # Pillow's a = -1 cubic at d = 0.5 over the clamped neighbours (0, 0, 100, 200): 37.5;
    # (0, 100, 200, 100): 175; (100, 200, 100, 100): 162.5; the last centre falls outside
    out = run(grey(0, 100, 200, 100), Op("affine", half, "bicubic", (7, 7, 7)))
    assert channel(out) == [37, 175, 162, 7]


OPS_ONCE = [Op("identity"), Op("affine", (0.9, 0.2, 1.5, -0.1, 1.1, -2.0), "bicubic", (9, 8, 7)),
            Op("affine", (1.0, 0.3, 0.0, 0.0, 1.0, 0.0), "bilinear"),
            Op("affine", augment.rotate_matrix(33, 17, 13), "nearest", (5, 6, 7)),
            Op("affine", augment.translate_matrix(-3.5, 2)), Op("brightness", (1.4,)),
            Op("color", (0.3,)), Op("contrast", (1.7,)), Op("sharpness", (-0.5,)),
            Op("posterize", (5,)), Op("solarize", (140.0,)), Op("solarize_add", (30, 100)),
            Op("autocontrast"), Op("equalize"), Op("invert")]


@pytest.mark.parametrize("chain", [[op] for op in OPS_ONCE] + [OPS_ONCE, OPS_ONCE[::-1]],
                         ids=[op.kind for op in OPS_ONCE] + ["all", "all-reversed"])
def test_planes_and_rows_of_pixels_give_the_same_bytes(chain: list[Op]) -> None:
    rng = np.random.default_rng(4)
    hwc = rng.integers(0, 256, (13, 17, 3), dtype=np.uint8)
    planar = np.ascontiguousarray(hwc.transpose(2, 0, 1))
    augment.apply(hwc, chain, planar=False)
    augment.apply(planar, chain, planar=True)
    assert np.array_equal(planar.transpose(1, 2, 0), hwc)


def test_an_empty_list_and_identity_leave_the_image_alone() -> None:
    img = np.random.default_rng(1).integers(0, 256, (3, 5, 4), dtype=np.uint8)
    before = img.copy()
    augment.apply(img, [], planar=True)
    augment.apply(img, [Op("identity"), Op("brightness", (1.0,))], planar=True)
    assert np.array_equal(img, before)


def test_the_matrices_are_pillows_and_timms() -> None:
    assert augment.shear_matrix(0.3) == (1.0, 0.3, 0.0, 0.0, 1.0, 0.0)
    assert augment.shear_matrix(y=-0.2) == (1.0, 0.0, 0.0, -0.2, 1.0, 0.0)
    assert augment.translate_matrix(4, -2.5) == (1.0, 0.0, 4.0, 0.0, 1.0, -2.5)
    # Image.rotate: sines and cosines rounded to 15 places, about the centre (w/2, h/2)
    assert augment.rotate_matrix(90, 4, 6) == (0.0, -1.0, 5.0, 1.0, 0.0, 1.0)
    assert augment.rotate_matrix(0, 7, 5) == (1.0, -0.0, 0.0, 0.0, 1.0, 0.0)
    a = augment.rotate_matrix(-30, 10, 10)  # taken modulo 360 first, as Pillow does
    assert a == augment.rotate_matrix(330, 10, 10)
    assert a[0] == round(math.cos(math.radians(-330)), 15)
