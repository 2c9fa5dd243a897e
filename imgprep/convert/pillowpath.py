"""Pillow's side of converting an image: identifying it, decoding what libjpeg-turbo alone
cannot, and transform version 1, where Pillow also resamples and encodes.

Every mode ImageNet has becomes 8-bit RGB (or L): CMYK (Adobe-inverted too: Pillow reads the
Adobe marker), P, RGBA, LA, 1-bit, 16-bit, and PNGs named ``.JPEG``. A JPEG is decoded at the
DCT scale Pillow's ``draft`` picks (1/2, 1/4 or 1/8 while the image stays at least ``size``
on both sides). Transform version 1 is what convert wrote before its own C path, and what it
writes where the C extension is not built: draft (except under ``exif_transpose``), Pillow's
resample of the crop box, Pillow's JPEG encoder, the original's comment kept. Every image is
opened and held to its budget by ``imgprep.imagefile``, as the loaders' are.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps

from imgprep import imagefile
from imgprep.convert.converted import Converted, channel_histogram
from imgprep.errors import ImageError
from imgprep.sections import FILTER_NAMES, TransformOptions

VERSION = 1
FILTERS = {name: Image.Resampling[name.upper()] for name in FILTER_NAMES}
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")


def open_image(data: bytes, max_pixels: int) -> Image.Image:
    """Identify ``data`` as an accepted image (``imagefile.identify``) and check its declared
    size before decoding anything. Pillow's warnings (damaged TIFF, bomb size) are the
    caller's to silence."""
    img = imagefile.identify(data)
    w, h = img.size
    if w * h > max_pixels:
        raise ImageError(
            f"{w}x{h} = {w * h} pixels is over the limit of {max_pixels} (--max-pixels)"
        )
    if w < 1 or h < 1:
        raise ImageError(f"degenerate size {w}x{h}")
    return img


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


def decode(img: Image.Image, opts: TransformOptions, *, draft: bool) -> Image.Image:
    """The opened ``img`` decoded (a JPEG at its draft scale when ``draft``), turned by its
    EXIF orientation under ``exif_transpose``, and made 8-bit RGB or L. Inside
    ``imagefile.decoding``."""
    if img.format in ("JPEG", "MPO") and draft:
        img.draft(img.mode, (opts.size, opts.size))
    img.load()
    if opts.exif_transpose:
        img = ImageOps.exif_transpose(img)
    if img.mode in (*_SIXTEEN_BIT, "I", "F"):
        return _to_8bit(img)
    return img if img.mode in ("RGB", "L") else img.convert("RGB")


def crop_box(w: int, h: int, resize: str, size: int) -> tuple[tuple[int, int, int, int],
                                                            tuple[int, int]]:
    """The box of a ``w`` x ``h`` image to resample, and the output size."""
    if resize == "center-crop":
        s = min(w, h)
        left, top = (w - s) // 2, (h - s) // 2
        return (left, top, left + s, top + s), (size, size)
    short = min(w, h)
    out = (max(1, round(w * size / short)), max(1, round(h * size / short)))
    return (0, 0, w, h), out


def convert_pillow(data: bytes, opts: TransformOptions, *, histogram: bool = False,
                   pixels: bool = False) -> Converted:
    """``data`` converted by transform version 1 (Pillow throughout)."""
    with warnings.catch_warnings():  # one per image: entering one costs ~2.5 us
        warnings.simplefilter("ignore")  # damaged-TIFF, bomb-size, palette and EXIF chatter
        img = open_image(data, opts.max_pixels)
        fmt, mode, size0 = img.format or "?", img.mode, img.size
        scan = imagefile.check_budget(img, data)
        with imagefile.decoding(img):
            img = decode(img, opts, draft=not opts.exif_transpose)
            box, out_size = crop_box(img.width, img.height, opts.resize, opts.size)
            if opts.resize == "short-side" and out_size[0] * out_size[1] > opts.max_pixels:
                raise ImageError(
                    f"{size0[0]}x{size0[1]} is too elongated for --resize short-side "
                    f"(output {out_size[0]}x{out_size[1]} is over --max-pixels)")
            img = img.resize(out_size, FILTERS[opts.filter], box=box)
            if img.mode != "RGB":
                img = img.convert("RGB")
            buf = io.BytesIO()
            img.save(buf, "JPEG", quality=opts.quality)  # keeps the original's "comment"
    return Converted(buf.getvalue(), img.size, size0, mode, fmt,
                     channel_histogram(img) if histogram else None,
                     np.asarray(img) if pixels else None, scan.notes() if scan else "")
