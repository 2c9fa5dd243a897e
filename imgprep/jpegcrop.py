"""Crop-aware JPEG decoding: only the rows and iMCU columns a crop needs, in a reusable frame.

libjpeg-turbo's partial decompression (``jpeg_crop_scanline``, ``jpeg_skip_scanlines``,
stopping after the last needed row) through the small C extension ``imgprep._jpegcrop``,
which carries its own libjpeg-turbo in the wheel and in ``make setup``'s build (Debian's
2.1.5, the release pillow-simd links there, SIMD on: ``library()``) and links the system's
libjpeg in a source build (left out, never failing the install, without a compiler or the
headers). It widens the region by a column on each side (fancy upsampling treats a crop's
outer columns as the image's edge), so the decoded pixels are exactly those of a full decode
by the same libjpeg-turbo; a caller that then resamples the same box with Pillow gets the
same bytes as decoding the whole image would give.

The fast path declines what it cannot decode the same way (``Probe.reason``): progressive or
arithmetic-coded JPEGs, CMYK and other colour spaces, data after the scan other than restart
markers and the final EOI (so that stopping early never hides a truncation or an error a full
decode would raise), corrupt data that makes libjpeg warn, and anything that is not a JPEG.
Those go to the caller's Pillow path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType

import numpy as np
from PIL import Image

_jpegcrop: ModuleType | None
try:
    from imgprep import _jpegcrop
except ImportError as e:  # built optionally: the Pillow path serves without it
    _jpegcrop, _MISSING = None, str(e)
else:
    _MISSING = ""

AVAILABLE = _jpegcrop is not None
REASONS = {  # probe codes of the extension -> why the fast path declines
    1: "progressive or arithmetic-coded",
    2: "not YCbCr or grayscale (CMYK, Adobe RGB, ...)",
    3: "data after the scan (several scans, a marker, or truncated: no EOI)",
    4: "not a JPEG libjpeg reads",
}
Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Library:
    """The libjpeg-turbo under the crop-aware decoder (``imgprep info`` reports it)."""

    version: str | None  # libjpeg-turbo's ("2.1.5"), from the headers the extension was built
    # with; None when they are another libjpeg's
    bundled: bool  # linked into the extension (the wheel's build); False: the system's libjpeg,
    # loaded at run time (the version is then its headers')
    simd: bool | None  # its SIMD kernels run (libjpeg-turbo's own dispatch says so); None for a
    # system library, whose dispatch is not exported
    extension: str  # the extension's file


def library() -> Library | None:
    """The libjpeg-turbo the crop-aware decoder runs on; None where the decoder is not built."""
    if _jpegcrop is None:
        return None
    n, simd = _jpegcrop.LIBJPEG_TURBO_VERSION, _jpegcrop.simd()
    return Library(version=f"{n // 1_000_000}.{n // 1000 % 1000}.{n % 1000}" if n else None,
                   bundled=bool(_jpegcrop.LIBJPEG_LINKED_IN),
                   simd=None if simd < 0 else bool(simd), extension=str(_jpegcrop.__file__))


def status() -> str:
    """One line for ``imgprep info``: whether the crop-aware decoder is built, and why not;
    which libjpeg-turbo it runs on, and whether its SIMD kernels run."""
    lib = library()
    if lib is None:
        return (f"unavailable ({_MISSING}); every image takes the Pillow path. Reinstall with "
                "a C compiler and the libjpeg-turbo headers (libjpeg-dev) to build it, or "
                "install the wheel (docs/install.md)")
    simd = {True: "SIMD on", False: "SIMD off", None: "SIMD not known"}[lib.simd]
    if lib.bundled:
        return f"available (libjpeg-turbo {lib.version}, bundled, {simd})"
    return (f"available (the system's libjpeg, headers of libjpeg-turbo {lib.version}, "
            f"{simd})")


@dataclass(frozen=True)
class Probe:
    """A JPEG's size, and why the fast path declines it (None: it takes it)."""

    width: int
    height: int
    reason: str | None


