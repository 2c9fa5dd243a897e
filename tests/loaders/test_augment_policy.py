"""The augmentation policies draw what their published definitions draw.

Each policy's draws over 100,000 samples (``steps``: the op names and arguments as the
published code names them) are held by a chi-square test (p > 0.01) to the distribution
transcribed here, in this file, from the published source, not from ``loaders.augment``'s
tables:

- torchvision 0.20.1 (git 3ac97aa9), ``torchvision/transforms/autoaugment.py``:
  ``TrivialAugmentWide._augmentation_space``, ``RandAugment._augmentation_space`` and
  ``forward``, ``AutoAugment._get_policies(IMAGENET)`` and ``get_params``;
- timm v1.0.28 (git 8ef73809), ``timm/data/auto_augment.py``: ``_RAND_TRANSFORMS``,
  ``_RAND_INCREASING_TRANSFORMS``, ``_RAND_WEIGHTED_0``, the level functions,
  ``AugmentOp.__call__`` and ``rand_augment_transform``; and v0.6.13 (git 2696eedd) for
  ``_RAND_CHOICE_WEIGHTS_0`` (``w0``).

The magnitudes are made here as torchvision makes them (``torch.linspace``, float32). Then
the ops each step becomes: the matrices torchvision's ``functional.affine`` (PIL path)
hands ``Image.transform`` and timm's literal matrices, and the enhance factors, posterize
bits and thresholds their op functions pass.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Callable, Hashable, Iterable

import numpy as np
import pytest
import torch

from imgprep.augment import Op, rotate_matrix
from loaders import TrainTransform
from loaders.augment import POLICIES, policy
from loaders.augment_step import Step
from loaders.transforms import crop_box

N = 100_000
SIZE = 224
P_MIN = 0.01


def chi_square_p(observed: Counter[Hashable], expected: dict[Hashable, float]) -> float:
    """The chi-square test's p-value of ``observed`` counts against ``expected``
    probabilities (cells expected fewer than 5 times pooled into one); an observed outcome
    the expected distribution does not hold fails at once."""
    n = sum(observed.values())
    assert abs(sum(expected.values()) - 1) < 1e-9
    impossible = set(observed) - {k for k, p in expected.items() if p > 0}
    assert not impossible, f"never drawn by the published policy: {sorted(impossible, key=str)}"
    cells, pooled_obs, pooled_exp = [], 0, 0.0
    for key, p in expected.items():
        if n * p >= 5:
            cells.append((observed.get(key, 0), n * p))
        else:
            pooled_obs, pooled_exp = pooled_obs + observed.get(key, 0), pooled_exp + n * p
    if pooled_exp > 0:
        cells.append((pooled_obs, pooled_exp))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    df = len(cells) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def draws(name: str, seed: int = 0, **look: object) -> list[tuple[Step, ...]]:
    """``N`` samples' steps of policy ``name``, from a generator of its own."""
    rng = np.random.default_rng([zlib.crc32(name.encode()), seed])
    p = policy(name, **look)  # type: ignore[arg-type]
    return [p.steps(SIZE, rng) for _ in range(N)]


def key(step: Step) -> tuple[str, float]:
    return step.name, step.magnitude


def spread(table: dict[str, tuple[list[float] | None, bool]], weight: float,
           pick: Callable[[list[float]], Iterable[float]]) -> dict[Hashable, float]:
    """Each op's (name, signed magnitude) outcomes: ``weight`` per op, shared equally by the
    magnitudes ``pick`` gives from its table, half each sign for a signed op."""
    out: dict[Hashable, float] = {}
    for name, (mags, signed) in table.items():
        values = [0.0] if mags is None else list(pick(mags))
        for v in values:
            for s in ((1.0, -1.0) if signed else (1.0,)):
                k = (name, s * v)
                out[k] = out.get(k, 0.0) + weight / len(values) / (2 if signed else 1)
    return out


def linspace(a: float, b: float, bins: int) -> list[float]:
    return torch.linspace(a, b, bins).tolist()


def posterize(bins: int, k: int) -> list[float]:
    return [float(v) for v in (8 - (torch.arange(bins) / ((bins - 1) / k)).round().int())]


