"""Every kernel gives the portable kernel's bytes: the SIMD code computes each value with the
portable code's operations in its order, on any image size (the four-pixel steps' tails, a
border of one pixel), either layout, every filter and op, positions inside, across and
outside the source. The portable code is the one the sweeps hold to stock Pillow; the sweeps
run the best kernel this CPU has."""

from __future__ import annotations

import numpy as np
import pytest

from imgprep import augment
from imgprep.augment import Op

ext = pytest.importorskip("imgprep._jpegcrop")
pytestmark = pytest.mark.skipif(not augment.AVAILABLE, reason="augmentation ops not built")

SIMD = [k for k in augment.KERNELS[1:] if augment.AVAILABLE and k in augment.kernels()]


def matrices(rng: np.random.Generator, w: int, h: int) -> list[tuple[float, ...]]:
    """Rotations, shears, translations (whole and fractional pixels), scalings and any
    matrix, some mapping part or all of the image outside the source."""
    return [augment.rotate_matrix(float(rng.uniform(-180, 180)), w, h),
            augment.rotate_matrix(90.0, w, h),
            augment.shear_matrix(float(rng.uniform(-1, 1))),
            augment.shear_matrix(0.0, float(rng.uniform(-1, 1))),
            augment.translate_matrix(float(rng.uniform(-w, w)), float(rng.uniform(-h, h))),
            augment.translate_matrix(float(rng.integers(-3, 4)), float(rng.integers(-3, 4))),
            (float(rng.uniform(0.3, 3)), 0.0, float(rng.uniform(-w, w)), 0.0,
             float(rng.uniform(0.3, 3)), float(rng.uniform(-h, h))),
            tuple(float(v) for v in rng.uniform(-2, 2, 6) * [1, 1, w, 1, 1, h])]


def chains(rng: np.random.Generator, w: int, h: int) -> list[list[Op]]:
    fill = (int(rng.integers(256)), int(rng.integers(256)), int(rng.integers(256)))
    out = [[Op("affine", m, r, fill)] for m in matrices(rng, w, h) for r in augment.RESAMPLES]
    factor = float(rng.uniform(0, 2))
    out += [[Op(k, (factor,))] for k in ("brightness", "color", "contrast", "sharpness")]
    out += [[Op("posterize", (3,))], [Op("solarize", (100.5,))], [Op("autocontrast")],
            [Op("equalize")], [Op("invert")], [Op("solarize_add", (40, 128))]]
    out += [[Op("equalize"), Op("affine", matrices(rng, w, h)[0], "bicubic", fill),
             Op("sharpness", (1.7,)), Op("color", (0.3,)), Op("autocontrast")]]
    return out


def images(rng: np.random.Generator, crops: np.ndarray) -> list[np.ndarray]:
    """Planar images of many sizes: noise, and windows of the real crops."""
    sizes = [(1, 1), (1, 7), (6, 1), (2, 2), (3, 3), (5, 9), (4, 10), (3, 18), (17, 4), (31, 33),
             (64, 64)]
    out = []
    for i, (h, w) in enumerate(sizes):
        if i % 2:
            out.append(rng.integers(0, 256, (3, h, w), dtype=np.uint8))
        else:
            crop = crops[i % len(crops)]
            out.append(np.ascontiguousarray(crop[:h, :w].transpose(2, 0, 1)))
    return out


@pytest.mark.skipif(not SIMD, reason="this CPU runs the portable kernel alone")
@pytest.mark.parametrize("kernel", SIMD)
def test_every_kernel_gives_the_portable_kernels_bytes(kernel: str, crops: np.ndarray) -> None:
    rng = np.random.default_rng(2024)
    compared = 0
    for img in images(rng, crops):
        h, w = img.shape[1:]
        for ops in chains(rng, w, h):
            for planar in (True, False):
                src = img if planar else np.ascontiguousarray(img.transpose(1, 2, 0))
                want, got = src.copy(), src.copy()
                augment.apply(want, ops, planar=planar, kernel="portable")
                augment.apply(got, ops, planar=planar, kernel=kernel)
                assert np.array_equal(got, want), (kernel, (h, w), ops, planar)
                compared += not np.array_equal(want, src)
    assert compared > 500  # the ops changed the images they were compared on


def test_the_kernel_is_named_and_one_this_cpu_lacks_is_refused() -> None:
    assert augment.kernel() == augment.kernels()[-1]
    assert augment.kernels()[0] == "portable" and augment.kernel("portable") == "portable"
    with pytest.raises(ValueError, match="unknown augmentation kernel 'sse9'"):
        augment.kernel("sse9")
    with pytest.raises(ValueError, match="cannot run here"):
        ext.augment_kernel(len(augment.KERNELS))
    img = np.zeros((3, 4, 5), np.uint8)
    with pytest.raises(ValueError, match="cannot run here"):
        ext.augment(img, 5, 4, True, (Op("invert").packed,), len(augment.KERNELS))
    with pytest.raises(ValueError, match="cannot run here"):
        augment.apply(img, [Op("invert")], planar=True, kernel="sse9")
    assert not img.any()
