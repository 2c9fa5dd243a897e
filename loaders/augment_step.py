"""What the augmentation policies share (``loaders.augment``): one drawn op as the published
code names it, and the check of the look of the geometric ops."""

from __future__ import annotations

from typing import NamedTuple

from imgprep.augment import RESAMPLES


class Step(NamedTuple):
    """One op as the published code names it (``"ShearX"``, ``"TranslateXRel"``...), with the
    argument its op function is called with (signed; 0.0 for an op that takes none) and,
    where a policy draws it per op (timm's random interpolation), the resample drawn."""

    name: str
    magnitude: float = 0.0
    resample: str | None = None


def pick(u: float, n: int) -> int:
    """The index of ``n`` equal choices a uniform ``u`` in [0, 1) falls in."""
    return min(int(u * n), n - 1)


def check_look(interpolation: str, fill: tuple[int, int, int], what: str) -> None:
    """Refuse a resample or fill colour ``imgprep.augment`` does not take (ValueError)."""
    if interpolation not in RESAMPLES:
        raise ValueError(f"{what}: interpolation must be one of {RESAMPLES}, not "
                         f"{interpolation!r}")
    if (not isinstance(fill, tuple) or len(fill) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255
                       for v in fill)):
        raise ValueError(f"{what}: fill must be three integers 0..255, not {fill!r}")