# torchvision 0.20.1 TrivialAugmentWide._augmentation_space(31)
TA_WIDE = {"Identity": (None, False), "ShearX": (linspace(0.0, 0.99, 31), True),
           "ShearY": (linspace(0.0, 0.99, 31), True),
           "TranslateX": (linspace(0.0, 32.0, 31), True),
           "TranslateY": (linspace(0.0, 32.0, 31), True),
           "Rotate": (linspace(0.0, 135.0, 31), True),
           "Brightness": (linspace(0.0, 0.99, 31), True), "Color": (linspace(0.0, 0.99, 31), True),
           "Contrast": (linspace(0.0, 0.99, 31), True),
           "Sharpness": (linspace(0.0, 0.99, 31), True), "Posterize": (posterize(31, 6), False),
           "Solarize": (linspace(255.0, 0.0, 31), False), "AutoContrast": (None, False),
           "Equalize": (None, False)}


def standard(bins: int, size: int) -> dict[str, tuple[list[float] | None, bool]]:
    """RandAugment's and AutoAugment's ``_augmentation_space(bins, (size, size))`` (AutoAugment
    has no Identity and adds Invert; the tests ask for the ops each draws)."""
    return {"Identity": (None, False), "ShearX": (linspace(0.0, 0.3, bins), True),
            "ShearY": (linspace(0.0, 0.3, bins), True),
            "TranslateX": (linspace(0.0, 150.0 / 331.0 * size, bins), True),
            "TranslateY": (linspace(0.0, 150.0 / 331.0 * size, bins), True),
            "Rotate": (linspace(0.0, 30.0, bins), True),
            "Brightness": (linspace(0.0, 0.9, bins), True),
            "Color": (linspace(0.0, 0.9, bins), True),
            "Contrast": (linspace(0.0, 0.9, bins), True),
            "Sharpness": (linspace(0.0, 0.9, bins), True), "Posterize": (posterize(bins, 4), False),
            "Solarize": (linspace(255.0, 0.0, bins), False), "AutoContrast": (None, False),
            "Equalize": (None, False), "Invert": (None, False)}


def test_trivial_augment_wide_draws_one_op_of_14_its_bin_and_sign_uniform() -> None:
    expected = spread(TA_WIDE, 1 / 14, lambda mags: mags)
    got = Counter(key(s) for one in draws("ta_wide") for s in one)
    assert sum(got.values()) == N
    assert chi_square_p(got, expected) > P_MIN


@pytest.mark.parametrize("name, n, m", [("ra", 2, 9), ("ra-n3-m5", 3, 5)])
def test_rand_augment_draws_n_ops_of_14_with_replacement_at_bin_m(name: str, n: int,
                                                                   m: int) -> None:
    table = {k: v for k, v in standard(31, SIZE).items() if k != "Invert"}
    one = spread(table, 1 / 14, lambda mags: [mags[m]])
    got = [tuple(key(s) for s in d) for d in draws(name)]
    assert {len(d) for d in got} == {n}
    if n == 2:  # the joint: independent slots
        expected = {(a, b): pa * pb for a, pa in one.items() for b, pb in one.items()}
        assert chi_square_p(Counter(got), expected) > P_MIN
    for slot in range(n):  # each slot's marginal
        assert chi_square_p(Counter(d[slot] for d in got), one) > P_MIN, slot


# torchvision 0.20.1 AutoAugment._get_policies(AutoAugmentPolicy.IMAGENET)
AA_IMAGENET = [
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
]


def test_auto_augment_imagenet_draws_a_sub_policy_and_each_op_by_its_probability() -> None:
    space = standard(10, SIZE)
    expected: dict[Hashable, float] = {}
    for sub in AA_IMAGENET:
        outcomes: list[tuple[tuple[tuple[str, float], ...], float]] = [((), 1 / 25)]
        for name, p, bin_ in sub:
            mags, signed = space[name]
            v = 0.0 if bin_ is None or mags is None else mags[bin_]
            signs = (1.0, -1.0) if signed else (1.0,)
            outcomes = [(o + ((name, s * v),), q * p / len(signs)) for o, q in outcomes
                        for s in signs] + [(o, q * (1 - p)) for o, q in outcomes]
        for o, q in outcomes:
            expected[o] = expected.get(o, 0.0) + q
    got = Counter(tuple(key(s) for s in d) for d in draws("aa-imagenet"))
    assert chi_square_p(got, expected) > P_MIN


