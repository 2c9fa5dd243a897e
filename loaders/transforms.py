"""The transforms (what a sample becomes: its crop geometry, drawn once) and the Pillow path
that carries one out, straight into a uint8 CHW batch row.

A transform decides what a sample becomes before any pixel is decoded: its ``geometry(w, h,
rng)`` (a ``Geometry``: the DCT scale to draft a JPEG to, the region resampled and its size,
the output crop, the flip), drawn from the sample's generator and the image's size alone.
That is the one home of the crop geometry; the Pillow path here (``apply``) and the
crop-aware path (``loaders.decode``) both carry a geometry out, so their pixels agree.

Train: random-resized-crop (torchvision's sampling: scale 0.08–1 of the area, aspect ratio
3/4–4/3, ten tries then a center fallback) done as JPEG draft + one ``resize(box=…)`` of the
crop, so no full-size intermediate is ever made, then a horizontal flip by index reversal,
then, with an augmentation policy (``TrainTransform(augment=...)``, ``loaders.augment``), its
ops, drawn after the box and the flip from the same generator and carried out on the batch
row by ``imgprep.augment`` (``augmented``), the same C call on every path.
Val: the short side to ``resize`` (a no-op for 256 px shards), then the center ``size`` crop.
Pixels stay uint8 CHW; normalisation happens on the device (``loaders.device``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image

from imgprep import ImgprepError, cropdraw, imagefile
from imgprep.augment import Op
from imgprep.augment import apply as apply_ops
from loaders.augment import Policy, check_policy

_BILINEAR = Image.Resampling.BILINEAR
_FLIP = Image.Transpose.FLIP_LEFT_RIGHT


class SampleError(ImgprepError, ValueError):
    """A sample that cannot be decoded; the message names its shard (or file) and key."""


Box = tuple[float, float, float, float]  # left, top, right, bottom


@dataclass(frozen=True, kw_only=True)
class Geometry:
    """What one image becomes, in the order both decode paths carry it out: decode (a JPEG
    drafted so that its whole would be at least ``draft``; None: full size), resample
    ``box`` (the source's pixels; None: the whole image) to ``resize`` (None: nothing is
    resampled), keep the ``crop`` of the result (left, top, right, bottom), mirror it if
    ``flip``, then carry out the ``augment`` ops in order (``imgprep.augment``)."""

    draft: tuple[int, int] | None
    resize: tuple[int, int] | None
    box: Box | None
    crop: tuple[int, int, int, int]
    flip: bool
    augment: tuple[Op, ...] = ()


@dataclass(frozen=True, kw_only=True)
class TrainTransform:
    """Random-resized-crop + horizontal flip (the ResNet-50 training recipe), then, with
    ``augment`` (a ``loaders.augment`` policy: ``policy("ta_wide")``...), its ops."""

    size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)  # of the image's area
    ratio: tuple[float, float] = (3 / 4, 4 / 3)  # width / height
    flip: bool = True
    augment: Policy | None = None

    def __post_init__(self) -> None:
        lo, hi = self.scale
        if self.size < 1 or not 0 < lo <= hi <= 1 or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"{self}: size must be >= 1, 0 < scale[0] <= scale[1] <= 1 "
                             "and 0 < ratio[0] <= ratio[1]")
        check_policy(self.augment)

    def geometry(self, w: int, h: int, rng: np.random.Generator) -> Geometry:
        """A sample's random draws, always in this order: its crop box, then its flip, then
        (with ``augment``) its ops; the box is resampled to ``size`` x ``size`` from a JPEG
        drafted as far as it allows. Without ``augment`` nothing more is drawn."""
        box: Box
        if cropdraw.AVAILABLE and max(w, h) <= cropdraw.MAX_SIDE:  # the same draws, in C
            box, flip = cropdraw.crop_draw(rng, w, h, self.scale, self.ratio, self.flip)
        else:
            box = crop_box(w, h, self, rng)
            flip = self.flip and bool(rng.random() < 0.5)
        ops = () if self.augment is None else self.augment.draw(self.size, rng)
        left, top, right, bottom = box
        draft = (math.ceil(w * self.size / (right - left)),
                 math.ceil(h * self.size / (bottom - top)))
        return Geometry(draft=draft, resize=(self.size, self.size), box=box,
                        crop=(0, 0, self.size, self.size), flip=flip, augment=ops)

    def at_size(self, size: int) -> TrainTransform:
        """The same transform making ``size`` x ``size`` images (a size schedule's epoch)."""
        return replace(self, size=size)


CROP_RATIO = 0.875  # ValTransform: the center crop over the resized short side (224 / 256)


@dataclass(frozen=True, kw_only=True)
class ValTransform:
    """Short side to ``resize``, then the center ``size`` crop. Give ``resize`` or
    ``crop_ratio`` (``size / resize``; default 0.875, ImageNet's 224 of 256), or both when
    they agree (``resize == round(size / crop_ratio)``); the other is filled in."""

    size: int = 224
    resize: int | None = None  # None: round(size / crop_ratio)
    crop_ratio: float | None = None  # None: size / resize, or CROP_RATIO without resize

    def __post_init__(self) -> None:
        ratio, resize = self.crop_ratio, self.resize
        if ratio is not None and not 0 < ratio <= 1:
            raise ValueError(f"{self}: crop_ratio must be in (0, 1]")
        if self.size < 1 or (resize is not None and resize < 1):
            raise ValueError(f"{self}: size and resize must be >= 1")
        if resize is None:
            resize = round(self.size / (ratio or CROP_RATIO))
        if ratio is not None and resize != round(self.size / ratio):
            raise ValueError(f"{self}: resize {resize} is not size / crop_ratio "
                             f"({self.size / ratio:g}); give one of them")
        object.__setattr__(self, "resize", resize)
        object.__setattr__(self, "crop_ratio", ratio or self.size / resize)

    def at_size(self, size: int) -> ValTransform:
        """The same crop ratio at ``size``: the short side resized to ``size / crop_ratio``
        (at its own size, the transform itself)."""
        if size == self.size:
            return self
        return ValTransform(size=size, crop_ratio=self.crop_ratio)

    def geometry(self, w: int, h: int, rng: np.random.Generator) -> Geometry:
        """The center crop, of the image itself when its short side is ``resize`` already
        (nothing resampled), else of the whole image resampled so that it is; no draws."""
        size, resize = self.size, int(self.resize or 0)  # filled in by __post_init__
        if min(w, h) == resize:
            left, top = (w - size) // 2, (h - size) // 2
            return Geometry(draft=None, resize=None, box=None,
                            crop=(left, top, left + size, top + size), flip=False)
        s = resize / min(w, h)
        nw, nh = max(size, round(w * s)), max(size, round(h * s))
        left, top = (nw - size) // 2, (nh - size) // 2
        return Geometry(draft=(math.ceil(w * s), math.ceil(h * s)), resize=(nw, nh), box=None,
                        crop=(left, top, left + size, top + size), flip=False)


Transform = TrainTransform | ValTransform


def check_transform(transform: object) -> None:
    """Refuse what is not a transform (a programming error: ValueError)."""
    if not isinstance(transform, TrainTransform | ValTransform):
        raise ValueError(f"transform must be a TrainTransform or a ValTransform, not "
                         f"{transform!r}")


def uniform(rng: np.random.Generator, low: float, high: float) -> float:
    """``rng.uniform(low, high)``, the same double from the same stream (numpy's own formula,
    ``low + (high - low) * next_double``), at a fifth of a scalar ``uniform`` call's cost."""
    return low + (high - low) * rng.random()


def crop_box(w: int, h: int, t: TrainTransform, rng: np.random.Generator) -> Box:
    """A random-resized-crop box ``(left, top, right, bottom)`` in a ``w``×``h`` image: the
    reference of the extension's draws (``imgprep.cropdraw``), which make the same ones."""
    area = w * h
    log_lo, log_hi = math.log(t.ratio[0]), math.log(t.ratio[1])
    for _ in range(10):
        target = area * uniform(rng, t.scale[0], t.scale[1])
        aspect = math.exp(uniform(rng, log_lo, log_hi))
        cw = round(math.sqrt(target * aspect))
        ch = round(math.sqrt(target / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            left = int(rng.integers(0, w - cw + 1))
            top = int(rng.integers(0, h - ch + 1))
            return left, top, left + cw, top + ch
    # Fallback: the whole image, clamped to the ratio range, centered.
    in_ratio = w / h
    if in_ratio < t.ratio[0]:
        cw, ch = w, round(w / t.ratio[0])
    elif in_ratio > t.ratio[1]:
        cw, ch = round(h * t.ratio[1]), h
    else:
        cw, ch = w, h
    left, top = (w - cw) // 2, (h - ch) // 2
    return left, top, left + cw, top + ch


def into_chw(img: Image.Image, out: np.ndarray) -> None:
    """Copy an RGB image into ``out`` (3 x H x W uint8) a plane at a time. Pillow splits the
    planes in C and each plane's bytes are contiguous, which costs about 40 % less than
    numpy's strided HWC -> CHW copy of ``np.asarray(img)``."""
    for plane, channel in zip(out, img.split(), strict=True):
        plane[...] = np.frombuffer(channel.tobytes(), np.uint8).reshape(plane.shape)


def into(img: Image.Image, out: np.ndarray, planar: bool) -> None:
    """Copy an RGB image into ``out``: 3 x H x W when ``planar``, else H x W x 3."""
    if planar:
        into_chw(img, out)
    else:
        out[...] = np.frombuffer(img.tobytes(), np.uint8).reshape(out.shape)


def augmented(out: np.ndarray, g: Geometry, planar: bool) -> None:
    """Carry ``g``'s augmentation ops out on a written batch row (``imgprep.augment.apply``:
    one C call, the same on every decode path); nothing without ops."""
    if g.augment:
        apply_ops(out, g.augment, planar=planar)


def bomb(where: str, e: Image.DecompressionBombError) -> SampleError:
    """The error of a sample whose header declares more pixels than Pillow's bomb check
    allows (twice ``Image.MAX_IMAGE_PIXELS``), the same from either decode path."""
    return SampleError(f"{where}: refused before decoding: {e} (PIL.Image.MAX_IMAGE_PIXELS "
                       "sets the limit)")


@contextlib.contextmanager
def _as_sample(where: str) -> Iterator[None]:
    """``imagefile``'s refusals as the sample's ``SampleError`` (a bomb in the words both
    decode paths use)."""
    try:
        yield
    except ImgprepError as e:
        if isinstance(e.__cause__, Image.DecompressionBombError):
            raise bomb(where, e.__cause__) from e
        raise SampleError(f"{where}: {e}") from e


@contextlib.contextmanager
def decoding(img: Image.Image, where: str) -> Iterator[None]:
    """Any failure of Pillow's decoders on ``img`` (``imagefile.decoding``) as the sample's
    ``SampleError``, so that ``on_error`` holds it whatever the decoder raised."""
    with _as_sample(where), imagefile.decoding(img):
        yield


def open_sample(data: bytes, where: str) -> Image.Image:
    """``data`` opened for Pillow as convert opens it (``imagefile``: the accepted formats,
    Pillow's bomb rule, the per-image budget, convert's damage rule), or ``SampleError``."""
    with _as_sample(where):
        img = imagefile.identify(data)
        imagefile.check_budget(img, data)
    return img


def pillow_decode(data: bytes, t: Transform, rng: np.random.Generator, where: str = "sample",
                  geometry: Geometry | None = None) -> tuple[Image.Image, Geometry, Box | None]:
    """Open ``data`` with Pillow, draft a JPEG as ``t``'s geometry (``geometry``: the one
    ``t`` already drew for it) asks and make it RGB: the image (pixels decoded when first
    read), the geometry, and its box in the decoded pixels (None: the whole image)."""
    with _as_sample(where):  # opened as convert opens it: formats, Pillow's bomb rule
        img = imagefile.identify(data)
    w, h = img.size
    g = geometry or t.geometry(w, h, rng)  # drawn from the header, as the extension's path
    with _as_sample(where):  # the budget and convert's damage rule, before any pixel
        imagefile.check_budget(img, data)
    with decoding(img, where):
        if g.draft is not None and img.format == "JPEG":
            img.draft("RGB", g.draft)
        if img.mode != "RGB":
            img = img.convert("RGB")
    sx, sy = img.width / w, img.height / h  # the draft's scale
    box = None if g.box is None else (g.box[0] * sx, g.box[1] * sy, g.box[2] * sx,
                                      g.box[3] * sy)
    return img, g, box


# A resize larger than this (an extreme aspect ratio's short side brought to the val size: a
# 1 x 20,000 strip to 256 is 256 x 5,120,000) resamples only the window kept: Pillow would
# make the whole image first. The box is then Pillow's float32 one, so a pixel may differ by
# a unit from a whole resize's (the extension's path keeps the whole resize's bytes).
WHOLE_RESIZE_MOST = 1 << 24


def _window_only(box: Box, size: tuple[int, int], crop: tuple[int, int, int, int]
                 ) -> tuple[Box, tuple[int, int], tuple[int, int, int, int]]:
    """The box, size and crop that resample only ``crop`` of ``box`` resized to ``size``."""
    sx, sy = (box[2] - box[0]) / size[0], (box[3] - box[1]) / size[1]
    left, top, right, bottom = crop
    sub = (box[0] + left * sx, box[1] + top * sy, box[0] + right * sx, box[1] + bottom * sy)
    return sub, (right - left, bottom - top), (0, 0, right - left, bottom - top)


def apply(data: bytes, t: Transform, rng: np.random.Generator, out: np.ndarray,
          where: str = "sample", *, planar: bool = True, geometry: Geometry | None = None
          ) -> None:
    """Run ``t`` on one encoded image the Pillow way (Pillow's decode and Pillow's resize),
    writing ``out`` (3×size×size uint8, or size×size×3 unless ``planar``); ``geometry``:
    the one ``t`` already drew for it."""
    img, g, box = pillow_decode(data, t, rng, where, geometry)
    with decoding(img, where):
        size, crop = g.resize, g.crop
        if size is not None and size[0] * size[1] > WHOLE_RESIZE_MOST:
            box, size, crop = _window_only(box or (0, 0, *img.size), size, crop)
        if size is not None:
            img = img.resize(size, _BILINEAR, box=box)
        if crop != (0, 0, *img.size):
            img = img.crop(crop)
        if g.flip:
            img = img.transpose(_FLIP)
        into(img, out, planar)
    augmented(out, g, planar)
