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

Damage is never silent (``Scan``, ``check``): reading a JPEG's data to its end (``check``, or
a whole decode, at no extra cost) tells a file cut short, padded or carrying large trailing
data, which is an error (``Scan.damage``), from one that decodes whole with libjpeg's warnings,
which converts (``Scan.notes``); docs/convert.md gives the rule and the real files it was
decided from. Every decode runs under the per-image budget (``imgprep.budget``), and images
are held to Pillow's decompression-bomb limit before a frame is made (``check_pixels``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

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
REASONS = {  # the extension's probe codes (its PROBE_* constants) -> why the fast path declines
    "PROBE_PROGRESSIVE": "progressive or arithmetic-coded",
    "PROBE_COLOR": "not YCbCr or grayscale (CMYK, Adobe RGB, ...)",
    "PROBE_TAIL": "data after the scan (several scans, a marker, or truncated: no EOI)",
    "PROBE_BROKEN": "not a JPEG libjpeg reads",
}
_REASON_OF = {getattr(_jpegcrop, name): why for name, why in REASONS.items()} \
    if _jpegcrop is not None else {}
Box = tuple[float, float, float, float]
# Bytes a real photo never holds where libjpeg skips them: stray bytes before a marker
# (libjpeg's "extraneous bytes") and data after the end-of-image marker above these are
# padding or another file, an error; fewer convert, listed (docs/convert.md, "Damage").
PADDING_LIMIT = 64 * 1024
TRAILING_LIMIT = 64 * 1024


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
class Scan:
    """What reading a JPEG's data to its end found (the extension's report)."""

    warnings: int = 0  # libjpeg's warnings (corrupt data it decoded around)
    first: str = ""  # the first warning, in libjpeg's words
    eof: bool = False  # the data ran out before an end-of-image marker
    hit_marker: bool = False  # a marker came before the scan's last block
    padding: int = 0  # the most bytes libjpeg skipped before one marker
    trailing: int = 0  # bytes after the end-of-image marker
    error: str = ""  # libjpeg's error: the data could not be read to its end
    refused: bool = False  # ``error`` is the budget's refusal (imgprep.budget)

    @classmethod
    def of(cls, report: dict[str, Any]) -> Scan:
        return cls(warnings=report["warnings"], first=report["first"],
                   eof=bool(report["eof"]), hit_marker=bool(report["hit_marker"]),
                   padding=report["padding"], trailing=report["trailing"],
                   error=report["error"], refused=bool(report.get("refused", 0)))

    def damage(self) -> str | None:
        """Why the file is damaged (cut short, padded, trailing data, unreadable) or refused
        (over its budget), or None when its pixels are whole."""
        if self.refused:
            return f"refused: {self.error}"
        if self.error:
            return f"damaged JPEG data: {self.error}"
        end = "and no end-of-image marker" if self.eof else "before a marker"
        if self.padding > PADDING_LIMIT:
            return (f"padded JPEG: the image data is followed by {self.padding} bytes that "
                    f"are not image data {end} (over {PADDING_LIMIT}: a file written only "
                    "in part, such as a preallocated one)")
        if self.eof:
            return ("truncated JPEG: the data ends without an end-of-image marker (cut short, "
                    "or written only in part)")
        if self.hit_marker:
            return ("truncated JPEG: the entropy-coded data ends before the image's last "
                    "block (premature end of data segment)")
        if self.trailing > TRAILING_LIMIT:
            return (f"JPEG with {self.trailing} bytes of trailing data after its "
                    f"end-of-image marker (over {TRAILING_LIMIT}: another file, or padding)")
        return None

    def notes(self) -> str:
        """What a whole image's reading still found (empty when nothing): libjpeg's
        warnings and trailing bytes, for the warnings log."""
        parts = []
        if self.warnings:
            more = f" (and {self.warnings - 1} more)" if self.warnings > 1 else ""
            parts.append(f"libjpeg: {self.first}{more}")
        if self.trailing:
            parts.append(f"{self.trailing} bytes after the end-of-image marker")
        return "; ".join(parts)


def check(data: bytes) -> Scan:
    """Read every scan of the JPEG ``data`` to its end under the per-image budget
    (``imgprep.budget``), making no pixels (about two thirds of a decode's time); ValueError
    where the extension is not built (``imgprep.imagefile.jpeg_scan`` serves either way)."""
    if _jpegcrop is None:
        raise ValueError(f"the crop-aware decoder is not built ({_MISSING})")
    return Scan.of(_jpegcrop.probe(data, True).report)


def pixel_limit() -> int | None:
    """The most pixels an image may declare: Pillow's decompression-bomb error rule, twice
    ``PIL.Image.MAX_IMAGE_PIXELS``, read at each call so that a user's setting holds; None
    where the user turned Pillow's check off (``MAX_IMAGE_PIXELS = None``)."""
    most = Image.MAX_IMAGE_PIXELS
    return None if most is None else 2 * int(most)