# timm v1.0.28 timm/data/auto_augment.py
TIMM_RAND = ["AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
             "SolarizeAdd", "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY",
             "TranslateXRel", "TranslateYRel"]
TIMM_INCREASING = ["AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing",
                   "SolarizeIncreasing", "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing",
                   "BrightnessIncreasing", "SharpnessIncreasing", "ShearX", "ShearY",
                   "TranslateXRel", "TranslateYRel"]
TIMM_WEIGHTED_0 = {"Rotate": 3, "ShearX": 2, "ShearY": 2, "TranslateXRel": 1, "TranslateYRel": 1,
                   "ColorIncreasing": .25, "SharpnessIncreasing": 0.25, "AutoContrast": 0.25,
                   "SolarizeIncreasing": .05, "SolarizeAdd": .05, "ContrastIncreasing": .05,
                   "BrightnessIncreasing": .05, "Equalize": .05, "PosterizeIncreasing": 0.05,
                   "Invert": 0.05}
# timm v0.6.13 _RAND_CHOICE_WEIGHTS_0, by the names of _RAND_TRANSFORMS
TIMM_CHOICE_WEIGHTS_0 = {"Rotate": 0.3, "ShearX": 0.2, "ShearY": 0.2, "TranslateXRel": 0.1,
                         "TranslateYRel": 0.1, "Color": .025, "Sharpness": 0.025,
                         "AutoContrast": 0.025, "Solarize": .005, "SolarizeAdd": .005,
                         "Contrast": .005, "Brightness": .005, "Equalize": .005,
                         "Posterize": 0, "Invert": 0}


def kept(pairs: dict[tuple[str, ...], float], prob: float) -> dict[Hashable, float]:
    """The applied ops' names of each drawn sequence, each op kept with ``prob``."""
    out: dict[Hashable, float] = {}
    for seq, q in pairs.items():
        for mask in range(1 << len(seq)):
            names = tuple(n for i, n in enumerate(seq) if mask >> i & 1)
            k = bin(mask).count("1")
            share = q * prob ** k * (1 - prob) ** (len(seq) - k)
            out[names] = out.get(names, 0.0) + share
    return out


def uniform_pairs(ops: list[str]) -> dict[tuple[str, ...], float]:
    return {(a, b): 1 / len(ops) ** 2 for a in ops for b in ops}


def weighted_pairs(ops: list[str], weights: list[float]) -> dict[tuple[str, ...], float]:
    """np.random.choice(ops, 2, replace=False, p=weights): the second from the rest."""
    total, out = sum(weights), {}
    for a, wa in zip(ops, weights, strict=True):
        for b, wb in zip(ops, weights, strict=True):
            if a != b and wa > 0 and wb > 0:
                out[(a, b)] = wa / total * wb / (total - wa)
    return out


@pytest.mark.parametrize("config, pairs, prob", [
    ("rand-m9-mstd0.5-inc1", uniform_pairs(TIMM_INCREASING), 0.5),
    ("rand-m9-mstd0.5", uniform_pairs(TIMM_RAND), 0.5),
    ("rand-n2-p0.3-m7", uniform_pairs(TIMM_RAND), 0.3),
    ("rand-m9-tweights", weighted_pairs(list(TIMM_WEIGHTED_0), list(TIMM_WEIGHTED_0.values())),
     0.5),
    ("rand-m9-w0-inc1", weighted_pairs(TIMM_INCREASING,
                                       [TIMM_CHOICE_WEIGHTS_0[k] for k in TIMM_RAND]), 0.5),
], ids=["inc", "plain", "p0.3", "tweights", "w0-by-position"])
def test_timm_rand_augment_draws_its_ops_and_keeps_each_by_p(
        config: str, pairs: dict[tuple[str, ...], float], prob: float) -> None:
    got = Counter(tuple(s.name for s in d) for d in draws(config))
    assert chi_square_p(got, kept(pairs, prob)) > P_MIN


