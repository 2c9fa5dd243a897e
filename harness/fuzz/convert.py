"""The fuzz target of convert's C path (``convert``, ``finish``, ``encode`` in ``_jpegcrop``):
random options on every input, its promises checked.

- ``convert`` answers every input with a well-formed tuple: converted (an output JPEG that
  Pillow opens at the size the call reports), declined or failed with a message; never a
  crash. The scan report is well formed.
- The region decode and the whole decode give the same answer and the same bytes (the
  region is an optimisation, never a change of output).
- No call takes more than ``cpu_limit`` seconds of CPU (``harness.fuzz.target.bounded``).
- ``finish`` and ``encode`` of random pixels at random sizes give a JPEG Pillow opens at
  the size asked, and refuse out-of-range sizes and short buffers with ValueError; ``encode``
  takes every legal chroma sampling (and refuses factors outside 1..4), and a region of what
  it wrote decodes to the whole decode's pixels, at a random DCT scale.

Options are drawn at random: output size, center-crop or short-side, each filter, quality,
the EXIF turn; ``max_pixels`` is kept at ``MAX_PIXELS`` so that a forged header of a few
hundred megapixels is refused as convert refuses it, before any decoding.
"""

from __future__ import annotations

import io
from types import ModuleType
from typing import Any

import numpy as np
from PIL import Image

from harness.fuzz.extension import REPORT_KEYS
from harness.fuzz.mutate import LEGAL_SAMPLINGS
from harness.fuzz.target import CPU_LIMIT, Mismatch, Target, bounded

MAX_PIXELS = 1 << 22
SIZES = (1, 17, 64, 224, 256)
FILTERS = (1, 2, 3, 4, 5)  # Pillow's numbers: lanczos, bilinear, bicubic, box, hamming
STATUS = {0: "converted", 1: "declined", 2: "failed"}
_LEGAL = frozenset(LEGAL_SAMPLINGS)


def _opened_size(jpeg: bytes, where: str) -> tuple[int, int]:
    """The size Pillow reads from the output, which must decode whole."""
    try:
        with Image.open(io.BytesIO(jpeg)) as img:
            img.load()
            if img.format != "JPEG" or img.mode != "RGB":
                raise Mismatch(f"{where}: output is {img.format} {img.mode}, not an RGB JPEG")
            return img.size
    except (OSError, SyntaxError, ValueError) as e:
        raise Mismatch(f"{where}: Pillow cannot read the output: {e}") from e


def _check_answer(r: Any, where: str) -> str:
    """The tuple's shape and, when converted, its output; the status's label."""
    if not isinstance(r, tuple) or len(r) != 13 or r[0] not in STATUS:
        raise Mismatch(f"{where}: malformed answer {r!r:.200}")
    status, message, jpeg, *_, out_w, out_h, scan = r
    if status == 0:
        if _opened_size(jpeg, where) != (out_w, out_h):
            raise Mismatch(f"{where}: reports {out_w}x{out_h}, the JPEG is not that size")
    elif not isinstance(message, str) or not message:
        raise Mismatch(f"{where}: {STATUS[status]} without a message")
    if scan is not None and (not isinstance(scan, dict) or set(scan) != REPORT_KEYS):
        raise Mismatch(f"{where}: malformed scan report {scan!r}")
    return STATUS[status]