def probe(data: bytes) -> Probe:
    """Read ``data``'s headers (a few microseconds); ``reason`` is None for the fast path."""
    if _jpegcrop is None:
        return Probe(0, 0, f"the crop-aware decoder is not built ({_MISSING})")
    w, h, code = _jpegcrop.probe(data)
    return Probe(w, h, REASONS.get(code) if code else None)


def draft_scale(width: int, height: int, request: tuple[int, int]) -> int:
    """The DCT scale (1, 2, 4 or 8) Pillow's ``draft`` picks for ``request``: the largest
    that keeps the image at least that size."""
    scale = min(width // request[0], height // request[1])
    return next((s for s in (8, 4, 2) if scale >= s), 1)


def reach(lo: float, hi: float, out: int, limit: int, support: float = 1.0
          ) -> tuple[int, int]:
    """The input pixels a resample of ``[lo, hi)`` to ``out`` pixels reads with a filter of
    ``support`` (Pillow's: 1 for bilinear, 2 bicubic, 3 lanczos, 0.5 box): the box widened
    by the support (times the shrink factor when shrinking), plus a pixel, within
    ``[0, limit)``."""
    s = support * max(1.0, (hi - lo) / out)
    return max(0, math.floor(lo - s) - 1), min(limit, math.ceil(hi + s) + 1)


class Frame:
    """A decoder's scratch: one RGBX buffer for the largest image yet, and Pillow images that
    share its memory (made once per size, the last ``VIEWS`` sizes kept: originals come in
    thousands of sizes), so decoding allocates nothing."""

    VIEWS = 8

    def __init__(self) -> None:
        self._buf = np.empty(0, np.uint8)
        self._images: dict[tuple[int, int], Image.Image] = {}

    def view(self, width: int, height: int) -> tuple[np.ndarray, Image.Image]:
        """The buffer for a ``width`` x ``height`` RGBX image, and the image over it."""
        need = width * height * 4
        if need > self._buf.size:
            self._buf = np.empty(need, np.uint8)
            self._images.clear()  # they map the old buffer
        buf = self._buf[:need]
        img = self._images.get((width, height))
        if img is None:
            if len(self._images) >= self.VIEWS:
                self._images.clear()
            img = Image.frombuffer("RGBX", (width, height), buf, "raw", "RGBX", 0, 1)
            self._images[(width, height)] = img
        return buf, img

    def decode(self, data: bytes, p: Probe, scale: int,
               region: tuple[int, int, int, int]) -> Image.Image | None:
        """Decode ``region`` (left, top, right, bottom, in pixels at 1/``scale``) of the JPEG
        ``data`` into the frame; the RGBX image of the whole scaled size, whose pixels are
        the full decode's in ``region`` (and undefined outside), or None when libjpeg warned
        about corrupt data (decode it the Pillow way)."""
        if _jpegcrop is None or p.reason is not None:
            raise ValueError(f"the crop-aware decoder declines this image: {p.reason}")
        w, h = -(-p.width // scale), -(-p.height // scale)
        buf, img = self.view(w, h)
        *_, warnings = _jpegcrop.decode(data, buf, scale, *region)
        return None if warnings else img


def pack(src: Image.Image | np.ndarray, src_width: int, box: tuple[int, int, int, int],
         out: np.ndarray, *, flip: bool, planar: bool) -> None:
    """Copy ``box`` (left, top, right, bottom) of an RGBX/RGB Pillow image, or of a frame
    buffer ``src_width`` pixels wide, into ``out`` (uint8, C-contiguous): 3 x H x W when
    ``planar``, else H x W x 3; mirrored left-right when ``flip``. One pass in C."""
    if _jpegcrop is None:
        raise ValueError(f"the crop-aware decoder is not built ({_MISSING})")
    left, top, right, bottom = box
    if isinstance(src, Image.Image):
        if src.mode not in ("RGB", "RGBX"):
            raise ValueError(f"pack takes RGB or RGBX images, not {src.mode}")
        source: object = src.im.__arrow_c_array__()
    else:
        source = src
    _jpegcrop.pack(source, src_width, left, top, right - left, bottom - top, out, flip, planar)
