"""The fuzz target of the augmentation ops' C call (``augment`` in ``_jpegcrop``): random op
lists on small images made of every input, its promises checked.

- Each input becomes an image of a random size (1x1, 1xN, Nx1, odd sizes, up to 130 px a
  side): the input's bytes as pixels, its decode where the crop-aware probe takes it and
  Pillow decodes it, a flat colour or black and white; laid out as 3 x H x W or H x W x 3.
- Op lists are drawn from the module's op codes (``AUG_OP_*``), each op's arguments legal
  (typical factors, 0, -0, denormals, the limit ``AUG_MAX_ARG`` itself, huge shears and
  translations, rotations, every filter, black, white and random fills), up to
  ``AUG_MAX_OPS`` of them. A legal list is carried out the same twice (byte for byte), by
  the portable kernel as by the best this CPU runs (``AUG_KERNEL_*``), and on the other
  layout of the same picture; an empty list, or identities alone, change no byte.
- An illegal list (one op among legal ones with a kind outside the codes, an argument too
  many or too few, NaN, an infinity or an argument just past ``AUG_MAX_ARG``, posterize's
  bits outside 0..8 or not whole, a filter that is none, a fill outside 0..255), one op past
  ``AUG_MAX_OPS``, a size that is not the buffer's, or a kernel that is none, is refused
  with ValueError (OverflowError for an int past C's) before any byte changes: the image is
  its old bytes after.
- No call takes more than ``cpu_limit`` seconds of CPU (``harness.fuzz.target.bounded``).

The limits are read from the module under test, never copied, so that the target follows a
change of them.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from PIL import Image

from harness.fuzz.target import CPU_LIMIT, Mismatch, Target, bounded
from imgprep import augment

Packed = tuple[int, tuple[float, ...], int, tuple[int, int, int]]
SIDES = (1, 1, 2, 3, 7, 16, 31, 64, 130)
DECODE_PIXELS = 1 << 20  # larger headers are not decoded for pixel material


@dataclass(frozen=True)
class Limits:
    """What the module says an op may be: its codes by name, filters, limits, kernels."""

    codes: dict[str, int]
    filters: tuple[int, ...]
    max_ops: int
    max_arg: float
    kernels: tuple[int, ...]  # the ones this CPU runs, portable first

    @classmethod
    def of(cls, mod: ModuleType) -> Limits:
        codes = {name: int(getattr(mod, f"AUG_OP_{name.upper()}")) for name in augment.OPS}
        filters = tuple(int(getattr(mod, f"AUG_{r.upper()}")) for r in augment.RESAMPLES)
        kernels = [mod.AUG_KERNEL_PORTABLE]
        if mod.augment_kernel(-1) != mod.augment_kernel(mod.AUG_KERNEL_PORTABLE):
            kernels.append(mod.AUG_KERNEL_AVX2)
        return cls(codes, filters, int(mod.AUG_MAX_OPS), float(mod.AUG_MAX_ARG),
                   tuple(kernels))


def _real(lim: Limits, rng: np.random.Generator) -> float:
    """A legal argument: typical, signed zero, denormal, huge, or the limit itself."""
    pick = int(rng.integers(8))
    if pick < 4:
        return float(rng.uniform(-1.0, 3.0))
    return float((0.0, -0.0, 5e-324, rng.choice((1.0, -1.0)) * lim.max_arg)[pick - 4])


def _affine(lim: Limits, w: int, h: int, rng: np.random.Generator) -> tuple[float, ...]:
    """A shear, a translation, a rotation (huge ones too), or six arguments at random."""
    pick = int(rng.integers(4))
    big = lim.max_arg * float(rng.choice((1e-9, 1e-3, 1.0)))
    if pick == 0:
        return augment.shear_matrix(float(rng.uniform(-0.5, 0.5)) if rng.random() < 0.7
                                    else big * float(rng.choice((-1, 1))), _real(lim, rng))
    if pick == 1:
        return augment.translate_matrix(float(rng.uniform(-w, w)) if rng.random() < 0.7
                                        else -big, float(rng.uniform(-h, h)))
    if pick == 2:
        return augment.rotate_matrix(float(rng.uniform(-720, 720)), w, h)
    return tuple(_real(lim, rng) for _ in range(6))


def legal_op(lim: Limits, w: int, h: int, rng: np.random.Generator) -> Packed:
    """One op with legal arguments, packed as ``augment`` takes it."""
    kind = str(rng.choice(augment.OPS))
    r, g, b = (0, 0, 0) if rng.random() < 0.3 else (255, 255, 255) if rng.random() < 0.3 \
        else (int(v) for v in rng.integers(0, 256, 3))
    resample = int(rng.choice(lim.filters))
    args: tuple[float, ...]
    if kind == "affine":
        args = _affine(lim, w, h, rng)
    elif kind == "posterize":
        args = (float(rng.integers(0, 9)),)
    elif kind in ("solarize", "solarize_add"):
        edge = (-1.0, 0.0, 128.0, 128.5, 255.5, 256.0, lim.max_arg)
        args = tuple(float(rng.choice(edge)) if rng.random() < 0.5 else
                     float(rng.uniform(-300, 300)) for _ in range(augment._ARITY[kind]))
    else:
        args = tuple(_real(lim, rng) for _ in range(augment._ARITY[kind]))
    return lim.codes[kind], args, resample, (r, g, b)


def illegal_op(lim: Limits, w: int, h: int, rng: np.random.Generator) -> tuple[str, Packed]:
    """One op just past a limit, and which limit."""
    code, args, resample, fill = legal_op(lim, w, h, rng)
    kinds = max(lim.codes.values()) + 1
    past = math.nextafter(lim.max_arg, math.inf)
    how = str(rng.choice(("kind", "arity", "arg", "posterize", "filter", "fill")))
    if how == "kind":
        code = int(rng.choice((-1, kinds, kinds + 1, 2**31 - 1)))
    elif how == "arity":
        args = (args + (1.0,)) if not args or rng.random() < 0.5 else args[:-1]
    elif how == "arg":
        while not args:  # an op that takes arguments: each kind's are checked
            code, args, resample, fill = legal_op(lim, w, h, rng)
        bad = float(rng.choice((math.nan, math.inf, -math.inf, past, -past)))
        at = int(rng.integers(len(args)))
        args = args[:at] + (bad,) + args[at + 1:]
    elif how == "posterize":
        code = lim.codes["posterize"]
        args = (float(rng.choice((-1.0, 9.0, 4.5, math.nextafter(8.0, 9.0),
                                  math.nextafter(0.0, -1.0), math.nan))),)
    elif how == "filter":
        code, args = lim.codes["affine"], _affine(lim, w, h, rng)
        resample = int(rng.choice([f for f in range(-1, max(lim.filters) + 2)
                                   if f not in lim.filters]))
    else:
        code, args = lim.codes["affine"], _affine(lim, w, h, rng)
        at, value = int(rng.integers(3)), int(rng.choice((-1, 256, 2**31, -(2**31))))
        fill = (value, fill[1], fill[2]) if at == 0 else (fill[0], value, fill[2]) if at == 1 \
            else (fill[0], fill[1], value)
    return how, (code, args, resample, fill)


def _decoded(mod: ModuleType, data: bytes, w: int, h: int,
             cpu_limit: float) -> np.ndarray | None:
    """Pillow's decode of ``data`` drafted and resized to ``w`` x ``h``, where the crop-aware
    probe takes it; None otherwise."""
    pw, ph, code, _ = bounded(cpu_limit, "probe", lambda: mod.probe(data))
    if code != 0 or not 0 < pw * ph <= DECODE_PIXELS:
        return None
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.draft("RGB", (w, h))
            rgb = img.convert("RGB").resize((w, h), Image.Resampling.BILINEAR)
    except Exception:  # noqa: BLE001 - Pillow's failures on mutated bytes are not ours
        return None
    return np.asarray(rgb, np.uint8)


def image_of(mod: ModuleType, data: bytes, rng: np.random.Generator,
             cpu_limit: float = CPU_LIMIT) -> np.ndarray:
    """An H x W x 3 picture made of ``data``: its bytes, its decode, a flat colour, or black
    and white."""
    w, h = (int(rng.choice(SIDES)) if rng.random() < 0.7 else int(rng.integers(1, 48))
            for _ in range(2))
    pick = rng.random()
    if pick < 0.3:
        got = _decoded(mod, data, w, h, cpu_limit)
        if got is not None:
            return got
    if pick < 0.8:
        start, need = int(rng.integers(len(data))) if data else 0, w * h * 3
        rolled = (data[start:] + data[:start]) or b"\x00"
        return np.frombuffer((rolled * (need // len(rolled) + 1))[:need],
                             np.uint8).reshape(h, w, 3)
    if pick < 0.9:
        return np.broadcast_to(rng.integers(0, 256, 3, dtype=np.uint8), (h, w, 3))
    return rng.choice(np.array([0, 255], np.uint8), (h, w, 3))


def _run(mod: ModuleType, img: np.ndarray, planar: bool, ops: tuple[Any, ...], kernel: int,
         cpu_limit: float, width: int | None = None) -> np.ndarray:
    """``ops`` carried out on a copy of ``img`` (H x W x 3) in ``planar``'s layout with
    ``kernel``; the result as H x W x 3 (``width``: the one given, when not the image's)."""
    h, w = img.shape[:2]
    out = np.array(img.transpose(2, 0, 1) if planar else img, np.uint8, order="C")
    bounded(cpu_limit, f"augment {w}x{h} planar={planar} kernel={kernel} ops={ops!r:.300}",
            lambda: mod.augment(out, w if width is None else width, h, planar, ops, kernel))
    return out.transpose(1, 2, 0) if planar else out


def _refused(mod: ModuleType, img: np.ndarray, planar: bool, ops: tuple[Any, ...],
             kernel: int, what: str, cpu_limit: float, width: int | None = None) -> None:
    """``ops`` on ``img`` must raise ValueError (or OverflowError), with the image's bytes
    unchanged."""
    h, w = img.shape[:2]
    out = np.array(img.transpose(2, 0, 1) if planar else img, np.uint8, order="C")
    before = out.copy()
    try:
        bounded(cpu_limit, f"augment refusing {what}", lambda: mod.augment(
            out, w if width is None else width, h, planar, ops, kernel))
    except (ValueError, OverflowError) as e:
        if not str(e):
            raise Mismatch(f"augment refused {what} without a message") from e
        if not np.array_equal(out, before):
            raise Mismatch(f"augment refused {what} after changing the image") from e
        return
    raise Mismatch(f"augment accepted {what} on a {w}x{h} image: {ops!r:.300}")


def _illegal(mod: ModuleType, lim: Limits, img: np.ndarray, planar: bool,
             rng: np.random.Generator, cpu_limit: float) -> str:
    """A list, image size or kernel past a limit, refused untouched; which one."""
    h, w = img.shape[:2]
    ops = [legal_op(lim, w, h, rng) for _ in range(int(rng.integers(0, 6)))]
    kernel = int(rng.choice(lim.kernels))
    pick = rng.random()
    if pick < 0.7:
        how, bad = illegal_op(lim, w, h, rng)
        ops.insert(int(rng.integers(len(ops) + 1)), bad)
        _refused(mod, img, planar, tuple(ops), kernel, f"an op past its {how}", cpu_limit)
        return how
    if pick < 0.8:
        many = tuple(legal_op(lim, w, h, rng) for _ in range(lim.max_ops + 1))
        _refused(mod, img, planar, many, kernel, f"{lim.max_ops + 1} ops", cpu_limit)
        return "ops"
    if pick < 0.9:
        width = int(rng.choice((w + 1, w - 1, -w, 0, 2**40)))
        _refused(mod, img, planar, tuple(ops), kernel, f"width {width}", cpu_limit, width)
        return "size"
    kernel = int(rng.choice((max(lim.kernels) + 1, -2, 2**31 - 1)))
    _refused(mod, img, planar, tuple(ops), kernel, f"kernel {kernel}", cpu_limit)
    return "kernel"


def augment_target(mod: ModuleType, cpu_limit: float = CPU_LIMIT) -> Target:
    """The target over ``mod`` (the extension, however it was built); each call bounded to
    ``cpu_limit`` seconds of CPU."""
    lim = Limits.of(mod)

    def target(data: bytes, rng: np.random.Generator) -> str:
        img = image_of(mod, data, rng, cpu_limit)
        h, w = img.shape[:2]
        planar = bool(rng.integers(2))
        if rng.random() < 0.3:
            return f"augment:refused:{_illegal(mod, lim, img, planar, rng, cpu_limit)}"
        n = lim.max_ops if rng.random() < 0.05 else int(rng.integers(0, 9))
        ops = tuple(legal_op(lim, w, h, rng) for _ in range(n))
        best = lim.kernels[-1]
        done = _run(mod, img, planar, ops, best, cpu_limit)
        where = f"augment {w}x{h} planar={planar} ops={ops!r:.300}"
        if not np.array_equal(done, _run(mod, img, planar, ops, best, cpu_limit)):
            raise Mismatch(f"{where}: two calls differ")
        if best != lim.kernels[0] and not np.array_equal(
                done, _run(mod, img, planar, ops, lim.kernels[0], cpu_limit)):
            raise Mismatch(f"{where}: the portable kernel's bytes differ")
        if not np.array_equal(done, _run(mod, img, not planar, ops, best, cpu_limit)):
            raise Mismatch(f"{where}: the other layout gives another picture")
        if all(op[0] == lim.codes["identity"] for op in ops) and not np.array_equal(done, img):
            raise Mismatch(f"{where}: identities changed the picture")
        return "augment:applied" if n else "augment:empty"

    return target