def normal_cdf(x: float, mean: float, std: float) -> float:
    return 0.5 * (1 + math.erf((x - mean) / (std * math.sqrt(2))))


# The signed geometric ops' arguments at level 10 (_rotate_level_to_arg, _shear_level_to_arg,
# _translate_rel_level_to_arg with translate_pct 0.45): level = |argument| / SCALE * 10.
SCALE = {"Rotate": 30.0, "ShearX": 0.3, "ShearY": 0.3, "TranslateXRel": 0.45,
         "TranslateYRel": 0.45}


def test_timm_magnitude_noise_is_a_clipped_gaussian_and_the_sign_half_the_time() -> None:
    """mstd0.5: the magnitude N(9, 0.5) clipped to [0, 10]; a geometric op's argument is
    magnitude / 10 * its scale, negated where a uniform is above 0.5; its resample bilinear
    or bicubic, each half the time (timm's _RANDOM_INTERPOLATION)."""
    steps = [s for d in draws("rand-m9-mstd0.5-inc1", seed=1) for s in d if s.name in SCALE]
    edges = [-math.inf, 8.0, 8.5, 8.75, 9.0, 9.25, 9.5, 10.0]
    bins: dict[Hashable, float] = {
        (sign, i): (normal_cdf(edges[i + 1], 9, 0.5) - normal_cdf(edges[i], 9, 0.5)) / 2
        for i in range(len(edges) - 1) for sign in (1, -1)}
    bins |= {(sign, "max"): (1 - normal_cdf(10.0, 9, 0.5)) / 2 for sign in (1, -1)}

    def cell(s: Step) -> tuple[int, int | str]:
        level = abs(s.magnitude) / SCALE[s.name] * 10
        sign = 1 if s.magnitude >= 0 else -1
        if math.isclose(level, 10.0):
            return sign, "max"
        return sign, next(i for i in range(len(edges) - 1) if edges[i] <= level < edges[i + 1])

    assert chi_square_p(Counter(cell(s) for s in steps), bins) > P_MIN
    looks = Counter(s.resample for s in steps)
    assert chi_square_p(looks, {"bilinear": 0.5, "bicubic": 0.5}) > P_MIN


def test_timm_mstd_over_100_draws_the_magnitude_uniformly_below_m() -> None:
    """mstd101: the magnitude uniform in [0, 9] (random.uniform(0, m)), the sign even."""
    steps = [s for d in draws("rand-m9-mstd101", seed=2) for s in d if s.name in SCALE]
    cells = Counter((int(abs(s.magnitude) / SCALE[s.name] * 10), s.magnitude >= 0)
                    for s in steps)
    expected: dict[Hashable, float] = {(i, sign): 1 / 18 for i in range(9)
                                       for sign in (True, False)}
    assert chi_square_p(cells, expected) > P_MIN


def test_timm_level_functions_give_the_published_arguments() -> None:
    """At m10 without noise every op's argument is its level function's at 10 (timm's
    _LEVEL_DENOM), of either sign where it is signed."""
    want = {"Rotate": {30.0, -30.0}, "Posterize": {4}, "PosterizeIncreasing": {0},
            "Solarize": {256}, "SolarizeIncreasing": {0}, "SolarizeAdd": {110},
            "Color": {1.9}, "ColorIncreasing": {1.9, 0.1}, "ShearX": {0.3, -0.3},
            "TranslateXRel": {0.45, -0.45}, "AutoContrast": {0.0}}
    got: dict[str, set[float]] = {}
    for config in ("rand-m10-n6", "rand-m10-n6-inc1"):
        p, rng = policy(config), np.random.default_rng(3)
        for _ in range(3000):
            for s in p.steps(SIZE, rng):
                got.setdefault(s.name, set()).add(round(s.magnitude, 9))
    for name, values in want.items():
        assert got[name] == {round(v, 9) for v in values}, name


