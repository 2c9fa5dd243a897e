"""The fuzz target of the loader's C call (``sample`` in ``_jpegcrop``): random geometry on
every input, its promises checked.

- ``sample`` answers every input with a well-formed tuple: done (the batch row written),
  declined (a colour space for Pillow), failed or refused (over the per-image budget) with
  a message; never a crash.
- For a file the crop-aware probe takes (code 0, what the loader decodes by region), the
  region decode and the whole decode give the same answer and, when done, the same row
  (the region is an optimisation, never a change of output). Other files are decoded whole
  by the loader; a region call on them only has to answer. A region the budget refuses is
  refused whole too.
- No call takes more than ``cpu_limit`` seconds of CPU (``harness.fuzz.target.bounded``).
- Geometry outside the image (a box past its edge, an empty or outside crop, an output
  buffer of the wrong size, negative sizes) is refused with ValueError before any byte is
  read.

The geometry is drawn as the loader's transforms draw it (a box inside the header's size,
a draft request, an output size, a crop of it, a flip), with ``max_pixels`` at
``MAX_PIXELS`` so that a forged header of a few hundred megapixels is refused.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from harness.fuzz.extension import REPORT_KEYS
from harness.fuzz.target import CPU_LIMIT, Mismatch, Target, bounded
from imgprep import jpegcrop

MAX_PIXELS = 1 << 22
STATUS = {jpegcrop.SAMPLE_DONE: "done", jpegcrop.SAMPLE_DECLINED: "declined",
          jpegcrop.SAMPLE_FAILED: "failed", jpegcrop.SAMPLE_REFUSED: "refused"}


def _geometry(w: int, h: int, rng: np.random.Generator) -> dict[str, Any]:
    """A transform's geometry for a ``w`` x ``h`` image: train-like (a box) or val-like."""
    size = int(rng.choice((1, 7, 24, 64, 224)))
    if rng.random() < 0.6:
        x0, y0 = float(rng.uniform(0, w)), float(rng.uniform(0, h))
        box = (x0, y0, float(rng.uniform(x0, w)), float(rng.uniform(y0, h)))
        draft = (int(rng.integers(1, 2 * size + 2)), int(rng.integers(1, 2 * size + 2)))
        return {"draft": draft, "resize": (size, size), "box": box,
                "crop": (0, 0, size, size)}
    rw, rh = int(rng.integers(size, 3 * size + 1)), int(rng.integers(size, 3 * size + 1))
    left, top = int(rng.integers(0, rw - size + 1)), int(rng.integers(0, rh - size + 1))
    return {"draft": (rw, rh), "resize": (rw, rh), "box": None,
            "crop": (left, top, left + size, top + size)}


def _call(mod: ModuleType, data: bytes, w: int, h: int, g: dict[str, Any], flip: bool,
          planar: bool, whole: bool, cpu_limit: float) -> tuple[Any, bytes]:
    left, top, right, bottom = g["crop"]
    out = bytearray((right - left) * (bottom - top) * 3)
    r = bounded(cpu_limit, f"sample {g} whole={whole}", lambda: mod.sample(
        data, w, h, g["draft"], g["resize"], g["box"], g["crop"], flip, planar, whole,
        MAX_PIXELS, out))
    if not isinstance(r, tuple) or len(r) != 4 or r[0] not in STATUS:
        raise Mismatch(f"sample {g}: malformed answer {r!r:.200}")
    status, _path, message, scan = r
    if status != jpegcrop.SAMPLE_DONE and not (isinstance(message, str) and message):
        raise Mismatch(f"sample {g}: {STATUS[status]} without a message")
    if scan is not None and (not isinstance(scan, dict) or set(scan) != REPORT_KEYS):
        raise Mismatch(f"sample {g}: malformed scan report {scan!r}")
    return r, bytes(out)


def _refusals(mod: ModuleType, data: bytes, w: int, h: int) -> None:
    """Geometry outside the image, and wrong buffers, raise ValueError."""
    out = bytearray(8 * 8 * 3)
    bad = [
        ((w, h), (8, 8), (0.0, 0.0, w + 1.0, float(h)), (0, 0, 8, 8), out, "a box past the edge"),
        ((w, h), (8, 8), None, (0, 0, 9, 8), out, "a crop outside the output"),
        ((w, h), (8, 8), None, (3, 0, 3, 8), bytearray(0), "an empty crop"),
        ((w, h), (8, 8), None, (2**62, 0, 2**62 + 8, 8), out, "a crop 2**62 to the right"),
        ((w, h), (8, 8), None, (0, 0, 8, 8), bytearray(8 * 8 * 3 - 1), "a short output"),
        ((w, h), (-8, 8), None, (0, 0, 8, 8), out, "a negative size"),
        ((0, h), (8, 8), None, (0, 0, 8, 8), out, "a draft of width 0"),
    ]
    for draft, resize, box, crop, buf, what in bad:
        try:
            mod.sample(data, w, h, draft, resize, box, crop, False, True, False, MAX_PIXELS,
                       buf)
        except (ValueError, OverflowError):
            continue
        raise Mismatch(f"sample accepted {what} ({w}x{h})")


def sample_target(mod: ModuleType, cpu_limit: float = CPU_LIMIT) -> Target:
    """The target over ``mod`` (the extension, however it was built); each call bounded to
    ``cpu_limit`` seconds of CPU."""

    def target(data: bytes, rng: np.random.Generator) -> str:
        w, h, code, _ = bounded(cpu_limit, "probe", lambda: mod.probe(data))
        if w < 1 or h < 1:
            return "sample:no-header"
        g = _geometry(w, h, rng)
        flip, planar = (bool(v) for v in rng.integers(2, size=2))
        try:
            region, rows = _call(mod, data, w, h, g, flip, planar, False, cpu_limit)
        except ValueError as e:  # the header's size is outside what sample takes
            return "sample:too-large" if "over the limit" in str(e) else f"sample:invalid:{e}"
        whole, whole_rows = _call(mod, data, w, h, g, flip, planar, True, cpu_limit)
        done = region[0] == jpegcrop.SAMPLE_DONE
        if code == 0 and (region[0] != whole[0] or (done and rows != whole_rows)):
            raise Mismatch(f"sample {g} (probe code {code}): the region decode "
                           f"({STATUS[region[0]]}) and the whole decode "
                           f"({STATUS[whole[0]]}) differ")
        if region[0] == jpegcrop.SAMPLE_REFUSED and whole[0] != region[0]:
            raise Mismatch(f"sample {g}: the region decode was refused ({region[2]}), the "
                           f"whole decode {STATUS[whole[0]]}")
        if rng.random() < 0.1:
            _refusals(mod, data, w, h)
        return f"sample:{STATUS[region[0]]}"

    return target
