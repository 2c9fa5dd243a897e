"""What the ops refuse, before a byte is touched: ``Op`` checks its fields (ValueError),
``apply`` its image, and the extension every argument again (the op codes, counts and
limits are its own: imgprep/csrc/augment.h)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from imgprep import augment
from imgprep.augment import Op
from imgprep.errors import DependencyError, ImgprepError

ext = pytest.importorskip("imgprep._jpegcrop")
pytestmark = pytest.mark.skipif(not augment.AVAILABLE, reason="augmentation ops not built")


@pytest.mark.parametrize(("fields", "says"), [
    ({"kind": "blur"}, "unknown augmentation op 'blur'"),
    ({"kind": "brightness"}, "brightness takes a tuple of 1 arguments"),
    ({"kind": "affine", "args": (1, 0, 0, 0, 1)}, "affine takes a tuple of 6"),
    ({"kind": "invert", "args": (1.0,)}, "invert takes a tuple of 0"),
    ({"kind": "contrast", "args": [1.0]}, "takes a tuple"),
    ({"kind": "color", "args": (float("nan"),)}, "must be finite"),
    ({"kind": "solarize", "args": (float("inf"),)}, "must be finite"),
    ({"kind": "sharpness", "args": (True,)}, "must be a number"),
    ({"kind": "sharpness", "args": ("2",)}, "must be a number"),
    ({"kind": "posterize", "args": (9,)}, "posterize keeps an integer 0..8"),
    ({"kind": "posterize", "args": (2.5,)}, "posterize keeps an integer 0..8"),
    ({"kind": "posterize", "args": (-1,)}, "posterize keeps an integer 0..8"),
    ({"kind": "affine", "args": (1, 0, 0, 0, 1, 0), "resample": "lanczos"}, "unknown resample"),
    ({"kind": "affine", "args": (1, 0, 0, 0, 1, 0), "fill": (0, 0, 256)}, "fill must be"),
    ({"kind": "affine", "args": (1, 0, 0, 0, 1, 0), "fill": (0, 0)}, "fill must be"),
    ({"kind": "affine", "args": (1, 0, 0, 0, 1, 0), "fill": (0, 0, 1.5)}, "fill must be"),
    ({"kind": "affine", "args": (1, 0, 0, 0, 1, 0), "fill": 0}, "fill must be"),
])
def test_an_op_refuses_what_pillows_call_would_not_take(fields: dict[str, Any],
                                                        says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Op(**fields)


def test_an_op_keeps_its_args_as_floats_and_fill_as_ints() -> None:
    op = Op("affine", (1, 0, np.int64(3), 0, 1, np.float32(0.5)), "bicubic",
            (np.uint8(1), 2, 3))  # type: ignore[arg-type]
    assert op.args == (1.0, 0.0, 3.0, 0.0, 1.0, 0.5)
    assert all(type(a) is float for a in op.args) and all(type(v) is int for v in op.fill)
    assert op == Op("affine", (1.0, 0.0, 3.0, 0.0, 1.0, 0.5), "bicubic", (1, 2, 3))


@pytest.mark.parametrize(("image", "planar", "says"), [
    (np.zeros((4, 5, 3), np.float32), False, "uint8 array"),
    (np.zeros((4, 5, 4), np.uint8), False, "H x W x 3"),
    (np.zeros((4, 5, 3), np.uint8), True, "3 x H x W"),
    (np.zeros((20, 3), np.uint8), False, "H x W x 3"),
    (np.zeros((4, 10, 3), np.uint8)[:, ::2], False, "C-contiguous"),
    (b"\0" * 60, False, "not bytes"),
])
def test_apply_refuses_an_image_it_cannot_change_in_place(image: Any, planar: bool,
                                                          says: str) -> None:
    with pytest.raises(ValueError, match=says):
        augment.apply(image, [Op("invert")], planar=planar)


def test_apply_refuses_a_read_only_image_and_a_list_of_other_things() -> None:
    img = np.zeros((2, 2, 3), np.uint8)
    img.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        augment.apply(img, [Op("invert")], planar=False)
    with pytest.raises(ValueError, match="imgprep.augment.Op"):
        augment.apply(np.zeros((2, 2, 3), np.uint8), [("invert", ())],  # type: ignore[list-item]
                      planar=False)


def untouched(call: Any, says: str) -> None:
    """``call(img)`` on a 3 x 4 x 5 image raises ValueError saying ``says``, the image as it
    was."""
    img = np.arange(60, dtype=np.uint8).reshape(3, 4, 5)
    before = img.copy()
    with pytest.raises(ValueError, match=says):
        call(img)
    assert np.array_equal(img, before)


def raw(code: str, args: tuple[float, ...], resample: int = 0,
        fill: tuple[int, int, int] = (0, 0, 0)) -> tuple[Any, ...]:
    return (getattr(ext, code), args, resample, fill)


@pytest.mark.parametrize(("ops", "says"), [
    ((raw("AUG_OP_INVERT", ()),) * 65, "65 ops in one call; at most 64"),
    (((99, (), 0, (0, 0, 0)),), "no op kind 99"),
    ((raw("AUG_OP_BRIGHTNESS", ()),), "takes 1 arguments, not 0"),
    ((raw("AUG_OP_AFFINE", (1.0,) * 7),), "no op takes more than 6"),
    ((raw("AUG_OP_BRIGHTNESS", (2e9,)),), "at most 1000000000 in size"),
    ((raw("AUG_OP_AFFINE", (1, 0, float("nan"), 0, 1, 0)),), "must be finite"),
    ((raw("AUG_OP_POSTERIZE", (2.5,)),), "posterize keeps 0..8 bits"),
    ((raw("AUG_OP_AFFINE", (1, 0, 0, 0, 1, 0), 1),), "affine resamples with filter 0, 2 or 3"),
    ((raw("AUG_OP_AFFINE", (1, 0, 0, 0, 1, 0), 0, (0, -1, 0)),), "three values in 0..255"),
    # a bad op after good ones: nothing is carried out
    ((raw("AUG_OP_INVERT", ()), raw("AUG_OP_SOLARIZE", (float("inf"),))), "must be finite"),
])
def test_the_extension_checks_every_op_before_it_touches_a_byte(ops: tuple[Any, ...],
                                                                says: str) -> None:
    untouched(lambda img: ext.augment(img, 5, 4, True, ops), says)


def test_the_extension_checks_the_image() -> None:
    invert = (raw("AUG_OP_INVERT", ()),)
    untouched(lambda img: ext.augment(img, 5, 5, True, invert), "holds 60 bytes; 5x5 RGB")
    untouched(lambda img: ext.augment(img, 0, 4, True, invert), "outside 1..65500")
    untouched(lambda img: ext.augment(img, ext.MAX_SIDE + 1, 1, True, invert),
              "outside 1..65500")
    with pytest.raises(TypeError):
        ext.augment(np.zeros(60, np.uint8), 5, 4, True, [invert[0]])  # a list, not a tuple


def test_without_the_extension_apply_says_how_to_build_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(augment, "AVAILABLE", False)
    with pytest.raises(DependencyError, match="make ext") as caught:
        augment.apply(np.zeros((1, 1, 3), np.uint8), [Op("invert")], planar=False)
    assert isinstance(caught.value, ImgprepError)


def test_the_python_side_names_the_extensions_codes() -> None:
    assert augment.OPS == ("identity", "affine", "brightness", "color", "contrast",
                           "sharpness", "posterize", "solarize", "solarize_add",
                           "autocontrast", "equalize", "invert")
    codes = [getattr(ext, f"AUG_OP_{name.upper()}") for name in augment.OPS]
    assert sorted(codes) == list(range(len(augment.OPS)))
    assert [getattr(ext, f"AUG_{r.upper()}") for r in augment.RESAMPLES] == [0, 2, 3]
    # each kind's count of arguments is the one the extension takes
    img = np.zeros((3, 1, 1), np.uint8)
    for name, code in zip(augment.OPS, codes, strict=True):
        n = len(Op(name, (1.0,) * augment._ARITY[name]).args)
        for wrong in (n - 1, n + 1):
            if 0 <= wrong <= 6:
                with pytest.raises(ValueError, match="arguments"):
                    ext.augment(img, 1, 1, True, ((code, (1.0,) * wrong, 0, (0, 0, 0)),))
