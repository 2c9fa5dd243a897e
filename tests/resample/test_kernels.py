"""The resampler's kernels agree byte for byte, its window, flip and layouts are those of the
whole resized image, and its bytes are pinned: the same on every machine that runs them."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imgprep import resample

pytestmark = pytest.mark.skipif(not resample.AVAILABLE,
                                reason=f"the resampler: {resample.status()}")
SIMD = [k for k in resample.KERNELS if k != "portable"]
Box = tuple[float, float, float, float]


def needs(kernel: str) -> None:
    if resample.AVAILABLE and kernel not in resample.kernels():
        pytest.skip(f"this CPU lacks the {kernel} kernel (it runs {resample.kernel()})")


def image(h: int, w: int, channels: int, pad: int, seed: int) -> np.ndarray:
    """Random pixels, rows ``pad`` bytes apart beyond their width (a strided view)."""
    rows = np.random.default_rng(seed).integers(0, 256, (h, w * channels + pad), np.uint8)
    return rows[:, :w * channels].reshape(h, w, channels)


def run(src: np.ndarray, box: Box, size: tuple[int, int], *, filter: str = "bilinear",
        window: tuple[int, int, int, int] | None = None, flip: bool = False,
        planar: bool = False, kernel: str | None = None) -> np.ndarray:
    left, top, cols, rows = window or (0, 0, *size)
    out = np.empty((3, rows, cols) if planar else (rows, cols, 3), np.uint8)
    resample.resize(src, box, size, out, filter=filter, window=window, flip=flip,
                    planar=planar, kernel=kernel)
    return out


@st.composite
def cases(draw: st.DrawFn) -> dict:
    """A source (1..600 a side, RGB or RGBX, rows padded or not), a box within it (any floats,
    or whole pixels), an output size (1..600), a window of it, a filter, flip and layout."""
    w, h = draw(st.integers(1, 600)), draw(st.integers(1, 600))
    if draw(st.booleans()):
        x0, x1 = sorted(draw(st.integers(0, w)) for _ in range(2))
        y0, y1 = sorted(draw(st.integers(0, h)) for _ in range(2))
    else:
        x0, x1 = sorted(draw(st.floats(0, w)) for _ in range(2))
        y0, y1 = sorted(draw(st.floats(0, h)) for _ in range(2))
    ow, oh = draw(st.integers(1, 600)), draw(st.integers(1, 600))
    left, top = draw(st.integers(0, ow - 1)), draw(st.integers(0, oh - 1))
    return {
        "src": image(h, w, draw(st.sampled_from([3, 4])), draw(st.sampled_from([0, 1, 5, 64])),
                     draw(st.integers(0, 2**32))),
        "box": (x0, y0, x1, y1), "size": (ow, oh),
        "window": (left, top, draw(st.integers(1, ow - left)), draw(st.integers(1, oh - top))),
        "filter": draw(st.sampled_from(sorted(resample.FILTERS))),
        "flip": draw(st.booleans()), "planar": draw(st.booleans()),
    }


@pytest.mark.parametrize("kernel", SIMD)
@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_every_kernel_makes_the_portable_kernels_bytes(kernel: str, case: dict) -> None:
    needs(kernel)
    src, box, size = case.pop("src"), case.pop("box"), case.pop("size")
    assert np.array_equal(run(src, box, size, kernel=kernel, **case),
                          run(src, box, size, kernel="portable", **case))


@pytest.mark.realdata
@pytest.mark.slow
@pytest.mark.parametrize("kernel", SIMD)
def test_every_kernel_makes_the_portable_kernels_bytes_on_real_crops(
        kernel: str, shard_crops: list[tuple[np.ndarray, Box]]) -> None:
    needs(kernel)
    for i, (frame, box) in enumerate(shard_crops):
        filt = sorted(resample.FILTERS)[i % len(resample.FILTERS)]
        for planar in (False, True):
            ours = run(frame, box, (224, 224), filter=filt, planar=planar, flip=i % 2 == 1,
                       kernel=kernel)
            ref = run(frame, box, (224, 224), filter=filt, planar=planar, flip=i % 2 == 1,
                      kernel="portable")
            assert np.array_equal(ours, ref), f"crop {i} {box} {filt} planar={planar}"


@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_a_window_is_that_part_of_the_whole_image_mirrored_or_planar_as_asked(
        case: dict) -> None:
    src, box, size, filt = case["src"], case["box"], case["size"], case["filter"]
    left, top, cols, rows = case["window"]
    whole = run(src, box, size, filter=filt)[top:top + rows, left:left + cols]
    if case["flip"]:
        whole = whole[:, ::-1]
    got = run(src, box, size, filter=filt, window=case["window"], flip=case["flip"],
              planar=case["planar"])
    assert np.array_equal(got.transpose(1, 2, 0) if case["planar"] else got, whole)


@settings(max_examples=100, deadline=None)
@given(case=cases())
def test_rgb_and_rgbx_sources_of_the_same_pixels_give_the_same_bytes(case: dict) -> None:
    src = case["src"]
    rgbx = np.zeros((*src.shape[:2], 4), np.uint8)
    rgbx[..., :3] = src[..., :3]
    rgbx[..., 3] = 255 - src[..., 0]  # the 4th byte is never read
    rgb = np.ascontiguousarray(src[..., :3])
    assert np.array_equal(run(rgb, case["box"], case["size"], filter=case["filter"]),
                          run(rgbx, case["box"], case["size"], filter=case["filter"]))


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (7, 1), (5, 6)])
@pytest.mark.parametrize("channels", [3, 4])
def test_views_of_rows_apart_are_read_as_their_copies(shape: tuple[int, int],
                                                      channels: int) -> None:
    """Rows of a larger image, every other row, a single row or column (whose strides
    numpy leaves free), contiguous or not."""
    h, w = shape
    big = np.random.default_rng(1).integers(0, 256, (h * 2, w + 3, channels), np.uint8)
    for view in (big[:h, :w], big[::2, :w], big[1:2, :w], big[:h, 2:3], big[:h, :w].copy()):
        box = (0.25, 0.0, view.shape[1], view.shape[0])
        assert np.array_equal(run(view, box, (9, 4), filter="bicubic"),
                              run(np.ascontiguousarray(view), box, (9, 4), filter="bicubic"))


def golden_bytes(filt: str) -> bytes:
    """Every kernel's output for a fixed set of resizes of fixed pixels: upscaling,
    downscaling (antialiased), fractional boxes, thin and one-pixel images."""
    rng = np.random.default_rng(2024)
    noise = rng.integers(0, 256, (97, 131, 4), np.uint8)
    yy, xx = np.mgrid[0:200, 0:300]
    smooth = np.stack([xx * 255 // 299, yy * 255 // 199, (xx + yy) % 256, xx], -1)
    smooth = smooth.astype(np.uint8)
    jobs: list[tuple[np.ndarray, Box, tuple[int, int]]] = [
        (noise, (0, 0, 131, 97), (224, 224)),
        (noise, (3.25, 7.5, 120.125, 90.75), (60, 41)),
        (smooth, (10.5, 20.25, 250.75, 180.5), (224, 224)),
        (smooth, (0, 0, 300, 200), (256, 171)),
        (smooth, (0, 0, 300, 200), (37, 300)),
        (noise[:1, :1], (0, 0, 1, 1), (5, 3)),
        (noise[:, :2], (0.5, 0, 1.5, 97), (9, 11)),
    ]
    out = b""
    for kernel in resample.kernels():
        out += b"".join(run(src, box, size, filter=filt, kernel=kernel).tobytes()
                        for src, box, size in jobs)
    n = len(resample.kernels())
    assert out == out[:len(out) // n] * n, "the kernels disagree"
    return out[:len(out) // n]


# sha256 of golden_bytes: pinned on an AVX-512 machine, and equal to pillow-simd's bytes
GOLDEN = {
    "bicubic": "889cc0268bfef937eb1cab377808f90715045a22653d5bebdfd4108fc360e6e9",
    "bilinear": "bcb6c06c645baeee6d6132232677c763d56fcedf8a5fec8b22a4d31913108dc7",
    "box": "6bf0ae5b8999a5b9902b240e3d1cebcee6f138870e6cb98015eb8e6c8d7aad8d",
    "hamming": "439ab2c34266cbd4584853d942ac70ed72a14df4bce1c7790f51ba5a9ca417d1",
    "lanczos": "ea6d198bb69e26a0cacc0dbf721301200d6c900211141f3c34956cd0d193872e",
    "nearest": "7d582cc63566827f4bf50fa51f1ad53ba32e4a602c3e21fe64dd4f669b66aa15",
}


@pytest.mark.parametrize("filt", sorted(GOLDEN))
def test_the_bytes_are_the_pinned_ones_on_this_machine(filt: str) -> None:
    assert hashlib.sha256(golden_bytes(filt)).hexdigest() == GOLDEN[filt]
