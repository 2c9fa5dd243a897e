"""One image in, one 256 px RGB JPEG out: draft decode, crop/resize in one pass, encode.

Every mode ImageNet has becomes RGB: L, CMYK (Adobe-inverted too: Pillow reads the Adobe
marker), P, RGBA, LA, 1-bit, 16-bit, and PNGs named ``.JPEG``. JPEG draft mode lets libjpeg
decode large images at 1/2, 1/4 or 1/8 scale (DCT scaling) when the result is still at least
``size`` on the short side, which is where most of the decode time of big images goes.

The center square of a landscape or portrait image is a crop: a baseline YCbCr or grayscale
JPEG decodes, at the same draft scale, only the rows and iMCU columns that the square and the
filter's reach cover (``imgprep.jpegcrop``; all of them for a square or ``short-side``), and
Pillow resamples the same box of that frame; the pixels, and so the output bytes, are those
of the whole-image path. What that decoder declines (``jpegcrop.Probe.reason``: progressive,
CMYK, truncated, trailing data, libjpeg warnings ...), other formats and ``exif_transpose``
take the whole-image path, as does everything when the extension is not built.

Damage is never silent: every JPEG's data is read to its end, by the crop-aware decode
itself (which goes on past the crop, entropy-decoding only) or by ``jpegcrop.check`` before
the whole-image path. A file cut short, padded or carrying large trailing data is an
``ImageError``; one that decodes whole with libjpeg's warnings converts, and ``warning``
says what was found (the warnings log; docs/convert.md, "Damage").
"""

from __future__ import annotations

import array
import io
import threading
import warnings
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from imgprep import jpegcrop
from imgprep.errors import ImageError
from imgprep.sections import FILTER_NAMES, TransformOptions

FILTERS = {name: Image.Resampling[name.upper()] for name in FILTER_NAMES}
# Each filter's support in input pixels at scale 1 (Pillow's Resample.c), widened by the
# shrink factor when shrinking: how far around the box a resample reads.
FILTER_SUPPORT = {"box": 0.5, "bilinear": 1.0, "hamming": 1.0, "bicubic": 2.0, "lanczos": 3.0}
FRAME_PIXELS = 1 << 22  # larger draft-scaled images take the whole-image path (16 MB frame)
JPEG_MAX_SIDE = 65_500  # libjpeg's: a longer output side cannot be encoded
# MPO (multi-picture JPEG) has no opener of its own: the JPEG opener returns it.
ACCEPTED_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP")
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")


@dataclass(frozen=True)
class Converted:
    """The encoded output and the facts about the original worth keeping."""

    jpeg: bytes
    image: Image.Image
    original_size: tuple[int, int]
    original_mode: str
    original_format: str
    warning: str = ""  # what reading the whole original found (the warnings log), if anything


def _to_8bit(img: Image.Image) -> Image.Image:
    """16-bit and 32-bit grayscale to 8-bit L, scaled rather than clipped."""
    arr = np.asarray(img)
    out: np.ndarray
    if img.mode in _SIXTEEN_BIT:
        out = (arr.astype(np.uint32) + 128) // 257
    elif img.mode == "F":
        out = np.clip(arr, 0, 255)
    else:  # "I": 32-bit ints holding 8- or 16-bit data
        out = (arr.astype(np.int64) + 128) // 257 if arr.max(initial=0) > 255 else arr
        out = np.clip(out, 0, 255)
    return Image.fromarray(out.astype(np.uint8), "L")


def _crop_box(w: int, h: int, resize: str, size: int) -> tuple[tuple[int, int, int, int],
                                                             tuple[int, int]]:
    if resize == "center-crop":
        s = min(w, h)
        left, top = (w - s) // 2, (h - s) // 2
        return (left, top, left + s, top + s), (size, size)
    short = min(w, h)
    out = (max(1, round(w * size / short)), max(1, round(h * size / short)))
    return (0, 0, w, h), out


