"""Per-sample augmentation ops, carried out in the C extension, byte-equal to stock Pillow.

An ``Op`` names one of Pillow's own calls on an RGB image and its arguments; ``apply``
carries a list of them out in order, in place, on one uint8 image (3 x H x W, or H x W x 3),
in one call into the extension with the GIL released. Each op gives the bytes stock Pillow
13.0.0 gives (the calls torchvision's and timm's PIL paths make), on every CPU:

==============  ===========================================================================
kind            Pillow's call on ``img`` (RGB), and ``args``
==============  ===========================================================================
identity        none: ``img``
affine          ``img.transform(img.size, Image.AFFINE, args, resample, fillcolor=fill)``;
                ``args`` (a, b, c, d, e, f): output pixel (x, y) samples the input at
                (a x + b y + c, d x + e y + f), pixel centres at +0.5
brightness      ``ImageEnhance.Brightness(img).enhance(factor)``, ``args`` (factor,)
color           ``ImageEnhance.Color(img).enhance(factor)``
contrast        ``ImageEnhance.Contrast(img).enhance(factor)``
sharpness       ``ImageEnhance.Sharpness(img).enhance(factor)``
posterize       ``ImageOps.posterize(img, bits)``, ``args`` (bits,): an integer 0..8 (0: all
                zero, the same table; Pillow 13 refuses 0, which timm's levels reach)
solarize        ``ImageOps.solarize(img, threshold)``: values below the (float) threshold kept,
                the others inverted
solarize_add    timm's ``solarize_add(img, add, threshold)``: ``min(255, p + add)`` where
                ``p < threshold``, through ``img.point`` (rounded half to even, clipped to 0)
autocontrast    ``ImageOps.autocontrast(img)`` (no cutoff; each channel stretched alone)
equalize        ``ImageOps.equalize(img)`` (each channel alone)
invert          ``ImageOps.invert(img)``
==============  ===========================================================================

``resample`` ("nearest", "bilinear", "bicubic": Pillow's NEAREST, BILINEAR, BICUBIC) and
``fill`` (Pillow's ``fillcolor``: the colour of output pixels whose sample falls outside the
input) are read by ``affine`` only. ``shear_matrix``, ``translate_matrix`` and
``rotate_matrix`` compute Pillow's and timm's matrices as they do; ``rotate_matrix`` is what
``img.rotate(degrees, resample, fillcolor=fill)`` hands to ``transform`` (its 90-degree
shortcuts give the same bytes). docs/augment.md defines each op and shows the agreement.

The op codes and filter numbers are the extension's (its ``AUG_OP_*`` and ``AUG_*``
constants, defined once in imgprep/csrc/augment.h), as is its limit on an argument's size
(``AUG_MAX_ARG``: ``apply`` refuses a larger one) and on ops in one call (``AUG_MAX_OPS``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np

from imgprep.errors import DependencyError

_ext: ModuleType | None
try:
    from imgprep import _jpegcrop as _ext
except ImportError as e:  # built optionally, as imgprep.jpegcrop says
    _ext, _MISSING = None, str(e)
else:
    _MISSING = ""

OPS: tuple[str, ...] = ("identity", "affine", "brightness", "color", "contrast", "sharpness",
                        "posterize", "solarize", "solarize_add", "autocontrast", "equalize",
                        "invert")
RESAMPLES: tuple[str, ...] = ("nearest", "bilinear", "bicubic")
KERNELS: tuple[str, ...] = ("portable", "avx2")  # the extension's AUG_KERNEL_* 0, 1
_ARITY = {"identity": 0, "affine": 6, "brightness": 1, "color": 1, "contrast": 1,
         "sharpness": 1, "posterize": 1, "solarize": 1, "solarize_add": 2, "autocontrast": 0,
         "equalize": 0, "invert": 0}  # the arguments each kind takes

_UINT8 = np.dtype(np.uint8)
AVAILABLE: bool = _ext is not None and hasattr(_ext, "augment")
_CODES = {name: getattr(_ext, f"AUG_OP_{name.upper()}") for name in OPS} if AVAILABLE else {}
_FILTERS = {name: getattr(_ext, f"AUG_{name.upper()}") for name in RESAMPLES} \
    if AVAILABLE else {}


def _real(value: object, what: str) -> float:
    """``value`` as a finite float; ValueError naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{what} must be a number, not {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} must be finite, not {number}")
    return number


def _finite_floats(args: tuple[object, ...]) -> bool:
    """Whether every one of ``args`` is already a finite float (the policies' ops: nothing to
    convert; ``x - x`` is 0 for a finite float, NaN otherwise)."""
    for a in args:
        if type(a) is not float or a - a != 0.0:
            return False
    return True


def _bytes3(fill: object) -> bool:
    """Whether ``fill`` is already three Python ints in 0..255."""
    if type(fill) is not tuple or len(fill) != 3:
        return False
    r, g, b = fill
    return type(r) is int and type(g) is int and type(b) is int and \
        0 <= r <= 255 and 0 <= g <= 255 and 0 <= b <= 255


