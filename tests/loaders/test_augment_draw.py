"""A policy's ``draw`` is the ops its ``steps`` make: torchvision's policies make each step's
op once and keep it (their steps come from a finite table), timm's make them anew; either
way the ops, their arguments' bits (a shear of -0.0 included) and their packed form are
those ``tv_op`` and ``timm_op`` make from the same steps."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from imgprep import augment
from imgprep.augment import Op
from loaders.augment import POLICIES, policy
from loaders.augment_timm import timm_op
from loaders.augment_torchvision import tv_op

SIZE = 224


def bits(ops: tuple[Op, ...]) -> list[str]:
    """Each op as its fields print, so -0.0 and 0.0 differ."""
    return [repr((op.kind, op.args, op.resample, op.fill, op.packed)) for op in ops]


@pytest.mark.parametrize("name", [*POLICIES, "ra-n3-m0", "rand-m0-n3-p1.0", "rand-m9-tweights"])
@pytest.mark.parametrize("look", [{}, {"interpolation": "bicubic", "fill": (1, 2, 3)}])
def test_a_draw_is_the_ops_its_steps_make(name: str, look: dict[str, Any]) -> None:
    p: Any = policy(name, **look)
    timm = name.startswith("rand")
    zeros = 0
    for i in range(400):
        steps = p.steps(SIZE, np.random.default_rng([11, i]))
        made = (timm_op(s, SIZE, p.fill) if timm else
                tv_op(s, SIZE, p.interpolation, p.fill) for s in steps)
        fresh = tuple(op for op in made if op is not None)
        drawn = p.draw(SIZE, np.random.default_rng([11, i]))
        assert bits(drawn) == bits(fresh), (i, steps)
        zeros += sum(1 for s in steps if s.magnitude == 0 and str(s.magnitude) == "-0.0")
    if name == "ra-n3-m0":  # bin 0 of a signed op, negated: its own zeros
        assert zeros > 0


def test_an_op_made_from_other_number_types_equals_one_made_from_floats() -> None:
    plain = Op("affine", (1.0, 0.0, 3.0, 0.0, 1.0, 0.5), "bicubic", (1, 2, 3))
    args: Any = (1, np.float64(0), np.int64(3), 0.0, 1, np.float32(0.5))
    fill: Any = (np.uint8(1), 2, np.int32(3))
    mixed = Op("affine", args, "bicubic", fill)
    assert mixed == plain and mixed.packed == plain.packed
    assert all(type(a) is float for a in mixed.packed[1])
    assert all(type(v) is int for v in mixed.packed[3])
    if augment.AVAILABLE:  # the extension's own numbers
        from imgprep import _jpegcrop
        assert plain.packed[0] == _jpegcrop.AUG_OP_AFFINE
        assert plain.packed[2] == _jpegcrop.AUG_BICUBIC
