"""Stored pixels through the C extension: a JPEG made a stored-pixel record (``record``),
and a record carried to a batch row crop first (``sample``). The record's layout is
``imgprep.rawformat``'s.

``record`` keeps the JPEG's full-scale decode by the extension's libjpeg-turbo: for ``yuv420``
its own Y, Cb and Cr planes (libjpeg's raw-data decode, nothing upsampled or converted; a
JPEG that is not YCbCr 4:2:0 is kept as ``rgb``), for ``rgb`` its RGB rows. ``sample`` checks
the record's length against its header before any pixel is read, plans the geometry as the
JPEG path does at DCT scale 1, and resamples only the rows and columns the crop reaches with
imgprep's resampler, YUV rows made from the planes as it asks for them (libjpeg-turbo's fancy
upsampling and colour conversion, the same arithmetic): so the pixels are those of the JPEG
path wherever it decodes at scale 1.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from imgprep.errors import ImageError
from imgprep.rawformat import BY_CODE, BY_NAME, Kind

_ext: ModuleType | None
try:
    from imgprep import _jpegcrop as _ext
except ImportError:  # built optionally; stored pixels need it
    _ext = None

AVAILABLE = _ext is not None and hasattr(_ext, "raw_sample")
Box = tuple[float, float, float, float]


def require() -> ModuleType:
    """The extension, or ImageError saying that stored pixels need it."""
    if _ext is None or not AVAILABLE:
        raise ImageError("stored pixels (--store yuv420, rgb, mixed) need imgprep's C "
                         "extension, which is not built here (docs/install.md)")
    return _ext


def record(jpeg: bytes, kind: Kind, max_pixels: int = 0) -> tuple[bytes, Kind]:
    """The record of ``kind`` of the JPEG ``jpeg`` and the kind stored (``rgb`` for a JPEG
    that is not YCbCr 4:2:0 asked for as ``yuv420``); ImageError when it does not decode
    clean or breaks the per-image budget (``max_pixels``: 0 for no limit)."""
    ext = require()
    r = ext.raw_record(jpeg, kind.code, max_pixels)
    if r.status != ext.SAMPLE_DONE:
        what = "refused" if r.status == ext.SAMPLE_REFUSED else "cannot store its pixels"
        raise ImageError(f"{what}: {r.message}")
    return r.record, BY_CODE[r.mode]


def sample(data: bytes | memoryview, width: int, height: int, *, resize: tuple[int, int] | None,
           box: Box | None, crop: tuple[int, int, int, int], out: np.ndarray, flip: bool,
           planar: bool, max_pixels: int = 0, kernel: int = -1) -> None:
    """The record ``data`` (``width`` x ``height`` as its header says) carried to ``out`` as
    ``jpegcrop.sample`` carries a JPEG at DCT scale 1 (``resize``, ``box``, ``crop``,
    ``flip``, ``planar`` are its); ImageError for a record that is not one, ValueError for a
    geometry that does not fit it (both before any pixel is read). ``kernel``: the
    resampler's (``imgprep.resample``; -1, the best this CPU runs: the same bytes)."""
    ext = require()
    r = ext.raw_sample(data, width, height, resize or (0, 0), box, crop, flip, planar,
                       max_pixels, out, kernel)
    if r.status != ext.SAMPLE_DONE:
        raise ImageError(r.message)


def kind_of(name: str) -> Kind:
    """The kind of stored pixels called ``name`` (``yuv420`` or ``rgb``)."""
    return BY_NAME[name]
