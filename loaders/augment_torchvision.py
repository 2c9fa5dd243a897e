"""torchvision's automatic augmentation policies, drawn with numpy and made ``imgprep.augment``
ops: ``TrivialAugmentWide``, ``RandAugment`` and ``AutoAugment(AutoAugmentPolicy.IMAGENET)`` of
torchvision 0.20.1 (git 3ac97aa9), ``torchvision/transforms/autoaugment.py``.

- Tables: each policy's ``_augmentation_space`` (``tv_space``), its magnitudes made as torch
  makes them (``torch.linspace``, float32; Posterize ``8 - (arange / ((bins - 1) / k))
  .round().int()``), so every argument is the one torchvision passes.
- Draws: ``steps(size, rng)``, what torchvision draws (op, magnitude bin, sign; AutoAugment:
  sub-policy, two uniforms, two signs), each from one uniform of a block numpy's
  ``Generator`` gives per sample (``rng.random(k)``: one call) instead of torch's calls.
- Ops: ``_apply_op`` on a PIL image, each call as one ``Op`` (``tv_op``): ``F.affine`` ->
  ``Image.transform`` with the matrix ``_get_inverse_affine_matrix`` makes (``inverse_affine``;
  ``center=[0, 0]`` for the shears, the image's center for the translations, whose pixels are
  ``int(magnitude)``), ``F.rotate`` -> ``Image.rotate`` (``rotate_matrix``), ``adjust_*`` ->
  ``ImageEnhance`` (saturation is ``Color``), ``posterize``/``solarize``/``autocontrast``/
  ``equalize``/``invert`` -> ``ImageOps``. Identity is no op.

The classes' defaults are torchvision's: ``interpolation="nearest"``, ``fill=(0, 0, 0)``
(``_parse_fill``: None is 0).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np
import torch

from imgprep.augment import Op, rotate_matrix
from loaders.augment_step import Step, check_look, pick

Space = dict[str, tuple[tuple[float, ...] | None, bool]]  # op -> (magnitudes or none, signed)


def _linspace(start: float, end: float, bins: int) -> tuple[float, ...]:
    return tuple(torch.linspace(start, end, bins).tolist())  # float32, as torchvision's


@functools.cache
def tv_space(table: str, bins: int, size: int) -> Space:
    """An ``_augmentation_space``: ``"wide"`` is TrivialAugmentWide's, ``"ra"``
    RandAugment's (Identity first), ``"aa"`` AutoAugment's (Invert last); in their order."""
    wide = table == "wide"
    shear, enhance, rotate = (0.99, 0.99, 135.0) if wide else (0.3, 0.9, 30.0)
    shift = 32.0 if wide else 150.0 / 331.0 * size
    posterize = (8 - (torch.arange(bins) / ((bins - 1) / (6 if wide else 4))).round().int())
    space: Space = {} if table == "aa" else {"Identity": (None, False)}
    space |= {"ShearX": (_linspace(0.0, shear, bins), True),
              "ShearY": (_linspace(0.0, shear, bins), True),
              "TranslateX": (_linspace(0.0, shift, bins), True),
              "TranslateY": (_linspace(0.0, shift, bins), True),
              "Rotate": (_linspace(0.0, rotate, bins), True)}
    for name in ("Brightness", "Color", "Contrast", "Sharpness"):
        space[name] = (_linspace(0.0, enhance, bins), True)
    space |= {"Posterize": (tuple(float(v) for v in posterize.tolist()), False),
              "Solarize": (_linspace(255.0, 0.0, bins), False),
              "AutoContrast": (None, False), "Equalize": (None, False)}
    if table == "aa":
        space["Invert"] = (None, False)
    return space


@functools.cache
def tv_rows(table: str, bins: int, size: int) -> tuple[tuple[str, tuple[float, ...] | None,
                                                          bool], ...]:
    """``tv_space(table, bins, size)`` as rows (op, magnitudes or None, signed), in its
    order: what a draw indexes."""
    return tuple((op, m, signed) for op, (m, signed) in tv_space(table, bins, size).items())


def inverse_affine(center: tuple[float, float], angle: float, translate: tuple[float, float],
                   scale: float, shear: tuple[float, float]) -> tuple[float, ...]:
    """torchvision's ``functional._get_inverse_affine_matrix`` (inverted, one scale): the
    matrix its PIL path hands ``Image.transform``, computed in the same order."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    (cx, cy), (tx, ty) = center, translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [x / scale for x in (d, -b, 0.0, -c, a, 0.0)]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return tuple(m)


_TV_ENHANCE = {"Brightness": "brightness", "Color": "color", "Contrast": "contrast",
               "Sharpness": "sharpness"}  # adjust_saturation is ImageEnhance.Color


def tv_op(step: Step, size: int, interpolation: str, fill: tuple[int, int, int]) -> Op | None:
    """``_apply_op(img, name, magnitude)`` on a PIL image as one ``Op`` (None: Identity)."""
    name, m = step.name, step.magnitude
    center = (size * 0.5, size * 0.5)  # functional.affine's for a PIL image without one
    if name == "ShearX":
        matrix = inverse_affine((0, 0), 0.0, (0, 0), 1.0, (math.degrees(math.atan(m)), 0.0))
    elif name == "ShearY":
        matrix = inverse_affine((0, 0), 0.0, (0, 0), 1.0, (0.0, math.degrees(math.atan(m))))
    elif name == "TranslateX":
        matrix = inverse_affine(center, 0.0, (int(m), 0), 1.0, (0.0, 0.0))
    elif name == "TranslateY":
        matrix = inverse_affine(center, 0.0, (0, int(m)), 1.0, (0.0, 0.0))
    elif name == "Rotate":
        matrix = rotate_matrix(m, size, size)
    elif name in _TV_ENHANCE:
        return Op(_TV_ENHANCE[name], (1.0 + m,))
    elif name == "Posterize":
        return Op("posterize", (int(m),))
    elif name == "Solarize":
        return Op("solarize", (m,))
    elif name in ("AutoContrast", "Equalize", "Invert"):
        return Op(name.lower())
    else:
        return None  # Identity
    return Op("affine", matrix, resample=interpolation, fill=fill)


