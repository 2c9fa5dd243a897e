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

import math

import numpy as np
from PIL import Image

from imgprep import jpegcrop
from loaders.transforms import (
    SampleError,
    TrainTransform,
    Transform,
    ValTransform,
    bomb,
    draft_request,
    draw,
    train_sample,
    val_sample,
)

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
        (the message names ``where``)."""
        p = jpegcrop.probe(data) if self.frame is not None else None
        if p is not None and p.width > 0:  # libjpeg read the header
            try:
                jpegcrop.check_pixels(p.width, p.height)
            except Image.DecompressionBombError as e:
                raise bomb(where, e) from e
        t = self.transform
        done = False
        if isinstance(t, TrainTransform):
            drawn = None
            if p is not None and p.reason is None:
                drawn = draw(p.width, p.height, t, rng)
                done = self._train(data, p, t, drawn, out)
            if not done:
                train_sample(data, t, rng, out, where, planar=self.planar, drawn=drawn)
        else:
            if p is not None and p.reason is None:
                done = self._val(data, p, t, out)
            if not done:
                val_sample(data, t, out, where, planar=self.planar)
        if done:
            self.fast_count += 1
        else:
            self.pillow_count += 1

    def _decode(self, data: bytes, p: jpegcrop.Probe, scale: int,
                region: tuple[int, int, int, int]) -> Image.Image | None:
        assert self.frame is not None
        try:
            return self.frame.decode(data, p, scale, region)[0]
        except ValueError:
            return None  # libjpeg gave up: the Pillow path raises what it raises today

    def _train(self, data: bytes, p: jpegcrop.Probe, t: TrainTransform,
               drawn: tuple[tuple[float, float, float, float], bool], out: np.ndarray) -> bool:
        (left, top, right, bottom), flip = drawn
        w, h = p.width, p.height
        scale = jpegcrop.draft_scale(w, h, draft_request(w, h, t, (left, top, right, bottom)))
        sw, sh = -(-w // scale), -(-h // scale)
        sx, sy = sw / w, sh / h
        box = (left * sx, top * sy, right * sx, bottom * sy)
        x0, x1 = jpegcrop.reach(box[0], box[2], t.size, sw)
        y0, y1 = jpegcrop.reach(box[1], box[3], t.size, sh)
        img = self._decode(data, p, scale, (x0, y0, x1, y1))
        if img is None:
            return False
        small = img.resize((t.size, t.size), _BILINEAR, box=box)
        jpegcrop.pack(small, t.size, (0, 0, t.size, t.size), out, flip=flip,
                      planar=self.planar)
        return True

    def _val(self, data: bytes, p: jpegcrop.Probe, t: ValTransform, out: np.ndarray) -> bool:
        w, h, size = p.width, p.height, t.size
        if min(w, h) == t.resize:  # a crop of the decoded pixels: nothing resampled
            left, top = (w - size) // 2, (h - size) // 2
            box = (left, top, left + size, top + size)
            img = self._decode(data, p, 1, box)
            if img is None:
                return False
            assert self.frame is not None
            jpegcrop.pack(self.frame.view(w, h)[0], w, box, out, flip=False,
                          planar=self.planar)
            return True
        s = t.resize / min(w, h)
        scale = jpegcrop.draft_scale(w, h, (math.ceil(w * s), math.ceil(h * s)))
        sw, sh = -(-w // scale), -(-h // scale)
        nw, nh = max(size, round(w * s)), max(size, round(h * s))
        left, top = (nw - size) // 2, (nh - size) // 2
        x0, x1 = jpegcrop.reach(left * sw / nw, (left + size) * sw / nw, size, sw)
        y0, y1 = jpegcrop.reach(top * sh / nh, (top + size) * sh / nh, size, sh)
        img = self._decode(data, p, scale, (x0, y0, x1, y1))
        if img is None:
            return False
        jpegcrop.pack(img.resize((nw, nh), _BILINEAR), nw, (left, top, left + size, top + size),
                      out, flip=False, planar=self.planar)
        return True


__all__ = ["SampleDecoder", "SampleError"]