def open_image(data: bytes, max_pixels: int) -> Image.Image:
    """Identify ``data`` as an image and check its declared size before decoding anything.
    Pillow's warnings (damaged TIFF, bomb size) are the caller's to silence."""
    if not data:
        raise ImageError("empty file (0 bytes)")
    try:
        img = Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)
    except UnidentifiedImageError as e:
        head = data[:64].lstrip().lower()
        what = "an HTML page" if head.startswith((b"<!doctype html", b"<html")) else "not an image"
        raise ImageError(f"{what} (no image format recognised)") from e
    except Image.DecompressionBombError as e:
        raise ImageError(f"decompression bomb refused: {e}") from e
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageError(f"unreadable image header: {e}") from e
    w, h = img.size
    if w * h > max_pixels:
        raise ImageError(
            f"{w}x{h} = {w * h} pixels is over the limit of {max_pixels} (--max-pixels)"
        )
    if w < 1 or h < 1:
        raise ImageError(f"degenerate size {w}x{h}")
    return img


def convert_image(data: bytes, opts: TransformOptions, *,
                  crop_decode: bool = True) -> Converted:
    """Decode ``data`` and return it cropped/resized to ``opts.size`` as an RGB JPEG.
    ``crop_decode=False`` forces the whole-image path (the bytes are the same either way)."""
    with warnings.catch_warnings():  # one per image: entering one costs ~2.5 us
        warnings.simplefilter("ignore")  # damaged-TIFF, bomb-size, palette and EXIF chatter
        img = open_image(data, opts.max_pixels)
        scan = None
        if crop_decode and jpegcrop.AVAILABLE:
            done, scan = _crop_decoded(data, img, opts)
            if done is not None:
                return done
        if scan is None and img.format in ("JPEG", "MPO"):
            scan = _scan(img, jpegcrop.check(data))
        if scan is not None and (damage := scan.damage()) is not None:
            raise ImageError(damage)
        conv = _converted(img, opts)
        return replace(conv, warning=scan.notes()) if scan is not None else conv


def _scan(img: Image.Image, scan: jpegcrop.Scan) -> jpegcrop.Scan:
    """``scan`` of ``img``'s file; an MPO's trailing bytes are its other pictures."""
    return replace(scan, trailing=0) if img.format == "MPO" else scan


_scratch = threading.local()  # each thread's decode frame (scratch memory, reused)


def _frame() -> jpegcrop.Frame:
    """This thread's decode frame."""
    frame: jpegcrop.Frame | None = getattr(_scratch, "frame", None)
    if frame is None:
        frame = _scratch.frame = jpegcrop.Frame()
    return frame