@dataclass(frozen=True, init=False)
class Op:
    """One op: ``kind`` (one of ``OPS``) and its ``args`` (floats; the module's table says
    which), ``resample`` and ``fill`` for ``affine`` (the other kinds ignore them). Checked
    on construction (ValueError); ``args`` are kept as floats and ``fill`` as ints. The form
    ``apply`` hands the extension is made once, here (``packed``: not compared)."""

    kind: str
    args: tuple[float, ...] = ()
    resample: str = "nearest"
    fill: tuple[int, int, int] = (0, 0, 0)
    packed: tuple[int, tuple[float, ...], int, tuple[int, int, int]] = field(
        init=False, repr=False, compare=False)

    def __init__(self, kind: str, args: tuple[float, ...] = (), resample: str = "nearest",
                 fill: tuple[int, int, int] = (0, 0, 0)) -> None:
        arity = _ARITY.get(kind)
        if arity is None:
            raise ValueError(f"unknown augmentation op {kind!r}; one of {', '.join(OPS)}")
        if not isinstance(args, tuple) or len(args) != arity:
            raise ValueError(f"{kind} takes a tuple of {arity} arguments, not {args!r}")
        given = args
        if not _finite_floats(args):
            args = tuple(_real(a, f"{kind}'s argument {i}") for i, a in enumerate(args))
        if kind == "posterize" and not (args[0].is_integer() and 0 <= args[0] <= 8):
            raise ValueError(f"posterize keeps an integer 0..8 of bits, not {given[0]!r}")
        if resample not in RESAMPLES:
            raise ValueError(f"unknown resample {resample!r}; one of {', '.join(RESAMPLES)}")
        if not _bytes3(fill):
            if not isinstance(fill, tuple) or len(fill) != 3 or not all(
                    isinstance(v, int | np.integer) and not isinstance(v, bool) and
                    0 <= v <= 255 for v in fill):
                raise ValueError(f"fill must be three ints in 0..255 (R, G, B), not {fill!r}")
            fill = (int(fill[0]), int(fill[1]), int(fill[2]))
        # frozen: the fields are set once, here, in the instance's dict
        self.__dict__.update(kind=kind, args=args, resample=resample, fill=fill,
                             packed=(_CODES.get(kind, -1), args, _FILTERS.get(resample, -1),
                                     fill))


def _module() -> ModuleType:
    if _ext is None or not AVAILABLE:
        raise DependencyError(
            f"the augmentation ops need imgprep's C extension, which is not built here "
            f"({_MISSING or 'an older build without them'}): reinstall imgprep with a C "
            "compiler (docs/install.md), or in a checkout run `make ext`")
    return _ext


def kernel(name: str | None = None) -> str:
    """The kernel that carries the ops out here (``name``: check that this CPU runs that
    one); ValueError when it cannot. Every kernel gives the same bytes."""
    if name is not None and name not in KERNELS:
        raise ValueError(f"unknown augmentation kernel {name!r}; one of {', '.join(KERNELS)}")
    return str(_module().augment_kernel(-1 if name is None else KERNELS.index(name)))


def kernels() -> tuple[str, ...]:
    """The kernels this CPU runs, portable first."""
    return KERNELS[:KERNELS.index(kernel()) + 1]


def apply(out: np.ndarray, ops: Sequence[Op], *, planar: bool,
          kernel: str | None = None) -> None:
    """Carry ``ops`` out in order, in place, on one uint8 RGB image ``out``: 3 x H x W
    (``planar``) or H x W x 3, C-contiguous; one call into the extension, the GIL released;
    each op's bytes equal to stock Pillow's own call, whichever ``kernel`` (None: the best
    this CPU runs; ``KERNELS``) carries them out. ValueError for a wrong image or op (the
    extension checks every argument again before it touches a byte) or a kernel this CPU
    lacks; DependencyError where the extension is not built."""
    ext = _module()
    if not isinstance(out, np.ndarray) or out.dtype != _UINT8 or out.ndim != 3 or \
            out.shape[0 if planar else 2] != 3:
        shape = "3 x H x W" if planar else "H x W x 3"
        got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
        raise ValueError(f"the image must be a {shape} uint8 array, not {got}")
    flags = out.flags
    if not flags.c_contiguous or not flags.writeable:
        raise ValueError("the image must be C-contiguous and writeable (np.ascontiguousarray)")
    packed = []
    for op in ops:
        if not isinstance(op, Op):
            raise ValueError(f"ops must be imgprep.augment.Op records, not {list(ops)!r}")
        packed.append(op.packed)
    height, width = out.shape[1:] if planar else out.shape[:2]
    if kernel is None:
        ext.augment(out, width, height, planar, tuple(packed))
    else:
        number = KERNELS.index(kernel) if kernel in KERNELS else len(KERNELS)
        ext.augment(out, width, height, planar, tuple(packed), number)


def shear_matrix(x: float = 0.0, y: float = 0.0) -> tuple[float, ...]:
    """timm's shear_x / shear_y matrix, (1, x, 0, y, 1, 0): output (u, v) samples the input
    at (u + x v, y u + v)."""
    return (1.0, float(x), 0.0, float(y), 1.0, 0.0)


def translate_matrix(dx: float = 0.0, dy: float = 0.0) -> tuple[float, ...]:
    """timm's translate matrix, (1, 0, dx, 0, 1, dy): output (u, v) samples the input at
    (u + dx, v + dy), so the picture moves by (-dx, -dy)."""
    return (1.0, 0.0, float(dx), 0.0, 1.0, float(dy))


def rotate_matrix(degrees: float, width: int, height: int) -> tuple[float, ...]:
    """What ``Image.rotate(degrees, expand=False, center=None)`` of a ``width`` x ``height``
    image hands to ``Image.transform``: the inverse rotation about the centre, computed as
    Pillow 13.0.0 computes it (the angle taken modulo 360 first, the sines and cosines rounded
    to 15 places), counter-clockwise for positive ``degrees``."""
    angle = -math.radians(float(degrees) % 360.0)
    cx, cy = width / 2, height / 2
    cos, sin = round(math.cos(angle), 15), round(math.sin(angle), 15)
    a, b, d, e = cos, sin, round(-math.sin(angle), 15), cos
    c = a * -cx + b * -cy + 0.0
    f = d * -cx + e * -cy + 0.0
    return (a, b, c + cx, d, e, f + cy)
