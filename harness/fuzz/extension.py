"""The fuzz target of the C extension ``_jpegcrop``: every entry point on every input, its
promises checked.

- ``probe`` and ``probe(check=True)`` never fail on any bytes; the report is well formed,
  and a refusal by the per-image budget carries its reason.
- ``decode`` of a random region at a random DCT scale, whole or not, either declines
  cleanly (ValueError; for an image the check refused, with the check's reason) or writes
  the region; when libjpeg did not warn, the region's pixels
  are Pillow's full decode of the same bytes at that scale (Pillow links the same
  libjpeg-turbo), and a whole read that found nothing wrong is one Pillow decodes too.
- ``pack`` of a random box of the decoded frame is the same box sliced by numpy, mirrored
  and laid out as asked, from the frame's buffer and from Pillow's Arrow export.
- Arguments out of range (negative, past the image, past Py_ssize_t, an empty region, a
  frame too small, a wrong scale) raise ValueError or OverflowError, never reach memory.
- No call takes more than ``cpu_limit`` seconds of CPU (``harness.fuzz.target.bounded``).

Images past ``FRAME_PIXELS`` are not decoded and images between ``CHECK_PIXELS`` and
``CAPPED_PIXELS`` not checked, as the callers refuse them first (Pillow's bomb limit, before
any frame or check): a forged header of a few hundred megapixels costs seconds of libjpeg's
time, while past ``CAPPED_PIXELS`` the check's own memory cap refuses it at once.
"""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from PIL import Image

from harness.fuzz.target import CPU_LIMIT, Mismatch, Target, bounded

FRAME_PIXELS = 1 << 21
CHECK_PIXELS = 1 << 22
CAPPED_PIXELS = 11 << 27  # 2 bytes a coefficient: over the 2 GiB cap whatever the sampling
REPORT_KEYS = {"warnings", "first", "eof", "hit_marker", "padding", "trailing", "error",
               "refused"}
CODES = {0: "fast", 1: "progressive", 2: "colour", 3: "tail", 4: "broken"}
HUGE = (-1, -(2**31), 2**31, 2**40, 2**62)