# -------------------------------------------------------------------- the ops each step makes


class _OneStep:
    """A torchvision policy whose next draw is ``step``."""

    def __init__(self, pol: object, step: Step) -> None:
        self.pol, self.step = pol, step

    def __getattr__(self, name: str) -> object:
        return getattr(self.pol, name)

    def steps(self, size: int, rng: np.random.Generator) -> tuple[Step, ...]:
        return (self.step,)


def tv_op(step: Step, interpolation: str = "nearest",
          fill: tuple[int, int, int] = (0, 0, 0)) -> Op | None:
    pol = policy("ta_wide", interpolation=interpolation, fill=fill)
    made = type(pol).draw(_OneStep(pol, step), SIZE, np.random.default_rng())  # type: ignore[arg-type]
    return made[0] if made else None


def test_torchvision_geometric_ops_are_the_matrices_its_pil_path_computes() -> None:
    """functional.affine(img, 0, [0, 0], 1, shear=[degrees(atan(m)), 0], center=[0, 0]):
    Image.transform's (1, tan(radians(degrees(atan(m)))), 0, 0, 1, 0) -- about (1, m, ...);
    translations by int(magnitude) about the image's center; rotate -> Image.rotate."""
    m = 0.3
    shear = math.tan(math.radians(math.degrees(math.atan(m))))
    x = tv_op(Step("ShearX", m), "bilinear", (1, 2, 3))
    assert x == Op("affine", (1.0, shear, 0.0, 0.0, 1.0, 0.0), resample="bilinear",
                   fill=(1, 2, 3))
    y = tv_op(Step("ShearY", -m))
    assert y is not None and y.args[3] == pytest.approx(-m, abs=1e-12) and y.args[1] == 0.0
    assert y.args[:3] == (1.0, 0.0, 0.0) and y.args[4:] == (1.0, 0.0)
    t = tv_op(Step("TranslateX", 30.45))
    assert t == Op("affine", (1.0, 0.0, -30.0, 0.0, 1.0, 0.0))  # int(30.45) pixels right
    t = tv_op(Step("TranslateY", -14.9))
    assert t == Op("affine", (1.0, 0.0, 0.0, 0.0, 1.0, 14.0))
    r = tv_op(Step("Rotate", 27.0), "bicubic")
    assert r == Op("affine", rotate_matrix(27.0, SIZE, SIZE), resample="bicubic")


def test_torchvision_photometric_ops_pass_what_its_functions_pass() -> None:
    assert tv_op(Step("Brightness", -0.27)) == Op("brightness", (1.0 - 0.27,))
    assert tv_op(Step("Color", 0.5)) == Op("color", (1.5,))  # adjust_saturation
    assert tv_op(Step("Contrast", 0.1)) == Op("contrast", (1.1,))
    assert tv_op(Step("Sharpness", 0.9)) == Op("sharpness", (1.9,))
    assert tv_op(Step("Posterize", 6.0)) == Op("posterize", (6,))
    assert tv_op(Step("Solarize", 93.5)) == Op("solarize", (93.5,))
    for name in ("AutoContrast", "Equalize", "Invert"):
        assert tv_op(Step(name)) == Op(name.lower())
    assert tv_op(Step("Identity")) is None


def timm_ops(config: str, seed: int) -> list[tuple[tuple[Step, ...], tuple[Op, ...]]]:
    p = policy(config)
    out = []
    for i in range(200):
        steps = p.steps(SIZE, np.random.default_rng([seed, i]))
        out.append((steps, p.draw(SIZE, np.random.default_rng([seed, i]))))
    return out


