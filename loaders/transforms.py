"""Per-sample decoding and augmentation with pillow-simd, straight into a uint8 CHW batch.

Train: random-resized-crop (torchvision's sampling: scale 0.08–1 of the area, aspect ratio
3/4–4/3, ten tries then a center fallback) done as JPEG draft + one ``resize(box=…)`` of the
crop, so no full-size intermediate is ever made, then a horizontal flip by index reversal.
Val: the short side to ``resize`` (a no-op for 256 px shards), then the center ``size`` crop.
Pixels stay uint8 CHW; normalisation happens on the device (``loaders.device``).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from imgprep import jpegcrop
from imgprep.errors import ImgprepError

_BILINEAR = Image.Resampling.BILINEAR
_FLIP = Image.Transpose.FLIP_LEFT_RIGHT


class SampleError(ImgprepError, ValueError):
    """A sample that cannot be decoded; the message names its shard (or file) and key."""


@dataclass(frozen=True, kw_only=True)
class TrainTransform:
    """Random-resized-crop + horizontal flip (the ResNet-50 training recipe)."""

    size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)  # of the image's area
    ratio: tuple[float, float] = (3 / 4, 4 / 3)  # width / height
    flip: bool = True

    def __post_init__(self) -> None:
        lo, hi = self.scale
        if self.size < 1 or not 0 < lo <= hi <= 1 or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"{self}: size must be >= 1, 0 < scale[0] <= scale[1] <= 1 "
                             "and 0 < ratio[0] <= ratio[1]")


@dataclass(frozen=True, kw_only=True)
class ValTransform:
    """Short side to ``resize``, then the center ``size`` crop."""

    size: int = 224
    resize: int = 256

    def __post_init__(self) -> None:
        if self.size < 1 or self.resize < 1:
            raise ValueError(f"{self}: size and resize must be >= 1")


Transform = TrainTransform | ValTransform


def crop_box(w: int, h: int, t: TrainTransform, rng: np.random.Generator
             ) -> tuple[float, float, float, float]:
    """A random-resized-crop box ``(left, top, right, bottom)`` in a ``w``×``h`` image."""
    area = w * h
    log_lo, log_hi = math.log(t.ratio[0]), math.log(t.ratio[1])
    for _ in range(10):
        target = area * rng.uniform(t.scale[0], t.scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
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


def bomb(where: str, e: Image.DecompressionBombError) -> SampleError:
    """The error of a sample whose header declares more pixels than Pillow's bomb check
    allows (twice ``Image.MAX_IMAGE_PIXELS``), the same from either decode path."""
    return SampleError(f"{where}: refused before decoding: {e} (PIL.Image.MAX_IMAGE_PIXELS "
                       "sets the limit)")


def _open(data: bytes, where: str) -> Image.Image:
    """The image ``data`` holds, its declared size held to Pillow's decompression-bomb rule,
    and a JPEG's end checked (``jpegcrop.tail_scan``: cut short, padded without its
    end-of-image marker, or large trailing data is an error, never a smeared sample)."""
    try:
        img = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:
        raise bomb(where, e) from e
    except (OSError, SyntaxError, ValueError) as e:
        raise SampleError(f"{where}: not a decodable image ({e})") from e
    damage = jpegcrop.tail_scan(data).damage() if img.format == "JPEG" else None
    if damage is not None:
        raise SampleError(f"{where}: {damage}")
    return img


def draw(w: int, h: int, t: TrainTransform, rng: np.random.Generator
         ) -> tuple[tuple[float, float, float, float], bool]:
    """A sample's random draws, always in this order: its crop box, then its flip."""
    box = crop_box(w, h, t, rng)
    return box, t.flip and bool(rng.random() < 0.5)


def draft_request(w: int, h: int, t: TrainTransform, box: tuple[float, float, float, float]
                  ) -> tuple[int, int]:
    """The size to ``draft`` a JPEG to: libjpeg scales by 1/2..1/8 while the crop stays at
    least ``t.size``, so no full decode of pixels that are thrown away."""
    left, top, right, bottom = box
    return math.ceil(w * t.size / (right - left)), math.ceil(h * t.size / (bottom - top))


def train_sample(data: bytes, t: TrainTransform, rng: np.random.Generator, out: np.ndarray,
                 where: str = "sample", *, planar: bool = True,
                 drawn: tuple[tuple[float, float, float, float], bool] | None = None) -> None:
    """Decode ``data``, random-resized-crop and maybe flip it into ``out`` (3×size×size
    uint8, or size×size×3 unless ``planar``); ``drawn``: the box and flip already drawn."""
    img = _open(data, where)
    try:
        w, h = img.size
        (left, top, right, bottom), flip = drawn or draw(w, h, t, rng)
        if img.format == "JPEG":
            img.draft("RGB", draft_request(w, h, t, (left, top, right, bottom)))
        sx, sy = img.width / w, img.height / h
        box = (left * sx, top * sy, right * sx, bottom * sy)
        if img.mode != "RGB":
            img = img.convert("RGB")
        img = img.resize((t.size, t.size), _BILINEAR, box=box)
        if flip:
            img = img.transpose(_FLIP)
        into(img, out, planar)
    except (OSError, SyntaxError, ValueError) as e:
        raise SampleError(f"{where}: cannot decode ({e})") from e


def val_sample(data: bytes, t: ValTransform, out: np.ndarray, where: str = "sample", *,
               planar: bool = True) -> None:
    """Decode ``data``, short side to ``t.resize`` if needed, center-crop into ``out``."""
    img = _open(data, where)
    try:
        w, h = img.size
        if min(w, h) != t.resize:
            s = t.resize / min(w, h)
            if img.format == "JPEG":
                img.draft("RGB", (math.ceil(w * s), math.ceil(h * s)))
            nw, nh = max(t.size, round(w * s)), max(t.size, round(h * s))
            img = img.convert("RGB").resize((nw, nh), _BILINEAR)
            w, h = nw, nh
        left, top = (w - t.size) // 2, (h - t.size) // 2
        if img.mode != "RGB":
            img = img.convert("RGB")
        into(img.crop((left, top, left + t.size, top + t.size)), out, planar)
    except (OSError, SyntaxError, ValueError) as e:
        raise SampleError(f"{where}: cannot decode ({e})") from e


def apply(data: bytes, t: Transform, rng: np.random.Generator, out: np.ndarray,
          where: str = "sample", *, planar: bool = True) -> None:
    """Run ``t`` on one encoded image the Pillow way, writing ``out`` (3×size×size uint8, or
    size×size×3 unless ``planar``)."""
    if isinstance(t, TrainTransform):
        train_sample(data, t, rng, out, where, planar=planar)
    else:
        val_sample(data, t, out, where, planar=planar)
