"""Transform version 2: convert's per-image work in imgprep's own C extension
(``imgprep/csrc/convert.c``), one call an image with the GIL released, so that speed and
pixels do not depend on which Pillow is installed.

A JPEG that libjpeg-turbo decodes to RGB (baseline, progressive or arithmetic-coded; YCbCr,
grayscale or RGB) goes through the extension alone: its headers, the DCT scale that Pillow's
``draft`` would pick, only the rows and iMCU columns that the resample reads (then the rest
of the data read to its end, entropy-decoded only, its warnings reported), the EXIF turn under
``exif_transpose``, the crop box or short-side size, the extension's resampler, and its JPEG
encoder (``imgprep/csrc/encode.c``: quality, 4:2:0, baseline, ISLOW, JFIF APP0 as the only
marker). What reading the data to its end found is judged by ``jpegcrop.Scan.damage``: a
file cut short, padded or carrying large trailing data fails; one that libjpeg decodes whole
with warnings converts, and ``Converted.warning`` says what was found. What it declines
(CMYK and YCCK JPEGs, headers libjpeg cannot read, and every other format) Pillow decodes
(``pillowpath.decode``), and the same resampler and encoder finish it.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
from PIL import Image

from imgprep import imagefile, jpegcrop
from imgprep.convert import pillowpath
from imgprep.convert.converted import Converted
from imgprep.errors import ImageError
from imgprep.sections import FILTER_NAMES, TransformOptions

_ext: ModuleType | None
try:
    from imgprep import _jpegcrop as _ext
except ImportError:  # built optionally: transform version 1 serves without it
    _ext = None

VERSION = 2
AVAILABLE = _ext is not None
JPEG_MAGIC = imagefile.JPEG_MAGIC  # what Pillow's JPEG opener accepts
# the extension's status codes, as it exports them (None where it is not built)
CONVERTED, DECLINED, FAILED = (getattr(_ext, n, None) for n in ("CONVERTED", "DECLINED",
                                                                  "FAILED"))
RESIZE = {"center-crop": 0, "short-side": 1}
# the resampler's filters are numbered as Pillow's (imgprep/csrc/resample.h)
FILTER_CODES = {name: int(Image.Resampling[name.upper()]) for name in FILTER_NAMES}
_MODES = {1: "L", 3: "RGB"}


def bomb_pixels() -> int:
    """Pillow's decompression-bomb limit, which the extension applies as Pillow would (0:
    none)."""
    limit = Image.MAX_IMAGE_PIXELS
    return 0 if limit is None else 2 * int(limit)


def one_call(opts: TransformOptions) -> Callable[[bytes], bytes] | None:
    """The extension's call for a JPEG under ``opts`` and nothing around it (no Pillow, no
    Python checks): the floor that convert's per-image work is measured against. None when
    the extension is not built."""
    ext = _ext
    if ext is None:
        return None
    args = (opts.size, RESIZE[opts.resize], FILTER_CODES[opts.filter], opts.quality,
            opts.exif_transpose, False, False, False, opts.max_pixels, bomb_pixels())
    return lambda data: ext.convert(data, *args).jpeg


def convert_native(data: bytes, opts: TransformOptions, *, crop_decode: bool = True,
                   histogram: bool = False, pixels: bool = False) -> Converted:
    """``data`` converted by transform version 2; ``crop_decode=False`` decodes whole images
    where a region would do (the same bytes)."""
    if _ext is None:
        raise ImageError("the C extension is not built: transform version 2 needs it")
    if data[:3] == JPEG_MAGIC:
        r = _ext.convert(data, opts.size, RESIZE[opts.resize], FILTER_CODES[opts.filter],
                         opts.quality, opts.exif_transpose, not crop_decode, histogram, pixels,
                         opts.max_pixels, bomb_pixels())
        if r.status != DECLINED:
            fmt = _pillow_format(data) if r.mpf else "JPEG"
            return _converted(r, (r.width, r.height), _MODES.get(r.components, ""), fmt,
                              imagefile.of_format(jpegcrop.Scan.of(r.scan), fmt))
    with warnings.catch_warnings():  # Pillow's damaged-TIFF, bomb-size and palette chatter
        warnings.simplefilter("ignore")
        return _from_pillow(_ext, data, opts, histogram, pixels)


def _pillow_format(data: bytes) -> str:
    """Pillow's name for a JPEG with a multi-picture segment: MPO, or JPEG when it holds one
    picture."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.format or "JPEG"
    except (OSError, SyntaxError, ValueError):  # its multi-picture index is damaged
        return "JPEG"


def _from_pillow(ext: ModuleType, data: bytes, opts: TransformOptions, histogram: bool,
                 pixels: bool) -> Converted:
    """What the extension declines: decoded by Pillow, finished by the extension."""
    img = pillowpath.open_image(data, opts.max_pixels)
    fmt, mode, size0 = img.format or "?", img.mode, img.size
    scan = imagefile.check_budget(img, data)
    with imagefile.decoding(img):
        rgb = pillowpath.decode(img, opts, draft=True)
        if rgb.mode != "RGB":
            rgb = rgb.convert("RGB")
        pixels_in = rgb.tobytes()
    r = ext.finish(pixels_in, rgb.width, rgb.height, size0[0], size0[1], opts.size,
                    RESIZE[opts.resize], FILTER_CODES[opts.filter], opts.quality, histogram,
                    pixels, opts.max_pixels)
    return _converted(r, size0, mode, fmt, scan)


def _converted(r: Any, size0: tuple[int, int], mode: str, fmt: str,
               scan: jpegcrop.Scan | None) -> Converted:
    """The extension's answer (a ``ConvertResult``) as a Converted, or why not as an
    ImageError (the damage the scan shows first: it names what is wrong with the file, not
    where libjpeg stopped)."""
    if scan is not None and (damage := scan.damage()) is not None:
        raise ImageError(damage)
    if r.status != CONVERTED:
        raise ImageError(r.message)
    w, h = r.out_width, r.out_height
    hist = None if r.levels is None else np.frombuffer(r.levels, np.int64)
    px = None if r.rgb is None else np.frombuffer(r.rgb, np.uint8).reshape(h, w, 3)
    return Converted(r.jpeg, (w, h), size0, mode, fmt, hist, px,
                     scan.notes() if scan is not None else "")
