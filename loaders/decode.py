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

Bad samples are ``SampleError``s (the loader's ``on_error`` policy), never silent: a header
that declares more pixels than Pillow's decompression-bomb check allows (``jpegcrop.
check_pixels``) before any frame is made, and a JPEG that is cut short, padded or carries
large trailing data (``jpegcrop.Scan.damage``), read to its end wherever the fast path does
not vouch for it (it declined the file, or libjpeg warned in the crop).
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
        if p is not None:
            self._screen(data, p, where, declined=p.reason is not None)
        t = self.transform
        done = False
        if isinstance(t, TrainTransform):
            drawn = None
            if p is not None and p.reason is None:
                drawn = draw(p.width, p.height, t, rng)
                done = self._train(data, p, t, drawn, out, where)
            if not done:
                train_sample(data, t, rng, out, where, planar=self.planar, drawn=drawn)
        else:
            if p is not None and p.reason is None:
                done = self._val(data, p, t, out, where)
            if not done:
                val_sample(data, t, out, where, planar=self.planar)
        if done:
            self.fast_count += 1
        else:
            self.pillow_count += 1

    @staticmethod
    def _screen(data: bytes, p: jpegcrop.Probe, where: str, *, declined: bool) -> None:
        """SampleError for a JPEG header over Pillow's pixel limit, and (``declined``: the
        fast path does not vouch for the file) for a damaged JPEG."""
        if p.width <= 0:
            return  # libjpeg cannot read the headers: not a JPEG, the Pillow path says what
        try:
            jpegcrop.check_pixels(p.width, p.height)
        except ValueError as e:
            raise SampleError(f"{where}: refused: {e}; it is not decoded") from e
        damage = jpegcrop.check(data).damage() if declined else None
        if damage is not None:
            raise SampleError(f"{where}: {damage}; replace the file or load with "
                              "on_error='skip'")

    def _decode(self, data: bytes, p: jpegcrop.Probe, scale: int,
                region: tuple[int, int, int, int], where: str) -> Image.Image | None:
        assert self.frame is not None
        try:
            img, scan = self.frame.decode(data, p, scale, region)
        except ValueError:
            return None  # libjpeg gave up: the Pillow path raises what it raises today
        if img is None:  # libjpeg warned: the whole file is read before the Pillow path
            self._screen(data, p, where, declined=True)
        return img

    def _train(self, data: bytes, p: jpegcrop.Probe, t: TrainTransform,
               drawn: tuple[tuple[float, float, float, float], bool], out: np.ndarray,
               where: str) -> bool:
        (left, top, right, bottom), flip = drawn
        w, h = p.width, p.height
        scale = jpegcrop.draft_scale(w, h, draft_request(w, h, t, (left, top, right, bottom)))
        sw, sh = -(-w // scale), -(-h // scale)
        sx, sy = sw / w, sh / h
        box = (left * sx, top * sy, right * sx, bottom * sy)
        x0, x1 = jpegcrop.reach(box[0], box[2], t.size, sw)
        y0, y1 = jpegcrop.reach(box[1], box[3], t.size, sh)
        img = self._decode(data, p, scale, (x0, y0, x1, y1), where)
        if img is None:
            return False
        small = img.resize((t.size, t.size), _BILINEAR, box=box)
        jpegcrop.pack(small, t.size, (0, 0, t.size, t.size), out, flip=flip,
                      planar=self.planar)
        return True

    def _val(self, data: bytes, p: jpegcrop.Probe, t: ValTransform, out: np.ndarray,
             where: str) -> bool:
        w, h, size = p.width, p.height, t.size
        if min(w, h) == t.resize:  # a crop of the decoded pixels: nothing resampled
            left, top = (w - size) // 2, (h - size) // 2
            box = (left, top, left + size, top + size)
            img = self._decode(data, p, 1, box, where)
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
        img = self._decode(data, p, scale, (x0, y0, x1, y1), where)
        if img is None:
            return False
        jpegcrop.pack(img.resize((nw, nh), _BILINEAR), nw, (left, top, left + size, top + size),
                      out, flip=False, planar=self.planar)
        return True


__all__ = ["SampleDecoder", "SampleError"]