def check_pixels(width: int, height: int) -> None:
    """The check Pillow's ``Image.open`` makes of a declared size, made before a frame of
    that size: ``Image.DecompressionBombError`` over ``pixel_limit``, a
    ``DecompressionBombWarning`` over ``MAX_IMAGE_PIXELS``, the same words either way."""
    Image._decompression_bomb_check((width, height))


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
    r = _jpegcrop.probe(data)
    return Probe(r.width, r.height, _REASON_OF.get(r.code) if r.code else None)


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
        """The buffer for a ``width`` x ``height`` RGBX image, and the image over it
        (ValueError past ``pixel_limit``: never the allocation a forged header asks for)."""
        limit = pixel_limit()
        if width < 1 or height < 1 or (limit is not None and width * height > limit):
            raise ValueError(f"a {width}x{height} frame is outside 1 .. {limit} pixels")
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

    def decode(self, data: bytes, p: Probe, scale: int, region: tuple[int, int, int, int],
               *, whole: bool = False) -> tuple[Image.Image | None, Scan]:
        """Decode ``region`` (left, top, right, bottom, in pixels at 1/``scale``) of the JPEG
        ``data`` into the frame: the RGBX image of the whole scaled size, whose pixels are
        the full decode's in ``region`` (and undefined outside), or None when libjpeg warned
        about corrupt data (decode it the Pillow way); and what the reading found (of the
        whole file with ``whole``, which also reads the data below the region)."""
        if _jpegcrop is None or p.reason is not None:
            raise ValueError(f"the crop-aware decoder declines this image: {p.reason}")
        w, h = -(-p.width // scale), -(-p.height // scale)
        buf, img = self.view(w, h)
        scan = Scan.of(_jpegcrop.decode(data, buf, scale, *region, whole).report)
        return (None if scan.warnings else img), scan


# sample's statuses, as the extension exports them (None where it is not built)
SAMPLE_DONE, SAMPLE_DECLINED, SAMPLE_FAILED, SAMPLE_REFUSED = (
    getattr(_jpegcrop, f"SAMPLE_{n}", None) for n in ("DONE", "DECLINED", "FAILED", "REFUSED"))


@dataclass(frozen=True)
class Sampled:
    """What ``sample`` did: ``status`` SAMPLE_DONE (``whole``: the whole image was decoded and
    its data read to its end, ``scan`` saying what that found; else a region, ``scan``
    None), SAMPLE_DECLINED (a colour space libjpeg makes no RGB of: decode it with Pillow),
    SAMPLE_FAILED or SAMPLE_REFUSED (over its budget, ``imgprep.budget``; ``message`` says
    why)."""

    status: int
    whole: bool
    message: str
    scan: Scan | None = None


def sample(data: bytes, width: int, height: int, *, draft: tuple[int, int] | None,
           resize: tuple[int, int] | None, box: Box | None, crop: tuple[int, int, int, int],
           out: np.ndarray, flip: bool, planar: bool, whole: bool) -> Sampled:
    """The loader's per-sample work in one C call without the GIL: the JPEG ``data`` (whose
    header says ``width`` x ``height``) decoded at the DCT scale Pillow's ``draft`` picks for
    ``draft`` (None: full size), only the rows and iMCU columns that the resample reads unless
    ``whole``; ``box`` (original pixels; None: the whole image) resampled to ``resize`` by
    imgprep's resampler (bilinear, Pillow's filter semantics; None: nothing resampled), and
    the ``crop`` (left, top, right, bottom) of that written into ``out`` (uint8, C-contiguous:
    3 x H x W when ``planar``, else H x W x 3), mirrored when ``flip``. A region that meets
    corrupt data is decoded again whole, as Pillow decodes it, and a whole decode's ``scan``
    is for the caller to judge (``Scan.damage``). ValueError on bad arguments."""
    if _jpegcrop is None or not hasattr(_jpegcrop, "sample"):
        raise ValueError(f"the crop-aware decoder is not built ({_MISSING or 'an older one'})")
    limit = pixel_limit()
    r = _jpegcrop.sample(data, width, height, draft or (0, 0), resize or (0, 0), box, crop,
                         flip, planar, whole, 0 if limit is None else limit, out)
    return Sampled(r.status, r.path == _jpegcrop.SAMPLE_WHOLE, r.message,
                   None if r.scan is None else Scan.of(r.scan))


def pack(src: Image.Image | np.ndarray, src_width: int, box: tuple[int, int, int, int],
         out: np.ndarray, *, flip: bool, planar: bool) -> None:
    """Copy ``box`` (left, top, right, bottom) of an RGBX/RGB Pillow image, or of a frame
    buffer ``src_width`` pixels wide, into ``out`` (uint8, C-contiguous): 3 x H x W when
    ``planar``, else H x W x 3; mirrored left-right when ``flip``. One pass in C."""
    if _jpegcrop is None:
        raise ValueError(f"the crop-aware decoder is not built ({_MISSING})")
    left, top, right, bottom = box
    if not (0 <= left < right <= src_width and 0 <= top < bottom):
        raise ValueError(f"the box {box} lies outside the source image ({src_width} pixels "
                         "wide) or is empty: 0 <= left < right <= src_width, 0 <= top < bottom")
    if isinstance(src, Image.Image):
        if src.mode not in ("RGB", "RGBX"):
            raise ValueError(f"pack takes RGB or RGBX images, not {src.mode}")
        source: object = src.im.__arrow_c_array__()
    else:
        source = src
    _jpegcrop.pack(source, src_width, left, top, right - left, bottom - top, out, flip, planar)