def _crop_decoded(data: bytes, img: Image.Image, opts: TransformOptions
                  ) -> tuple[Converted | None, jpegcrop.Scan | None]:
    """The output of a baseline YCbCr or grayscale JPEG from a decode of only the part its
    resample reads (all of it for a square or ``short-side``: the same decode Pillow's would
    be, read to the end of the file at no extra cost), and what reading the whole file
    found; None where that path declines (``_converted`` then does the work) or the file is
    damaged (the scan says how)."""
    if opts.exif_transpose or img.format != "JPEG" or img.mode not in ("RGB", "L"):
        return None, None
    p = jpegcrop.probe(data)
    if p.reason is not None or (p.width, p.height) != img.size:
        return None, None
    scale = jpegcrop.draft_scale(p.width, p.height, (opts.size, opts.size))
    sw, sh = -(-p.width // scale), -(-p.height // scale)  # Pillow's draft size
    if sw * sh > FRAME_PIXELS:
        return None, None
    box, out_size = _crop_box(sw, sh, opts.resize, opts.size)
    if out_size[0] * out_size[1] > opts.max_pixels or max(out_size) > JPEG_MAX_SIDE:
        return None, None  # too elongated for short-side: the whole-image path says so
    support = FILTER_SUPPORT[opts.filter]
    x0, x1 = jpegcrop.reach(box[0], box[2], out_size[0], sw, support)
    y0, y1 = jpegcrop.reach(box[1], box[3], out_size[1], sh, support)
    try:
        frame, scan = _frame().decode(data, p, scale, (x0, y0, x1, y1), whole=True)
    except ValueError:
        return None, None  # libjpeg gave up: the whole-image path says why
    if frame is None or scan.damage() is not None:
        return None, scan  # damaged, or libjpeg warned: the whole-image path decodes it as ever
    out = frame.resize(out_size, FILTERS[opts.filter], box=box).convert("RGB")
    out.info = img.info.copy()  # as the whole-image path's: JPEG save keeps the "comment"
    buf = io.BytesIO()
    out.save(buf, "JPEG", quality=opts.quality)
    return Converted(buf.getvalue(), out, img.size, img.mode, img.format, scan.notes()), scan


def _converted(img: Image.Image, opts: TransformOptions) -> Converted:
    """The opened ``img`` decoded (JPEG at the smallest draft scale that still covers the output),
    made 8-bit RGB, cropped/resized and encoded."""
    fmt, mode, size0 = img.format or "?", img.mode, img.size
    try:
        if fmt in ("JPEG", "MPO") and not opts.exif_transpose:
            img.draft(img.mode, (opts.size, opts.size))
        img.load()
        if opts.exif_transpose:
            img = ImageOps.exif_transpose(img)
        if img.mode in (*_SIXTEEN_BIT, "I", "F"):
            img = _to_8bit(img)
        elif img.mode not in ("RGB", "L"):
            img = img.convert("RGB")
        box, out_size = _crop_box(img.width, img.height, opts.resize, opts.size)
        if opts.resize == "short-side" and out_size[0] * out_size[1] > opts.max_pixels:
            raise ImageError(
                f"{size0[0]}x{size0[1]} is too elongated for --resize short-side "
                f"(output {out_size[0]}x{out_size[1]} is over --max-pixels)"
            )
        img = img.resize(out_size, FILTERS[opts.filter], box=box)
        if img.mode != "RGB":
            img = img.convert("RGB")
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=opts.quality)
    except ImageError:
        raise
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        reason = str(e) or type(e).__name__
        if "truncated" in reason or isinstance(e, EOFError):
            reason = f"truncated image data ({reason})"
        raise ImageError(f"cannot decode {fmt} {mode} {size0[0]}x{size0[1]}: {reason}") from e
    return Converted(buf.getvalue(), img, size0, mode, fmt)


_LEVELS = np.arange(256, dtype=np.int64)


def channel_histogram(img: Image.Image) -> np.ndarray:
    """The RGB image's 3 x 256 histogram as one int64 vector (histograms add up exactly, so
    a task sums them and turns the total into sums once: ``sums_of_histogram``)."""
    return np.frombuffer(array.array("q", img.histogram()), dtype=np.int64)


def sums_of_histogram(hist: np.ndarray) -> np.ndarray:
    """``[[sum_R, sum_G, sum_B], [sumsq_R, …], [pixels]*3]`` of a (summed) RGB histogram."""
    h = np.asarray(hist, dtype=np.int64).reshape(3, 256)
    return np.stack([h @ _LEVELS, h @ (_LEVELS * _LEVELS), h.sum(axis=1)])


def channel_sums(img: Image.Image) -> np.ndarray:
    """Exact integer ``[[sum_R, sum_G, sum_B], [sumsq_R, …], [pixels]*3]`` from the histogram.

    Integers add up the same in any order, so mean/std do not depend on the worker count.
    """
    return sums_of_histogram(channel_histogram(img))


def center_pixels(img: Image.Image, size: int) -> np.ndarray:
    """The central ``size``×``size`` pixels as HWC uint8 (the whole image in center-crop mode)."""
    w, h = img.size
    if (w, h) != (size, size):
        left, top = (w - size) // 2, (h - size) // 2
        img = img.crop((left, top, left + size, top + size))
    return np.asarray(img)
