"""A random-resized crop's draws in the C extension: the box and the flip that
``loaders.transforms.crop_box`` and a flip draw make in Python, from the same numpy Generator,
the same numbers, and the generator left in the same state (``imgprep/csrc/draws.h``), at a
tenth of their cost. ``AVAILABLE`` is False where the extension is not built; the Python
draws are then the ones made.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from imgprep.rawformat import MAX_SIDE  # the largest side it draws for

__all__ = ["AVAILABLE", "MAX_SIDE", "crop_draw"]

_ext: ModuleType | None
try:
    from imgprep import _jpegcrop as _ext
except ImportError:  # built optionally
    _ext = None

AVAILABLE = _ext is not None and hasattr(_ext, "crop_draw")


def crop_draw(rng: np.random.Generator, width: int, height: int,
              scale: tuple[float, float], ratio: tuple[float, float], flip: bool
              ) -> tuple[tuple[int, int, int, int], bool]:
    """The crop box ``(left, top, right, bottom)`` of a ``width`` x ``height`` image and,
    where ``flip``, whether it is mirrored (else False, nothing drawn), drawn from ``rng``.
    Only where ``AVAILABLE``."""
    r = _ext.crop_draw(rng.bit_generator.capsule, width, height,  # type: ignore[union-attr]
                       scale[0], scale[1], ratio[0], ratio[1], flip)
    return (r.left, r.top, r.right, r.bottom), r.flip
