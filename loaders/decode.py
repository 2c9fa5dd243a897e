"""A worker's sample decoder: the crop-aware JPEG path where it applies, Pillow's otherwise.

The crop-aware path (``imgprep.jpegcrop``) decodes only the rows and iMCU columns that the
crop box and the resize filter's reach cover, at the DCT scale Pillow's ``draft`` would pick,
into a frame that Pillow resamples in place (the same ``resize(box=...)`` as the Pillow
path), then one C pass writes the batch row: RGB, mirrored if drawn so, planar (CHW) or
channels-last (HWC). The pixels are the Pillow path's, byte for byte, so batches do not
depend on which path made them (a resume on a host without the extension gives the same
batches). What the fast path declines (``imgprep.jpegcrop.Probe.reason``: progressive, CMYK,
PNG, truncated or corrupt data ...) takes the Pillow path (``loaders.transforms``), as does
everything when the extension is not built.

A header that declares more pixels than Pillow's decompression-bomb check allows is a
``SampleError`` (the loader's ``on_error`` policy) before any frame is made, with the words
of the Pillow path's refusal (``jpegcrop.check_pixels``); a JPEG without its end-of-image
marker or with large trailing data is one on both paths (``loaders.transforms``: the fast
path takes only files that end with their marker).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from imgprep import jpegcrop
from loaders.transforms import Geometry, SampleError, Transform, apply, bomb

_BILINEAR = Image.Resampling.BILINEAR


class SampleDecoder:
    """Decode and augment one encoded image at a time into a batch row.

    Args:
        transform: the loader's ``TrainTransform`` or ``ValTransform``.
        channels_last: rows are size x size x 3 (else 3 x size x size).
        fast: use the crop-aware path (None: when it is built; True: refuse to run without).

    ``fast_count`` and ``pillow_count`` count the images each path made.
    """

    def __init__(self, transform: Transform, *, channels_last: bool = False,
                 fast: bool | None = None) -> None:
        if fast and not jpegcrop.AVAILABLE:
            raise ValueError(f"fast=True, but the crop-aware decoder is {jpegcrop.status()}")
        self.transform, self.planar = transform, not channels_last
        self.frame = jpegcrop.Frame() if (jpegcrop.AVAILABLE if fast is None else fast) else None
        self.fast_count = self.pillow_count = 0

    def __call__(self, data: bytes, rng: np.random.Generator, out: np.ndarray,
                 where: str = "sample") -> None:
        """Write ``data`` transformed into ``out``; ``SampleError`` when it cannot be decoded
        (the message names ``where``). The transform's geometry is drawn once, from the
        header's size when the crop-aware path takes the image, else by the Pillow path."""
        p = jpegcrop.probe(data) if self.frame is not None else None
        if p is not None and p.width > 0:  # libjpeg read the header
            try:
                jpegcrop.check_pixels(p.width, p.height)
            except Image.DecompressionBombError as e:
                raise bomb(where, e) from e
        g = None
        if p is not None and p.reason is None:
            g = self.transform.geometry(p.width, p.height, rng)
            if self._fast(data, p, g, out):
                self.fast_count += 1
                return
        apply(data, self.transform, rng, out, where, planar=self.planar, geometry=g)
        self.pillow_count += 1

    def _decode(self, data: bytes, p: jpegcrop.Probe, scale: int,
                region: tuple[int, int, int, int]) -> Image.Image | None:
        assert self.frame is not None
        try:
            return self.frame.decode(data, p, scale, region)[0]
        except ValueError:
            return None  # libjpeg gave up: the Pillow path raises what it raises today

    def _fast(self, data: bytes, p: jpegcrop.Probe, g: Geometry, out: np.ndarray) -> bool:
        """Carry ``g`` out the crop-aware way: decode only the rows and columns the crop and
        the filter's reach cover, at the draft's DCT scale; False where libjpeg gives up."""
        w, h = p.width, p.height
        if g.resize is None:  # a crop of the decoded pixels: nothing resampled
            if self._decode(data, p, 1, g.crop) is None:
                return False
            assert self.frame is not None
            jpegcrop.pack(self.frame.view(w, h)[0], w, g.crop, out, flip=g.flip,
                          planar=self.planar)
            return True
        scale = 1 if g.draft is None else jpegcrop.draft_scale(w, h, g.draft)
        sw, sh = -(-w // scale), -(-h // scale)
        box, region = _region(g, g.resize, w, h, sw, sh)
        img = self._decode(data, p, scale, region)
        if img is None:
            return False
        jpegcrop.pack(img.resize(g.resize, _BILINEAR, box=box), g.resize[0], g.crop, out,
                      flip=g.flip, planar=self.planar)
        return True


def _region(g: Geometry, resize: tuple[int, int], w: int, h: int, sw: int, sh: int
            ) -> tuple[tuple[float, float, float, float] | None, tuple[int, int, int, int]]:
    """For an image of ``w`` x ``h`` decoded at ``sw`` x ``sh``: the box to resample (in the
    decoded pixels; None: the whole image) and the region to decode, which the crop and the
    filter's reach cover."""
    if g.box is not None:  # the crop is the whole resampled box
        sx, sy = sw / w, sh / h
        box = (g.box[0] * sx, g.box[1] * sy, g.box[2] * sx, g.box[3] * sy)
        x0, x1 = jpegcrop.reach(box[0], box[2], resize[0], sw)
        y0, y1 = jpegcrop.reach(box[1], box[3], resize[1], sh)
        return box, (x0, y0, x1, y1)
    (left, top, right, bottom), (rw, rh) = g.crop, resize
    x0, x1 = jpegcrop.reach(left * sw / rw, right * sw / rw, right - left, sw)
    y0, y1 = jpegcrop.reach(top * sh / rh, bottom * sh / rh, bottom - top, sh)
    return None, (x0, y0, x1, y1)


__all__ = ["SampleDecoder", "SampleError"]