def test_timm_ops_are_its_literal_matrices_filled_with_the_imagenet_mean() -> None:
    seen = set()
    for steps, ops in timm_ops("rand-m9-n4-mstd0.5-inc1", 4):
        made = iter(ops)
        for s in steps:
            if s.name == "PosterizeIncreasing" and s.magnitude >= 8:
                continue
            op, m = next(made), s.magnitude
            seen.add(s.name)
            if s.name in ("ShearX", "ShearY", "TranslateXRel", "TranslateYRel", "Rotate"):
                assert op.fill == (124, 116, 104) and op.resample == s.resample
            matrix = {"ShearX": (1, m, 0, 0, 1, 0), "ShearY": (1, 0, 0, m, 1, 0),
                      "TranslateXRel": (1, 0, m * SIZE, 0, 1, 0),
                      "TranslateYRel": (1, 0, 0, 0, 1, m * SIZE)}.get(s.name)
            if matrix is not None:
                assert op.args == tuple(float(v) for v in matrix)
            elif s.name == "Rotate":
                assert op.args == rotate_matrix(m, SIZE, SIZE)
            elif s.name == "SolarizeAdd":
                assert op == Op("solarize_add", (m, 128))
            elif s.name.startswith(("Color", "Contrast", "Brightness", "Sharpness",
                                    "Solarize", "Posterize")):
                assert op.kind == s.name.removesuffix("Increasing").lower()
                assert op.args == (m,)
        assert next(made, None) is None
    assert {"Rotate", "ShearX", "TranslateYRel", "SolarizeAdd", "ColorIncreasing"} <= seen


def test_timm_interpolation_given_is_every_geometric_ops() -> None:
    p = policy("rand-m9-n6", interpolation="bilinear")
    rng = np.random.default_rng(5)
    looks = {s.resample for _ in range(500) for s in p.steps(SIZE, rng)}
    assert looks == {None, "bilinear"}


# -------------------------------------------------------------------- names and the transform


@pytest.mark.parametrize("name", [*POLICIES, "ra-n1", "ra-m12", "rand-mstd1-tweights",
                                  "rand-m7-n3-mmax15-p0.7"])
def test_every_named_policy_draws_the_same_ops_from_the_same_generator(name: str) -> None:
    p = policy(name)
    a = [p.draw(SIZE, np.random.default_rng([9, i])) for i in range(50)]
    b = [p.draw(SIZE, np.random.default_rng([9, i])) for i in range(50)]
    assert a == b and any(a) and p == policy(name)
    assert all(isinstance(op, Op) for ops in a for op in ops)


@pytest.mark.parametrize("name, words", [
    ("autoaugment", "unknown augmentation policy"), ("ra-n2-x9", "unknown augmentation policy"),
    ("rand-m9-foo", "not one timm reads"), ("rand-m9.5", "not a number"),
    ("rand-t3a", "only tweights"), ("rand-n3-w1", "w0"), ("rand-p1.5", "p must be in 0..1"),
    ("rand-w0-tweights", "weights once"), ("rand-n14-w0", "without replacement"),
    ("rand-m9x", "not a number")])
def test_a_name_no_policy_has_is_refused_naming_what_is_wrong(name: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        policy(name)


def test_the_look_of_the_geometric_ops_is_checked() -> None:
    with pytest.raises(ValueError, match="interpolation must be one of"):
        policy("ta_wide", interpolation="lanczos")
    with pytest.raises(ValueError, match="fill must be three integers"):
        policy("rand-m9", fill=(0, 0, 256))
    with pytest.raises(ValueError, match="augment must be a policy"):
        TrainTransform(augment="ta_wide")  # type: ignore[arg-type]


def test_the_policy_draws_after_the_box_and_the_flip_and_without_one_nothing_more() -> None:
    plain, aug = TrainTransform(size=64), TrainTransform(size=64, augment=policy("ta_wide"))
    for i in range(200):
        g0, g1 = (t.geometry(300, 200, np.random.default_rng([1, i])) for t in (plain, aug))
        assert (g0.box, g0.flip, g0.augment) == (g1.box, g1.flip, ())
        by_hand = np.random.default_rng([1, i])
        crop_box(300, 200, plain, by_hand)
        by_hand.random()
        after = np.random.default_rng([1, i])
        plain.geometry(300, 200, after)
        assert after.random() == by_hand.random()  # nothing more drawn without a policy
        rest = np.random.default_rng([1, i])
        aug.geometry(300, 200, rest)
        again = np.random.default_rng([1, i])
        crop_box(300, 200, plain, again)
        again.random()
        assert aug.augment is not None
        assert g1.augment == aug.augment.draw(64, again)
