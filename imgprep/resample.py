"""imgprep's resampler: Pillow's ``resize`` in the C extension, the same bytes everywhere.

``resize`` does what ``Image.resize(size, filter, box=box)`` does to an 8-bit RGB or RGBX
image, for every Pillow filter (nearest, box, bilinear, hamming, bicubic, lanczos): the
float ``box`` region, a separable two-pass resample with the filter's support widened by the
shrink factor (antialiasing), horizontal pass first, 8 bits between the passes. It then
writes a window of the result (all of it, or a crop such as the center one a validation
transform keeps) as RGB rows of pixels (HWC) or three planes (CHW), mirrored on request, in
the same call.

Its arithmetic is pillow-simd's (16-bit fixed-point weights, 32-bit integer sums), so its
bytes are pillow-simd's; stock Pillow (22-bit weights, and since 12.3 sometimes the vertical
pass first) differs from them by a unit or two per pixel, more where a ringing filter clips
between the passes (docs/resampling.md has the measured differences). The weights come from
the same double arithmetic on every machine (no fused multiply-add, the extension's own
sine), and the kernel dispatched at run time (AVX-512, AVX2, or portable C) only changes the
order of exact integer sums: the bytes do not depend on the CPU, or on which Pillow is
installed. ``kernel`` names the kernel that runs;
``resize(kernel=...)`` forces one (the tests check that they all agree).

It lives in the crop-aware decoder's extension (``imgprep._jpegcrop``), which the install
builds when it can (``AVAILABLE``; ``status`` says why not).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

_ext: ModuleType | None
try:
    from imgprep import _jpegcrop as _ext
except ImportError as e:  # built optionally, as imgprep.jpegcrop says
    _ext, _MISSING = None, str(e)
else:
    _MISSING = ""

AVAILABLE = _ext is not None and hasattr(_ext, "resize")
FILTERS = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}
KERNELS = ("portable", "avx2", "avx512")  # numbered 0, 1, 2 in the extension
Box = tuple[float, float, float, float]


def _module() -> ModuleType:
    if _ext is None or not AVAILABLE:
        raise ValueError(f"the resampler is not built ({_MISSING or 'an older extension'}); "
                         "reinstall imgprep with a C compiler and the libjpeg-turbo headers")
    return _ext


def kernel(name: str | None = None) -> str:
    """The kernel that runs here (``name``: check that this CPU runs that one); ValueError
    when it cannot."""
    if name is not None and name not in KERNELS:
        raise ValueError(f"unknown resampler kernel {name!r}; one of {', '.join(KERNELS)}")
    return str(_module().resample_kernel(-1 if name is None else KERNELS.index(name)))


def kernels() -> tuple[str, ...]:
    """The kernels this CPU runs, portable first."""
    best = KERNELS.index(kernel())
    return KERNELS[:best + 1]


def status() -> str:
    """One line for ``imgprep info``: the kernel that runs, or why there is none."""
    if not AVAILABLE:
        return f"unavailable ({_MISSING or 'an older extension'}); resizing takes Pillow's"
    return f"{kernel()} kernel (fixed point, pillow-simd's arithmetic, the same bytes on any CPU)"


def _flat(src: np.ndarray) -> tuple[np.ndarray, int]:
    """A 1-D view of the bytes of ``src`` (H x W x C, rows possibly apart) and its stride."""
    if src.dtype != np.uint8 or src.ndim != 3 or src.shape[2] not in (3, 4):
        raise ValueError(f"the source must be H x W x 3 or 4 uint8, not {src.dtype} "
                         f"{src.shape}")
    h, w, c = src.shape
    if src.flags.c_contiguous:  # (numpy ignores the strides of a dimension of size 1)
        return src.reshape(-1), w * c
    stride, step, byte = src.strides
    if byte != 1 or (w > 1 and step != c) or (h > 1 and stride < w * c):
        raise ValueError(f"the source's pixels must be packed in rows (strides {src.strides})")
    stride = stride if h > 1 else w * c
    span = (h - 1) * stride + w * c  # the bytes from the first pixel to the last
    return np.lib.stride_tricks.as_strided(src, shape=(span,), strides=(1,)), stride


def resize(src: np.ndarray, box: Box, size: tuple[int, int], out: np.ndarray, *,
           filter: str = "bilinear", window: tuple[int, int, int, int] | None = None,
           flip: bool = False, planar: bool = False, kernel: str | None = None) -> None:
    """Resize ``box`` (left, top, right, bottom: floats within the image, as Pillow's) of
    ``src`` (H x W x 3 RGB or x 4 RGBX uint8, rows packed, possibly apart) to ``size`` (width,
    height) with ``filter``, and write the ``window`` (left, top, width, height; default: all)
    of the result into ``out``: rows x cols x 3 uint8, or 3 x rows x cols when ``planar``,
    C-contiguous, mirrored left to right when ``flip``. ValueError on any bad argument."""
    ext = _module()
    flat, stride = _flat(src)
    h, w, c = src.shape
    left, top, cols, rows = window if window is not None else (0, 0, *size)
    shape = (3, rows, cols) if planar else (rows, cols, 3)
    if out.shape != shape or out.dtype != np.uint8:
        raise ValueError(f"out must be {shape} uint8, not {out.shape} {out.dtype}")
    try:
        number = FILTERS[filter]
    except KeyError:
        raise ValueError(f"unknown filter {filter!r}; one of {', '.join(FILTERS)}") from None
    k = -1 if kernel is None else KERNELS.index(kernel) if kernel in KERNELS else len(KERNELS)
    ext.resize(flat, w, h, stride, c, box, size[0], size[1], (left, top, cols, rows), out,
               number, flip, planar, k)
