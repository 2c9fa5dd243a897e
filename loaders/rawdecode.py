"""Stored-pixel samples (``imgprep.rawformat``): carried to a batch row crop first.

A sample whose image member is a stored-pixel record (a set converted with ``--store
yuv420``, ``rgb`` or ``mixed``) is not decoded: its header gives the image's size, from
which the transform draws the same ``Geometry`` as for a JPEG of that size (the sample's
generator, in the same order, so plans, draws and resume are the JPEG path's), and one C
call without the GIL (``imgprep.rawpixels.sample``) checks the record's length against its
header, reads only the rows (and for YUV 4:2:0 the chroma rows) that the crop and the
filter's reach cover, and resamples them with imgprep's resampler, the chroma upsampling and
colour conversion fused into its pass, into the batch row, flipped as drawn. The geometry's
draft is not read: stored pixels are the JPEG's full-scale decode, so the pixels are the
JPEG path's where it decodes at DCT scale 1 (every random-resized crop of 256 px shards up
to 224 px, and the 256 px centre crop), and within the bound
``tests/loaders/test_rawstore_pixels.py`` measures where it drafts. A record is held to
Pillow's decompression-bomb limit and to its header's length before any pixel is read.

Only the pillow backend with imgprep's extension reads stored pixels: ``check_backend``
refuses the others, and Pillow's own path (``crop_decode=False``), naming what to load
with. The loader's pixel version records the store (``pixel_version``).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from imgprep import ImageError, jpegcrop, rawpixels
from imgprep.rawformat import is_record, read_header
from loaders.errors import LoaderError
from loaders.transforms import Geometry, SampleError, Transform, bomb

__all__ = ["check_backend", "is_record", "pixel_version", "sample"]


def sample(data: bytes | memoryview, t: Transform, rng: np.random.Generator, out: np.ndarray,
           where: str, *, planar: bool) -> Geometry:
    """The record ``data`` carried out as ``t`` draws for it into ``out``; the geometry
    drawn. ``SampleError`` (naming ``where``) for a record that is not whole or over the
    bomb limit."""
    try:
        head = read_header(data)
        jpegcrop.check_pixels(head.width, head.height)
    except ValueError as e:
        raise SampleError(f"{where}: {e}") from e
    except Image.DecompressionBombError as e:
        raise bomb(where, e) from e
    g = t.geometry(head.width, head.height, rng)
    limit = jpegcrop.pixel_limit()
    try:
        rawpixels.sample(data, head.width, head.height, resize=g.resize, box=g.box,
                         crop=g.crop, out=out, flip=g.flip, planar=planar,
                         max_pixels=0 if limit is None else limit)
    except ImageError as e:
        raise SampleError(f"{where}: {e}") from e
    return g


def check_backend(store: str, backend: str, crop_decode: bool | None, where: str) -> None:
    """Refuse to load a set that stores pixels (``store``: its manifest's store mode) with
    anything but the pillow backend over imgprep's extension."""
    if store == "jpeg":
        return
    if backend != "pillow":
        raise LoaderError(f"{where} keeps stored pixels (--store {store}), which the {backend} "
                          "backend does not read (it decodes JPEGs); load it with "
                          "backend='pillow', or convert with --store jpeg")
    if crop_decode is False or not rawpixels.AVAILABLE:
        why = "crop_decode=False asks for Pillow's decode" if crop_decode is False \
            else "imgprep's C extension is not built here"
        raise LoaderError(f"{where} keeps stored pixels (--store {store}), which only imgprep's "
                          f"extension reads, and {why}; load with crop_decode=None")


def pixel_version(base: str | None, store: str) -> str | None:
    """The pixel version of a loader of ``base`` pixels over a set stored as ``store``: the
    store joins it where it is not JPEG (its pixels differ where the JPEG path drafts)."""
    return base if base is None or store == "jpeg" else f"{base}+{store}"
