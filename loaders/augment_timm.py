"""timm's RandAugment, drawn with numpy and made ``imgprep.augment`` ops: timm v1.0.28 (git
8ef73809), ``timm/data/auto_augment.py``, ``rand_augment_transform(config_str, hparams)``
with the hparams ``timm/data/transforms_factory.py`` passes for ImageNet training.

The config string, as timm reads it (sections split on ``-``; ``rand`` first; a section's
key is what precedes its first digit):

- ``m``: magnitude (int, default 10); ``n``: ops per image (int, default 2);
  ``p``: each op's probability (default 0.5);
  ``mstd``: the magnitude's gaussian noise (std; above 100: uniform in 0..m; the first
  ``mstd`` wins, as timm's ``setdefault``); ``mmax``: the upper clip of the magnitude
  (default 10; 0 is 10, as timm's ``or``);
  ``inc``: the ops whose severity increases with the magnitude; timm tests ``bool(val)`` of
  the text, so ``inc0`` turns them on too, as it does in timm;
  ``tweights``: timm's ``_RAND_WEIGHTED_0`` (a weighted choice, without replacement);
  ``w0``: timm v0.6.13's weights (``_RAND_CHOICE_WEIGHTS_0``, the same file at git 2696eedd,
  laid over the op list by position, as there; without replacement); later timm refuses
  ``w``.

Refused (``ValueError``): a section timm refuses, a section without a digit (timm skips it,
silently), ``t3a``/``t3aw`` (their Desaturate and GaussianBlur are not ops of
``imgprep.augment``), another ``t`` name (timm falls back to the default list), ``p``
outside 0..1, more ops per image than a weighted list can give without replacement.

Per image (``RandAugment.__call__``, ``AugmentOp.__call__``; from numpy: a block of uniforms
and, with gaussian noise, standard normals, one call each): ``n`` ops drawn uniformly with
replacement (weighted without), then each: kept if a uniform is at most ``p``; its magnitude
``m``, with noise when ``mstd`` > 0, clipped to ``[0, mmax]``; its argument from the level
function (``_LEVEL_DENOM`` 10; a sign drawn for the signed ones: negative where a uniform is
above 0.5); a geometric op's resample drawn from (bilinear, bicubic) unless the policy has
one (timm's ``--train-interpolation random``, its default). hparams: ``img_mean`` is the fill
(ImageNet's mean, ``round(255 * x)``: (124, 116, 104)); ``translate_pct`` 0.45 of the
image's side (``_translate_rel_level_to_arg``'s default; ``create_transform`` passes only
``translate_const``, which the absolute translations in no rand list use).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from imgprep.augment import Op, rotate_matrix
from loaders.augment_step import Step, check_look, pick

LEVEL_DENOM = 10.0  # _LEVEL_DENOM
TIMM_FILL = (124, 116, 104)  # create_transform's img_mean for IMAGENET_DEFAULT_MEAN
TRANSLATE_PCT = 0.45  # _translate_rel_level_to_arg's default translate_pct
RANDOM_RESAMPLES = ("bilinear", "bicubic")  # _RANDOM_INTERPOLATION

# _RAND_TRANSFORMS and _RAND_INCREASING_TRANSFORMS, in timm's order.
RAND_TRANSFORMS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
                   "SolarizeAdd", "Color", "Contrast", "Brightness", "Sharpness", "ShearX",
                   "ShearY", "TranslateXRel", "TranslateYRel")
RAND_INCREASING_TRANSFORMS = (
    "AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing",
    "SolarizeIncreasing", "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing",
    "BrightnessIncreasing", "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel",
    "TranslateYRel")
RAND_WEIGHTED_0 = {  # v1.0.28 'tweights'
    "Rotate": 3, "ShearX": 2, "ShearY": 2, "TranslateXRel": 1, "TranslateYRel": 1,
    "ColorIncreasing": .25, "SharpnessIncreasing": 0.25, "AutoContrast": 0.25,
    "SolarizeIncreasing": .05, "SolarizeAdd": .05, "ContrastIncreasing": .05,
    "BrightnessIncreasing": .05, "Equalize": .05, "PosterizeIncreasing": 0.05, "Invert": 0.05}
RAND_CHOICE_WEIGHTS_0 = {  # v0.6.13 'w0', by the names of RAND_TRANSFORMS
    "Rotate": 0.3, "ShearX": 0.2, "ShearY": 0.2, "TranslateXRel": 0.1, "TranslateYRel": 0.1,
    "Color": .025, "Sharpness": 0.025, "AutoContrast": 0.025, "Solarize": .005,
    "SolarizeAdd": .005, "Contrast": .005, "Brightness": .005, "Equalize": .005,
    "Posterize": 0, "Invert": 0}
GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")


def _negate(v: float, u: float) -> float:
    return -v if u > 0.5 else v  # _randomly_negate, with the uniform drawn for it


def _enhance(level: float, u: float) -> float:
    return level / LEVEL_DENOM * 1.8 + 0.1


def _enhance_increasing(level: float, u: float) -> float:
    return max(0.1, 1.0 + _negate(level / LEVEL_DENOM * .9, u))


def _posterize(level: float, u: float) -> float:
    return int(level / LEVEL_DENOM * 4)


def _solarize(level: float, u: float) -> float:
    return min(256, int(level / LEVEL_DENOM * 256))


# LEVEL_TO_ARG: an op's argument from its magnitude and a uniform for the sign (the ops
# absent take none).
LEVEL_TO_ARG: dict[str, Callable[[float, float], float]] = {
    "Rotate": lambda level, u: _negate(level / LEVEL_DENOM * 30., u),
    "Posterize": _posterize,
    "PosterizeIncreasing": lambda level, u: 4 - _posterize(level, u),
    "Solarize": _solarize,
    "SolarizeIncreasing": lambda level, u: 256 - _solarize(level, u),
    "SolarizeAdd": lambda level, u: min(128, int(level / LEVEL_DENOM * 110)),
    **dict.fromkeys(("Color", "Contrast", "Brightness", "Sharpness"), _enhance),
    **dict.fromkeys(("ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
                     "SharpnessIncreasing"), _enhance_increasing),
    **dict.fromkeys(("ShearX", "ShearY"),
                    lambda level, u: _negate(level / LEVEL_DENOM * 0.3, u)),
    **dict.fromkeys(("TranslateXRel", "TranslateYRel"),
                    lambda level, u: _negate(level / LEVEL_DENOM * TRANSLATE_PCT, u)),
}


def timm_op(step: Step, size: int, fill: tuple[int, int, int]) -> Op | None:
    """timm's op function (``NAME_TO_OP``) on a ``size`` x ``size`` PIL image as one ``Op``
    (None where it returns the image unchanged: ``posterize`` of 8 bits or more)."""
    name, m = step.name.removesuffix("Increasing"), float(step.magnitude)
    if name in GEOMETRIC:  # img.rotate(degrees, resample=..., fillcolor=...), img.transform
        return Op("affine", _matrix(name, m, size), step.resample or "nearest", fill)
    if name == "Posterize":  # fewer than 0 bits keep none, as 0 does
        return None if m >= 8 else Op("posterize", (float(max(0, int(m))),))
    if name == "SolarizeAdd":
        return Op("solarize_add", (m, 128.0))
    if name in ("Solarize", "Color", "Contrast", "Brightness", "Sharpness"):
        return Op(name.lower(), (m,))
    return Op(name.lower())  # AutoContrast, Equalize, Invert


def _matrix(name: str, m: float, size: int) -> tuple[float, ...]:
    """The matrix of timm's geometric op ``name`` at argument ``m``: ``img.rotate``'s, or the
    literal one its ``transform`` call passes."""
    if name == "Rotate":
        return rotate_matrix(m, size, size)
    if name == "ShearX":
        return (1.0, m, 0.0, 0.0, 1.0, 0.0)
    if name == "ShearY":
        return (1.0, 0.0, 0.0, m, 1.0, 0.0)
    if name == "TranslateXRel":
        return (1.0, 0.0, m * size, 0.0, 1.0, 0.0)
    return (1.0, 0.0, 0.0, 0.0, 1.0, m * size)  # TranslateYRel


@dataclass(frozen=True, kw_only=True)
class Parsed:
    """A config string as ``rand_augment_transform`` reads it."""

    ops: tuple[str, ...]
    weights: tuple[float, ...] | None  # normalised; None: uniform, with replacement
    num_layers: int = 2
    magnitude: int = 10
    prob: float = 0.5
    magnitude_std: float = 0.0  # inf: uniform in 0..magnitude
    magnitude_max: int | None = None


def _number(key: str, val: str, config: str) -> float:
    try:
        return float(val) if key in ("mstd", "p") else int(val)
    except ValueError:
        raise ValueError(f"{config!r}: {key}{val} is not a number timm reads "
                         f"({'a float' if key in ('mstd', 'p') else 'an integer'})") from None


def parse(config: str) -> Parsed:
    """``config`` read as timm v1.0.28 reads it (and ``w0`` as v0.6.13 did); ValueError for
    what it refuses, and for what this module refuses (the module's docstring)."""
    parts = config.split("-")
    if parts[0] != "rand":
        raise ValueError(f"{config!r}: a timm RandAugment string starts with 'rand-'")
    got: dict[str, float] = {}
    increasing, choice = False, None
    for c in parts[1:]:
        if c.startswith("t"):
            choice = choice or c  # timm: the first t section wins
            continue
        cs = re.split(r"(\d.*)", c)
        if len(cs) < 2 or cs[0] not in ("m", "n", "p", "mstd", "mmax", "inc", "w"):
            raise ValueError(f"{config!r}: section {c!r} is not one timm reads (m, n, p, mstd, "
                             "mmax, inc, t; w0 from timm 0.6)")
        key, val = cs[:2]
        if key == "inc":
            increasing = increasing or bool(val)
        elif key in ("mstd", "mmax"):
            got.setdefault(key, _number(key, val, config))
        else:
            got[key] = _number(key, val, config)
    return _resolve(config, got, increasing, choice)


def _resolve(config: str, got: dict[str, float], increasing: bool,
             choice: str | None) -> Parsed:
    ops: tuple[str, ...] = RAND_INCREASING_TRANSFORMS if increasing else RAND_TRANSFORMS
    weights: tuple[float, ...] | None = None
    if choice is not None and "w" in got:
        raise ValueError(f"{config!r}: give weights once, {choice} or w0")
    if choice == "tweights":
        ops, weights = tuple(RAND_WEIGHTED_0), tuple(RAND_WEIGHTED_0.values())
    elif choice is not None:
        raise ValueError(f"{config!r}: {choice!r}: only tweights of timm's t choices is made "
                         "of ops imgprep.augment carries out")
    elif "w" in got:
        if got["w"] != 0:
            raise ValueError(f"{config!r}: w{got['w']}: timm 0.6 had one set of weights, w0")
        weights = tuple(RAND_CHOICE_WEIGHTS_0[k] for k in RAND_TRANSFORMS)
    std, n, prob = got.get("mstd", 0.0), int(got.get("n", 2)), got.get("p", 0.5)
    if not 0 <= prob <= 1 or n < 0:
        raise ValueError(f"{config!r}: p must be in 0..1 and n >= 0")
    if weights is not None:
        if n > sum(w > 0 for w in weights):
            raise ValueError(f"{config!r}: n{n} ops without replacement from "
                             f"{sum(w > 0 for w in weights)} weighted ones")
        weights = tuple(w / sum(weights) for w in weights)
    mmax = got.get("mmax")
    return Parsed(ops=ops, weights=weights, num_layers=n, magnitude=int(got.get("m", 10)),
                  prob=prob, magnitude_std=math.inf if std > 100 else std,
                  magnitude_max=None if mmax is None else int(mmax))


def _choose(p: Parsed, u: list[float]) -> list[int]:
    """``np.random.choice(ops, n, replace=weights is None, p=weights)`` from one uniform a
    slot: uniform with replacement, or each next op by the weights of those not chosen."""
    if p.weights is None:
        return [pick(x, len(p.ops)) for x in u]
    left, chosen = list(p.weights), []
    for x in u:
        total, at, i = sum(left), 0.0, 0
        for i, w in enumerate(left):  # noqa: B007 (the last index is the fallback)
            at += w
            if x * total < at:
                break
        chosen.append(i)
        left[i] = 0.0
    return chosen


@dataclass(frozen=True, kw_only=True)
class RandAugmentTimm:
    """timm's RandAugment from its config string (``config``, e.g. ``"rand-m9-mstd0.5-inc1"``),
    its geometric ops filled with ``fill`` and resampled with ``interpolation`` (None: bilinear
    or bicubic drawn per op)."""

    config: str
    fill: tuple[int, int, int] = TIMM_FILL
    interpolation: str | None = None
    parsed: Parsed = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_look(self.interpolation or "bilinear", self.fill, self.config)
        object.__setattr__(self, "parsed", parse(self.config))

    @property
    def name(self) -> str:
        return self.config

    def steps(self, size: int, rng: np.random.Generator) -> tuple[Step, ...]:
        """A sample's draws: per slot a block of uniforms (op, keep, magnitude, sign,
        resample; one call) and, with gaussian noise, a standard normal (one call)."""
        p, out = self.parsed, []
        upper, std = p.magnitude_max or LEVEL_DENOM, p.magnitude_std
        u = rng.random((p.num_layers, 5)).tolist()
        z = rng.standard_normal(p.num_layers).tolist() if 0 < std < math.inf else None
        for j, i in enumerate(_choose(p, [row[0] for row in u])):
            op, (_, keep, u_mag, u_sign, u_look) = p.ops[i], u[j]
            if p.prob < 1.0 and keep > p.prob:
                continue
            arg = 0.0
            if op in LEVEL_TO_ARG:
                m: float = p.magnitude
                if std == math.inf:
                    m = u_mag * m  # random.uniform(0, m)
                elif z is not None:
                    m = m + std * z[j]  # random.gauss(m, std)
                arg = LEVEL_TO_ARG[op](max(0.0, min(m, upper)), u_sign)
            resample = None
            if op in GEOMETRIC:
                resample = self.interpolation or RANDOM_RESAMPLES[pick(u_look, 2)]
            out.append(Step(op, float(arg), resample))
        return tuple(out)

    def draw(self, size: int, rng: np.random.Generator) -> tuple[Op, ...]:
        made = (timm_op(s, size, self.fill) for s in self.steps(size, rng))
        return tuple(op for op in made if op is not None)


__all__ = ["RAND_CHOICE_WEIGHTS_0", "RAND_INCREASING_TRANSFORMS", "RAND_TRANSFORMS",
           "RAND_WEIGHTED_0", "TIMM_FILL", "Parsed", "RandAugmentTimm", "parse", "timm_op"]