@dataclass(frozen=True, kw_only=True)
class _Torchvision:
    """What torchvision's three policies share: the look of their geometric ops."""

    interpolation: str = "nearest"
    fill: tuple[int, int, int] = (0, 0, 0)

    def __post_init__(self) -> None:
        check_look(self.interpolation, self.fill, type(self).__name__)

    def steps(self, size: int, rng: np.random.Generator) -> tuple[Step, ...]:
        raise NotImplementedError

    def draw(self, size: int, rng: np.random.Generator) -> tuple[Op, ...]:
        """The ops of ``steps(size, rng)``, each made once (``tv_op``) and kept: a policy's
        steps come from a finite table, so after the first samples a draw is its steps and
        a look-up per step."""
        made, out = _made(size, self.interpolation, self.fill), []
        for s in self.steps(size, rng):
            key = s if s.magnitude else (s, math.copysign(1.0, s.magnitude))  # -0.0 apart
            if key in made:
                op = made[key]
            else:
                op = made[key] = tv_op(s, size, self.interpolation, self.fill)
            if op is not None:
                out.append(op)
        return tuple(out)


@functools.lru_cache(maxsize=64)
def _made(size: int, interpolation: str,
          fill: tuple[int, int, int]) -> dict[Hashable, Op | None]:
    """The ops made so far for the steps of ``size`` x ``size`` crops with this look (a
    step's magnitude with its sign: a shear of -0.0 makes a matrix of its own zeros)."""
    return {}


def _signed(m: float, signed: bool, negative: bool) -> float:
    return -m if signed and negative else m


@dataclass(frozen=True, kw_only=True)
class TrivialAugmentWide(_Torchvision):
    """torchvision's ``TrivialAugmentWide``: one op of 14, its magnitude bin uniform."""

    num_magnitude_bins: int = 31
    name: str = field(default="ta_wide", init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_magnitude_bins < 2:
            raise ValueError(f"{self}: num_magnitude_bins must be >= 2")

    def steps(self, size: int, rng: np.random.Generator) -> tuple[Step, ...]:
        space = tv_rows("wide", self.num_magnitude_bins, size)
        u_op, u_bin, u_sign = rng.random(3).tolist()
        op, magnitudes, signed = space[pick(u_op, len(space))]
        m = 0.0 if magnitudes is None else magnitudes[pick(u_bin, len(magnitudes))]
        return (Step(op, _signed(m, signed, u_sign < 0.5)),)


@dataclass(frozen=True, kw_only=True)
class RandAugment(_Torchvision):
    """torchvision's ``RandAugment``: ``num_ops`` ops of 14, drawn with replacement, each at
    bin ``magnitude`` of ``num_magnitude_bins``, a sign drawn for the signed ones."""

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    name: str = field(default="", init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_ops < 0 or not 0 <= self.magnitude < self.num_magnitude_bins:
            raise ValueError(f"{self}: num_ops must be >= 0 and magnitude a bin of "
                             f"0..{self.num_magnitude_bins - 1}")
        object.__setattr__(self, "name", f"ra-n{self.num_ops}-m{self.magnitude}")

    def steps(self, size: int, rng: np.random.Generator) -> tuple[Step, ...]:
        space, out = tv_rows("ra", self.num_magnitude_bins, size), []
        for u_op, u_sign in rng.random((self.num_ops, 2)).tolist():
            op, magnitudes, signed = space[pick(u_op, len(space))]
            m = 0.0 if magnitudes is None else magnitudes[self.magnitude]
            out.append(Step(op, _signed(m, signed, u_sign < 0.5)))
        return tuple(out)


# AutoAugment's ImageNet policy: AutoAugment._get_policies(AutoAugmentPolicy.IMAGENET), each
# sub-policy two (op, probability, magnitude bin of 10 or None).
IMAGENET_POLICY: tuple[tuple[tuple[str, float, int | None], ...], ...] = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
    (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
    (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
    (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
    (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
    (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
)


@dataclass(frozen=True, kw_only=True)
class AutoAugmentImageNet(_Torchvision):
    """torchvision's ``AutoAugment(AutoAugmentPolicy.IMAGENET)``: a sub-policy uniform of 25
    (``get_params``: its id, two uniforms, two signs), op i applied where its uniform is at
    most its probability, negated where its sign is 0."""

    name: str = field(default="aa-imagenet", init=False)

    def steps(self, size: int, rng: np.random.Generator) -> tuple[Step, ...]:
        u_sub, *u = rng.random(5).tolist()
        sub = IMAGENET_POLICY[pick(u_sub, len(IMAGENET_POLICY))]
        space, out = tv_space("aa", 10, size), []
        for (op, p, bin_), prob, u_sign in zip(sub, u[:2], u[2:], strict=True):
            if prob <= p:
                magnitudes, signed = space[op]
                m = 0.0 if bin_ is None or magnitudes is None else magnitudes[bin_]
                out.append(Step(op, _signed(m, signed, u_sign < 0.5)))
        return tuple(out)


__all__ = ["IMAGENET_POLICY", "AutoAugmentImageNet", "RandAugment", "TrivialAugmentWide",
           "inverse_affine", "tv_op", "tv_rows", "tv_space"]