def load_extension(path: Path | None) -> ModuleType:
    """The extension built at ``path`` (a sanitizer build, say), or imgprep's own."""
    if path is None:
        from imgprep import jpegcrop

        if jpegcrop._jpegcrop is None:
            raise SystemExit(f"the extension is not built: {jpegcrop.status()}")
        return jpegcrop._jpegcrop
    spec = importlib.util.spec_from_file_location("_jpegcrop", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not an extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_report(rep: Any, size: int, where: str) -> None:
    if not isinstance(rep, dict) or set(rep) != REPORT_KEYS:
        raise Mismatch(f"{where}: malformed report {rep!r}")
    ints = ("warnings", "eof", "hit_marker", "padding", "trailing", "refused")
    if not all(isinstance(rep[k], int) and rep[k] >= 0 for k in ints) or \
            rep["eof"] > 1 or rep["hit_marker"] > 1 or rep["refused"] > 1 or \
            rep["trailing"] > size or not isinstance(rep["error"], str):
        raise Mismatch(f"{where}: report values out of range {rep!r}")
    if rep["refused"] and not rep["error"]:
        raise Mismatch(f"{where}: refused without a reason {rep!r}")


def _refused(call: Any, what: str) -> None:
    """``call()`` must raise ValueError or OverflowError: ``what`` is out of range."""
    try:
        call()
    except (ValueError, OverflowError):
        return
    raise Mismatch(f"accepted {what}")


def _bad_arguments(mod: ModuleType, data: bytes, frame: np.ndarray,
                   rng: np.random.Generator) -> None:
    """Out-of-range arguments to ``decode`` and ``pack``, drawn at random."""
    bad = int(HUGE[int(rng.integers(len(HUGE)))])
    small = np.empty(48, np.uint8)
    x = int(rng.integers(0, 8))
    _refused(lambda: mod.decode(data, frame, 3, 0, 0, 1, 1), "scale 3")
    _refused(lambda: mod.decode(data, frame, 1, bad, 0, 4, 4), f"decode x0={bad}")
    _refused(lambda: mod.decode(data, frame, 1, x, x, x, x + 1), "an empty decode region")
    _refused(lambda: mod.decode(data, frame, 1, 0, 0, 2**40, 1), "decode x1=2**40")
    _refused(lambda: mod.pack(small, 4, -1, 0, 2, 1, small[:6], False, False),
             "pack with left=-1, width=2")
    _refused(lambda: mod.pack(small, 4, 0, bad, 1, 1, small[:3], False, True),
             f"pack y0={bad}")
    _refused(lambda: mod.pack(small, 4, 3, 0, 2, 1, small[:6], False, False),
             "a pack box past the right edge")
    _refused(lambda: mod.pack(small, 2**62, 0, 0, 1, 1, small[:3], True, False),
             "a pack source 2**62 pixels wide")
    _refused(lambda: mod.pack(small, 4, 0, 2, 4, 2, small[:24], False, False),
             "a pack box past the last row")
    _refused(lambda: mod.pack(small, 4, 0, 0, 2, 2, small[:6], False, False),
             "a pack output of the wrong size")


def _pillow(data: bytes, request: tuple[int, int]) -> np.ndarray | str:
    """Pillow's full decode drafted to ``request``, as RGB, or why Pillow refused."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format != "JPEG":
                return f"Pillow reads it as {img.format}"
            img.draft("RGB", request)
            return np.asarray(img.convert("RGB"))
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        return f"{type(e).__name__}: {e}"


def _pack_matches(mod: ModuleType, rgbx: np.ndarray, rng: np.random.Generator,
                  box: tuple[int, int, int, int]) -> None:
    """A random box inside ``box`` of the frame packed, against numpy's slicing."""
    x0, y0, x1, y1 = box
    a, b = sorted(int(v) for v in rng.integers(x0, x1 + 1, 2))
    c, d = sorted(int(v) for v in rng.integers(y0, y1 + 1, 2))
    if a == b or c == d:
        return
    flip, planar = bool(rng.integers(2)), bool(rng.integers(2))
    want = rgbx[c:d, a:b, :3][:, ::-1] if flip else rgbx[c:d, a:b, :3]
    want = want.transpose(2, 0, 1) if planar else want
    out = np.empty(want.shape, np.uint8)
    mod.pack(rgbx.reshape(-1), rgbx.shape[1], a, c, b - a, d - c, out, flip, planar)
    if not np.array_equal(out, want):
        raise Mismatch(f"pack of {(a, c, b, d)} (flip={flip}, planar={planar}) differs")
    # a copy: Pillow's own Arrow export of an image mapped over a buffer (frombuffer)
    # crashes in Pillow, before any of our code runs
    img = Image.frombuffer("RGBX", (rgbx.shape[1], rgbx.shape[0]), rgbx.tobytes(), "raw",
                           "RGBX", 0, 1).copy()
    mod.pack(img.im.__arrow_c_array__(), rgbx.shape[1], a, c, b - a, d - c, out, flip, planar)
    if not np.array_equal(out, want):
        raise Mismatch(f"pack of {(a, c, b, d)} from Pillow's Arrow export differs")


def jpegcrop_target(mod: ModuleType, cpu_limit: float = CPU_LIMIT) -> Target:
    """The target over ``mod`` (the extension, however it was built); each call bounded to
    ``cpu_limit`` seconds of CPU."""
    frame = np.empty(FRAME_PIXELS * 4, np.uint8)

    def target(data: bytes, rng: np.random.Generator) -> str:
        w, h, code, none = bounded(cpu_limit, "probe", lambda: mod.probe(data))
        if none is not None:
            raise Mismatch(f"probe without its check gave a report: {none!r}")
        refused = ""
        if w * h <= CHECK_PIXELS or w * h > CAPPED_PIXELS:
            w2, h2, _, rep = bounded(cpu_limit, "probe's check", lambda: mod.probe(data, True))
            if (w2, h2) != (w, h):
                raise Mismatch(f"probe and its check disagree: {(w, h)} vs {(w2, h2)}")
            _check_report(rep, len(data), "probe")
            refused = rep["error"] if rep["refused"] else ""
        _bad_arguments(mod, data, frame, rng)
        if code != 0:
            return f"declined:{CODES.get(code, code)}"
        asked = int(2 ** rng.integers(0, 4))
        request = (max(1, w // asked), max(1, h // asked))
        ratio = min(w // request[0], h // request[1])
        scale = next(s for s in (8, 4, 2, 1) if ratio >= s)  # the one Pillow's draft picks
        sw, sh = -(-w // scale), -(-h // scale)
        if sw * sh > FRAME_PIXELS:
            return "declined:too-large"
        x0, y0 = int(rng.integers(0, sw)), int(rng.integers(0, sh))
        x1, y1 = int(rng.integers(x0 + 1, sw + 1)), int(rng.integers(y0 + 1, sh + 1))
        whole = rng.random() < 0.75
        buf = frame[:sw * sh * 4]
        try:
            left, top, right, bottom, got = bounded(
                cpu_limit, f"decode at 1/{scale}",
                lambda: mod.decode(data, buf, scale, x0, y0, x1, y1, whole))
        except ValueError as e:
            if refused and refused not in str(e):
                raise Mismatch(f"decode's refusal ({e}) is not the check's ({refused})") from e
            return "declined:refused" if refused else "declined:decode-error"
        if refused:  # one scan (code 0): every decode holds it to the same budget
            raise Mismatch(f"decoded an image that probe's check refuses ({refused})")
        _check_report(got, len(data), "decode")
        if not (left <= x0 and top == y0 and right >= x1 and bottom == y1):
            raise Mismatch(f"decoded {(left, top, right, bottom)}, asked {(x0, y0, x1, y1)}")
        if got["warnings"]:
            return "decoded:warned"
        full = _pillow(data, request)
        if isinstance(full, str):
            if whole and not (got["eof"] or got["hit_marker"] or got["padding"]):
                raise Mismatch(f"a clean whole read that Pillow refuses: {full}")
            return "decoded:pillow-refused"
        if full.shape[:2] != (sh, sw):
            raise Mismatch(f"Pillow's draft gave {full.shape[:2]}, the extension {(sh, sw)}")
        rgbx = buf.reshape(sh, sw, 4)
        if not np.array_equal(rgbx[y0:y1, x0:x1, :3], full[y0:y1, x0:x1]):
            raise Mismatch(f"region {(x0, y0, x1, y1)} at 1/{scale} differs from Pillow's")
        _pack_matches(mod, rgbx, rng, (x0, y0, x1, y1))
        return "decoded"

    return target