def _region_matches_whole(mod: ModuleType, jpeg: bytes, w: int, h: int,
                          rng: np.random.Generator, where: str) -> None:
    """A random region of the clean ``jpeg`` at a random scale, against its whole decode."""
    scale = int(rng.choice((1, 2, 4, 8)))
    sw, sh = -(-w // scale), -(-h // scale)
    whole = np.zeros(sw * sh * 4, np.uint8)
    mod.decode(jpeg, whole, scale, 0, 0, sw, sh)
    x0, y0 = int(rng.integers(0, sw)), int(rng.integers(0, sh))
    x1, y1 = int(rng.integers(x0 + 1, sw + 1)), int(rng.integers(y0 + 1, sh + 1))
    part = np.full(sw * sh * 4, 77, np.uint8)  # not what any decode writes
    mod.decode(jpeg, part, scale, x0, y0, x1, y1)
    got, want = (a.reshape(sh, sw, 4)[y0:y1, x0:x1, :3] for a in (part, whole))
    if not np.array_equal(got, want):
        raise Mismatch(f"{where}: region {(x0, y0, x1, y1)} at 1/{scale} differs from the "
                       "whole decode")


def _encoded(mod: ModuleType, rgb: bytes, w: int, h: int, rng: np.random.Generator) -> None:
    """``encode`` at no sampling, a legal one or six factors drawn from 0..5."""
    kind = int(rng.integers(3))
    factors = () if kind == 0 else LEGAL_SAMPLINGS[int(rng.integers(len(LEGAL_SAMPLINGS)))] \
        if kind == 1 else tuple(int(v) for v in rng.integers(0, 6, 6))
    where = f"encode {w}x{h} at sampling {factors}"
    legal = kind < 2 or factors in _LEGAL
    try:
        jpeg = mod.encode(rgb, w, h, 3, int(rng.integers(1, 101)), factors)
    except ValueError as e:
        if legal:
            raise Mismatch(f"{where}: refused ({e})") from e
        return
    if not all(1 <= f <= 4 for f in factors):
        raise Mismatch(f"{where}: accepted factors outside 1..4")
    if _opened_size(jpeg, where) != (w, h):
        raise Mismatch(f"{where}: the JPEG is not that size")
    if legal:
        _region_matches_whole(mod, jpeg, w, h, rng, where)


def _pixels_checked(mod: ModuleType, rng: np.random.Generator) -> None:
    """``finish`` and ``encode`` on random pixels, and their refusals."""
    w, h = (int(v) for v in rng.integers(1, 300, 2))
    rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8).tobytes()
    size, resize = int(rng.choice(SIZES)), int(rng.integers(2))
    r = mod.finish(rgb, w, h, w, h, size, resize, int(rng.choice(FILTERS)),
                   int(rng.integers(1, 101)), False, False, MAX_PIXELS)
    _check_answer(r, f"finish {w}x{h} to {size}")
    _encoded(mod, rgb, w, h, rng)
    for call, what in (
            (lambda: mod.encode(rgb[:-1], w, h, 3, 90), "encode of a short buffer"),
            (lambda: mod.encode(rgb, 0, h, 3, 90), "encode of width 0"),
            (lambda: mod.encode(rgb, w, h, 2, 90), "encode of 2 channels"),
            (lambda: mod.finish(rgb[:-1], w, h, w, h, 64, 0, 1, 90, False, False, MAX_PIXELS),
             "finish of a short buffer"),
            (lambda: mod.finish(rgb, w, h, w, h, 0, 0, 1, 90, False, False, MAX_PIXELS),
             "finish to size 0")):
        try:
            call()
        except (ValueError, OverflowError):
            continue
        raise Mismatch(f"accepted {what}")


def convert_target(mod: ModuleType, cpu_limit: float = CPU_LIMIT) -> Target:
    """The target over ``mod`` (the extension, however it was built); each call bounded to
    ``cpu_limit`` seconds of CPU."""

    def target(data: bytes, rng: np.random.Generator) -> str:
        size, resize = int(rng.choice(SIZES)), int(rng.integers(2))
        filt, quality = int(rng.choice(FILTERS)), int(rng.integers(1, 101))
        turn, hist, px = (bool(v) for v in rng.integers(2, size=3))
        args = (size, resize, filt, quality, turn)
        tail = (hist, px, MAX_PIXELS, MAX_PIXELS)
        where = f"convert{args}"
        region = bounded(cpu_limit, where, lambda: mod.convert(data, *args, False, *tail))
        label = _check_answer(region, where)
        whole = bounded(cpu_limit, f"{where} whole", lambda: mod.convert(data, *args, True, *tail))
        _check_answer(whole, f"{where} whole")
        if (region[0], region[2]) != (whole[0], whole[2]):
            raise Mismatch(f"{where}: the region decode ({STATUS[region[0]]}) and the whole "
                           f"decode ({STATUS[whole[0]]}) differ")
        if rng.random() < 0.1:
            _pixels_checked(mod, rng)
        return f"convert:{label}"

    return target
