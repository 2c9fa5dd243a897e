"""A worker's sample decoder: imgprep's own decode and resample where the extension is built,
Pillow's otherwise.

With the extension (``crop_decode`` None or True), a JPEG libjpeg-turbo reads becomes its
batch row in one C call without the GIL (``imgprep.jpegcrop.sample``): decoded at the DCT
scale Pillow's ``draft`` would pick (only the rows and iMCU columns the crop and the filter's
reach cover, for a file the crop-aware probe takes; the whole image, read to its end, for
one it declines: progressive, arithmetic-coded, RGB, trailing data ...), the transform's box
resampled by imgprep's resampler (``imgprep.resample``: bilinear, Pillow's filter semantics,
fixed point, the same bytes on every CPU), then written RGB, mirrored if drawn so, planar
(CHW) or channels-last (HWC). Only what libjpeg-turbo cannot decode (PNG and other formats,
CMYK and YCCK JPEGs) is decoded by Pillow, and is then resampled by the same resampler. So
the pixels do not depend on which Pillow is installed, but for those few (docs/loaders.md);
``PIXELS`` names them in the loader's state.

Without it (``crop_decode=False``, or the extension not built), every image takes the Pillow
path (``loaders.transforms.apply``: Pillow's decode and resize), whose pixels are the
installed Pillow's (pillow-simd's are the resampler's, byte for byte; stock Pillow's differ
by a unit or two, docs/resampling.md).

The transform's geometry is drawn once, from the header's size, in Python, so the sample
order, boxes, flips and augmentation ops are the same on every path. A training transform's
augmentation ops (``TrainTransform.augment``, ``loaders.augment``) are carried out on the
written row after the resample and flip by one C call (``imgprep.augment.apply``, through
``loaders.transforms.augmented``) on every path: the crop-aware and whole decodes, the
Pillow-decoded fallback, and the Pillow path; the pixel version says so (``pixel_version``:
``"+augment-1"``). A header that declares more pixels than Pillow's decompression-bomb check
allows is a ``SampleError`` (the loader's ``on_error`` policy) before any frame is made, in
the words of the Pillow path's refusal (``jpegcrop.check_pixels``). Every image is held to
the per-image budget (``imgprep.budget``: inside the extension, or by ``imgprep.imagefile``
before Pillow decodes it), opened by convert's list of formats, and judged by convert's
damage rule (``jpegcrop.Scan.damage``, on
what a whole decode read to the end; docs/loaders.md says where a region decode reads less).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from imgprep import jpegcrop, resample
from loaders import rawdecode
from loaders.augment import AUGMENT_VERSION
from loaders.transforms import (
    Geometry,
    SampleError,
    TrainTransform,
    Transform,
    apply,
    augmented,
    bomb,
    decoding,
    pillow_decode,
)

# The pixel versions a loader's state records (``loaders.base``): who decodes and resamples,
# and, for a transform that augments, the version of its draws and ops (AUGMENT_VERSION).
PIXELS_IMGPREP = "imgprep-1"  # the extension's libjpeg-turbo and resampler
PIXELS_PILLOW = "pillow"  # the installed Pillow's decode and resize


def uses_extension(fast: bool | None) -> bool:
    """Whether a decoder made with ``fast`` runs the extension (ValueError for True without
    it)."""
    built = jpegcrop.AVAILABLE and resample.AVAILABLE
    if fast and not built:
        raise ValueError(f"fast=True, but the crop-aware decoder is {jpegcrop.status()}; "
                         f"the resampler: {resample.status()}")
    return built if fast is None else bool(fast)


def augments(t: Transform) -> bool:
    """Whether ``t`` carries augmentation ops out (a ``TrainTransform`` with a policy)."""
    return isinstance(t, TrainTransform) and t.augment is not None


def pixel_version(fast: bool | None, augment: bool = False) -> str:
    """The pixel version of a decoder made with ``fast`` (``crop_decode``), of a transform
    that augments (``augment``) or not: ``"imgprep-1"``, ``"pillow"``, or either
    ``"+augment-1"``."""
    pixels = PIXELS_IMGPREP if uses_extension(fast) else PIXELS_PILLOW
    return f"{pixels}+{AUGMENT_VERSION}" if augment else pixels


class SampleDecoder:
    """Decode and augment one encoded image at a time into a batch row.

    Args:
        transform: the loader's ``TrainTransform`` or ``ValTransform``.
        channels_last: rows are size x size x 3 (else 3 x size x size).
        fast: use the extension (None: when it is built; True: refuse to run without).

    ``fast_count``, ``whole_count`` and ``pillow_count`` count the images decoded by region,
    whole by the extension, and by Pillow; ``raw_count`` the stored-pixel samples
    (``loaders.rawdecode``: no decode, crop first).
    """

    def __init__(self, transform: Transform, *, channels_last: bool = False,
                 fast: bool | None = None) -> None:
        self.transform, self.planar = transform, not channels_last
        self.extension = uses_extension(fast)
        self.pixels = pixel_version(fast, augments(transform))
        self.fast_count = self.whole_count = self.pillow_count = self.raw_count = 0

    def __call__(self, data: bytes | memoryview, rng: np.random.Generator, out: np.ndarray,
                 where: str = "sample") -> None:
        """Write ``data`` transformed (and augmented) into ``out``; ``SampleError`` when it
        cannot be decoded (the message names ``where``). A stored-pixel record (bytes, or a
        view of its shard) is not decoded: ``loaders.rawdecode``."""
        if not isinstance(data, bytes) or rawdecode.is_record(data):  # crop first, no decode
            g = rawdecode.sample(data, self.transform, rng, out, where, planar=self.planar)
            self.raw_count += 1
            augmented(out, g, self.planar)
            return
        if not self.extension:  # the Pillow path augments the row it wrote
            apply(data, self.transform, rng, out, where, planar=self.planar)
            self.pillow_count += 1
            return
        augmented(out, self._decode(data, rng, out, where), self.planar)

    def _decode(self, data: bytes, rng: np.random.Generator, out: np.ndarray,
                where: str) -> Geometry:
        """Write ``data`` resampled (and mirrored) into ``out`` with the extension; the
        geometry drawn for it."""
        p = jpegcrop.probe(data)
        if p.width <= 0:  # libjpeg could not read the header: Pillow's format
            return self._pillow(data, rng, out, where, None)
        try:
            jpegcrop.check_pixels(p.width, p.height)
        except Image.DecompressionBombError as e:
            raise bomb(where, e) from e
        g = self.transform.geometry(p.width, p.height, rng)
        if self._jpeg(data, p, g, out, where):
            return g
        return self._pillow(data, rng, out, where, g)

    def _jpeg(self, data: bytes, p: jpegcrop.Probe, g: Geometry, out: np.ndarray,
              where: str) -> bool:
        """Carry ``g`` out in the extension; False where it declines the colour space."""
        whole = p.reason is not None  # declined by the crop-aware probe: decode it all
        done = jpegcrop.sample(data, p.width, p.height, draft=g.draft, resize=g.resize,
                               box=g.box, crop=g.crop, out=out, flip=g.flip,
                               planar=self.planar, whole=whole)
        if done.status == jpegcrop.SAMPLE_FAILED:
            raise SampleError(f"{where}: cannot decode ({done.message})")
        if done.status == jpegcrop.SAMPLE_REFUSED:
            raise SampleError(f"{where}: refused: {done.message}")
        if done.status == jpegcrop.SAMPLE_DECLINED:
            return False
        damage = None if done.scan is None else done.scan.damage()
        if damage is not None:  # convert's rule, on what the whole decode read
            raise SampleError(f"{where}: {damage}")
        if done.whole:
            self.whole_count += 1
        else:
            self.fast_count += 1
        return True

    def _pillow(self, data: bytes, rng: np.random.Generator, out: np.ndarray, where: str,
                g: Geometry | None) -> Geometry:
        """Decode with Pillow (what libjpeg-turbo cannot), resample with the extension; the
        geometry (drawn here when ``g`` is None)."""
        img, g, box = pillow_decode(data, self.transform, rng, where, g)
        with decoding(img, where):
            pixels = np.asarray(img)
        left, top, right, bottom = g.crop
        if g.resize is None:
            resize, box = (img.width, img.height), (0, 0, img.width, img.height)
        else:
            resize, box = g.resize, box or (0, 0, img.width, img.height)
        resample.resize(pixels, box, resize, out, filter="bilinear",
                        window=(left, top, right - left, bottom - top), flip=g.flip,
                        planar=self.planar)
        self.pillow_count += 1
        return g


__all__ = ["PIXELS_IMGPREP", "PIXELS_PILLOW", "SampleDecoder", "SampleError", "augments",
           "pixel_version", "uses_extension"]
