"""The fuzz target of stored pixels' C calls (``raw_record`` and ``raw_sample`` in
``_jpegcrop``): a record made of every input where it makes one, kept or damaged, and carried
to a batch row with random geometry, its promises checked.

- ``raw_record`` of every input, asked for YUV 4:2:0 and for RGB24, answers a well-formed
  tuple: done with a record whose header ``imgprep.rawformat.read_header`` reads whole, of
  the size the probe reads and the mode asked for (RGB24 where the JPEG is not YCbCr 4:2:0:
  then the bytes of the RGB24 record), or failed or refused (the per-image budget, the pixel
  limit) with a message; never a crash.
- Where no record is made, one is forged from the input's bytes (a random small size and
  mode, the bytes as its pixels), so that ``raw_sample`` meets every input.
- The record is kept, or damaged (a byte of its magic, version, mode, reserved field, width
  or height rewritten, the two sides swapped, cut short, padded, emptied), and handed to
  ``raw_sample`` in a buffer of exactly its bytes (where the sanitizer sees a read past
  them), with a geometry drawn as the loader's transforms draw it for the size the header
  declares (``loaders.transforms``' train and val draws, mirrored here without importing
  the loaders and their frameworks; a test holds the two equal). The C parser agrees with
  ``read_header``: what that refuses is refused (failed, or ValueError, with a message, the
  output untouched); what it reads is sampled.
- A sample done twice gives the same row (the second into a buffer filled otherwise, so
  every byte is written), and the portable resampler's too; for an undamaged record of a
  JPEG, the row is the JPEG path's (``sample`` at DCT scale 1, whole), YUV and RGB alike;
  a YUV record's (a forged one's too) is the row of the RGB24 record of its pixels as
  libjpeg-turbo converts them (``yuv_as_rgb``, numpy; a test holds it to libjpeg-turbo).
- Geometry outside the record (a box past its edge, a crop outside the image cropped, an
  output buffer a byte short or long, the size of another image, a box without a resize)
  raises ValueError with the output untouched.
- No call takes more than ``cpu_limit`` seconds of CPU (``harness.fuzz.target.bounded``).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np

from harness.fuzz.target import CPU_LIMIT, Mismatch, Target, bounded
from imgprep.rawformat import BY_CODE, BY_NAME, HEADER, MAGIC, VERSION, read_header, record_size

MAX_PIXELS = 1 << 22
SIZES = (1, 7, 24, 64, 224)
FILL = 0x5A  # what the output holds before a call: a call that writes nothing leaves it
Geometry = tuple[tuple[int, int] | None, tuple[float, float, float, float] | None,
                 tuple[int, int, int, int], bool]  # resize, box, crop, flip


def train_geometry(w: int, h: int, size: int, low: float,
                   rng: np.random.Generator) -> Geometry:
    """``TrainTransform(size=size, scale=(low, 1.0)).geometry(w, h, rng)``'s draws: a
    random-resized-crop box (ratio 3/4..4/3, ten tries, then the centre), then the flip."""
    box = None
    for _ in range(10):
        target = w * h * rng.uniform(low, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            box = (left, top, left + cw, top + ch)
            break
    if box is None:
        ratio = w / h
        cw, ch = (w, round(w / (3 / 4))) if ratio < 3 / 4 else \
            (round(h * (4 / 3)), h) if ratio > 4 / 3 else (w, h)
        box = ((w - cw) // 2, (h - ch) // 2, (w - cw) // 2 + cw, (h - ch) // 2 + ch)
    flip = bool(rng.random() < 0.5)
    x0, y0, x1, y1 = (float(v) for v in box)
    return (size, size), (x0, y0, x1, y1), (0, 0, size, size), flip


def val_geometry(w: int, h: int, size: int, resize: int) -> Geometry:
    """``ValTransform(size=size, resize=resize).geometry(w, h, rng)``: the centre crop, of
    the image itself where its short side is ``resize``, else of the image resampled."""
    if min(w, h) == resize:
        left, top = (w - size) // 2, (h - size) // 2
        return None, None, (left, top, left + size, top + size), False
    s = resize / min(w, h)
    nw, nh = max(size, round(w * s)), max(size, round(h * s))
    left, top = (nw - size) // 2, (nh - size) // 2
    return (nw, nh), None, (left, top, left + size, top + size), False


def draw_geometry(w: int, h: int, rng: np.random.Generator) -> Geometry:
    """A train draw at a random size and scale, or a val one (its short side resized, or
    kept where it is ``resize`` already)."""
    size = int(rng.choice(SIZES))
    if rng.random() < 0.6:
        return train_geometry(w, h, size, float(rng.choice((0.08, 0.5, 1.0))), rng)
    if size <= min(w, h) and rng.random() < 0.3:
        return val_geometry(w, h, size, min(w, h))
    return val_geometry(w, h, size, int(rng.integers(size, 3 * size + 1)))


def _made(mod: ModuleType, data: bytes, mode: int, cpu_limit: float) -> bytes | None:
    """``raw_record`` of ``data`` as ``mode``: the record, or None (failed or refused)."""
    r = bounded(cpu_limit, f"raw_record mode {mode}",
                lambda: mod.raw_record(data, mode, MAX_PIXELS))
    if not isinstance(r, tuple) or len(r) != 6:
        raise Mismatch(f"raw_record: malformed answer {r!r:.200}")
    status, message, record, made, w, h = r
    if status != mod.SAMPLE_DONE:
        if status not in (mod.SAMPLE_FAILED, mod.SAMPLE_REFUSED) or record is not None or \
                not (isinstance(message, str) and message):
            raise Mismatch(f"raw_record mode {mode}: status {status} with {message!r}, "
                           f"record {type(record).__name__}")
        return None
    try:
        head = read_header(record)
    except ValueError as e:
        raise Mismatch(f"raw_record mode {mode} made a record read_header refuses: {e}") from e
    pw, ph = bounded(cpu_limit, "probe", lambda: mod.probe(data))[:2]
    if head.kind.code != made or (head.width, head.height) != (w, h) or (w, h) != (pw, ph) or \
            (made != mode and made != mod.RAW_RGB24):
        raise Mismatch(f"raw_record mode {mode}: made mode {made} {w}x{h}, its header "
                       f"{head}, the probe {pw}x{ph}")
    return bytes(record)


def _forged(mod: ModuleType, data: bytes, rng: np.random.Generator) -> bytes:
    """A record of a random small size and mode whose pixels are ``data``'s bytes."""
    w, h = (int(v) for v in rng.choice((1, 2, 3, 5, 16, 33, 64), 2))
    mode = int(rng.choice((mod.RAW_RGB24, mod.RAW_YUV420)))
    need = record_size(BY_CODE[mode], w, h) - HEADER.size
    start = int(rng.integers(len(data))) if data else 0
    pixels = (data[start:] + data[:start] or b"\x80") * (need // max(1, len(data)) + 1)
    return HEADER.pack(MAGIC, VERSION, mode, 0, w, h) + pixels[:need]


def _damaged(record: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    """``record`` broken one way, and how."""
    b = bytearray(record)
    how = str(rng.choice(("magic", "version", "mode", "reserved", "width", "height", "swap",
                          "cut", "pad", "empty")))
    at = {"magic": int(rng.integers(4)), "version": 4, "mode": 5,
          "reserved": 6 + int(rng.integers(2)), "width": 8 + int(rng.integers(4)),
          "height": 12 + int(rng.integers(4))}
    if how in at:
        old = b[at[how]]
        b[at[how]] = int(rng.choice((old ^ 1, old ^ 0x80, 0, 255, 1, 2, 3)))
    elif how == "swap":
        b[8:16] = b[12:16] + b[8:12]
    elif how == "cut":
        b = b[:int(rng.integers(len(b)))]
    elif how == "pad":
        b += bytes(int(rng.choice((1, 2, 3, 16, 1000))))
    else:
        b = bytearray()
    return how, bytes(b)


def yuv_as_rgb(record: bytes) -> bytes:
    """The RGB24 record of a YUV 4:2:0 record's pixels by libjpeg-turbo's arithmetic, in
    numpy: h2v2 fancy upsampling (chroma 2 columns wide or less replicated), jdcolor.c's
    conversion; what ``raw_sample`` reads the YUV record as."""
    head = read_header(record)
    w, h = head.width, head.height
    cw, ch = (w + 1) // 2, (h + 1) // 2
    px = np.frombuffer(record, np.uint8, offset=HEADER.size).astype(np.int64)
    planes = []
    for start in (w * h, w * h + cw * ch):
        c = px[start:start + cw * ch].reshape(ch, cw)
        if cw <= 2:
            up = c.repeat(2, 0).repeat(2, 1)
        else:
            near = np.arange(2 * ch) // 2
            far = np.where(np.arange(2 * ch) % 2, np.minimum(near + 1, ch - 1),
                           np.maximum(near - 1, 0))
            s = 3 * c[near] + c[far]
            up = np.empty((2 * ch, 2 * cw), np.int64)
            up[:, 0::2] = (3 * s + np.concatenate([s[:, :1], s[:, :-1]], 1) + 8) >> 4
            up[:, 1::2] = (3 * s + np.concatenate([s[:, 1:], s[:, -1:]], 1) + 7) >> 4
        planes.append(up[:h, :w] - 128)
    y, (b, r) = px[:w * h].reshape(h, w), planes
    rgb = np.stack([y + ((91881 * r + 32768) >> 16),
                    y + ((32768 - 22554 * b - 46802 * r) >> 16),
                    y + ((116130 * b + 32768) >> 16)], -1)
    pixels = np.clip(rgb, 0, 255).astype(np.uint8).tobytes()
    return HEADER.pack(MAGIC, VERSION, BY_NAME["rgb"].code, 0, w, h) + pixels


def _buffer(data: bytes) -> np.ndarray:
    """``data`` in an allocation of exactly its size (numpy's own, not Python's pools), so
    that the sanitizer reports any read past its end."""
    return np.frombuffer(data, np.uint8).copy() if data else np.empty(0, np.uint8)


def _sample(mod: ModuleType, record: np.ndarray, w: int, h: int, g: Geometry, planar: bool,
            cpu_limit: float, kernel: int = -1, fill: int = FILL) -> tuple[Any, np.ndarray]:
    """``raw_sample`` of ``record`` as ``g`` says into a buffer of ``fill``: its answer,
    checked for form, and the buffer (untouched unless done)."""
    resize, box, crop, flip = g
    out = np.full((crop[2] - crop[0]) * (crop[3] - crop[1]) * 3, fill, np.uint8)
    where = f"raw_sample {w}x{h} {g} planar={planar} kernel={kernel}"
    r = bounded(cpu_limit, where, lambda: mod.raw_sample(
        record, w, h, resize or (0, 0), box, crop, flip, planar, MAX_PIXELS, out, kernel))
    if not isinstance(r, tuple) or len(r) != 4 or r[0] not in (mod.SAMPLE_DONE,
                                                               mod.SAMPLE_FAILED):
        raise Mismatch(f"{where}: malformed answer {r!r:.200}")
    if r[0] != mod.SAMPLE_DONE and (not (isinstance(r[2], str) and r[2]) or
                                    np.any(out != fill)):
        raise Mismatch(f"{where}: failed without a message, or wrote its output: {r[2]!r}")
    return r, out


def _jpeg_row(mod: ModuleType, data: bytes, w: int, h: int, g: Geometry, planar: bool,
              cpu_limit: float) -> np.ndarray:
    """The JPEG path's row for ``g`` at DCT scale 1 (no draft), the whole image decoded."""
    resize, box, crop, flip = g
    out = np.empty((crop[2] - crop[0]) * (crop[3] - crop[1]) * 3, np.uint8)
    r = bounded(cpu_limit, f"sample {g} at scale 1", lambda: mod.sample(
        data, w, h, (0, 0), resize or (0, 0), box, crop, flip, planar, True, MAX_PIXELS, out))
    if r[0] != mod.SAMPLE_DONE:
        raise Mismatch(f"sample {g} at scale 1 of a JPEG raw_record stores: {r[2]}")
    return out


def _refusals(mod: ModuleType, record: np.ndarray, w: int, h: int, planar: bool) -> None:
    """Geometry that does not fit the record raises ValueError, the output untouched."""
    n, whole = 8 * 8 * 3, (0, 0, 8, 8)
    bad: list[tuple[Any, Any, tuple[int, int, int, int], int, int, int, str]] = [
        ((8, 8), (0.0, 0.0, w + 1.0, float(h)), whole, n, w, h, "a box past the edge"),
        ((8, 8), (0.0, 0.0, float(w), math.nan), whole, n, w, h, "a box of NaN"),
        ((8, 8), None, (0, 0, 9, 8), n, w, h, "a crop outside the resampled image"),
        ((8, 8), None, (3, 0, 3, 8), 0, w, h, "an empty crop"),
        ((8, 8), None, whole, n - 1, w, h, "an output a byte short"),
        ((8, 8), None, whole, n + 1, w, h, "an output a byte long"),
        ((-8, 8), None, whole, n, w, h, "a negative size"),
        ((0, 0), None, (0, 0, w + 1, h), (w + 1) * h * 3, w, h, "a crop past the image"),
        ((0, 0), (0.0, 0.0, 1.0, 1.0), (0, 0, 1, 1), 3, w, h, "a box without a resize"),
        ((8, 8), None, (2**62, 0, 2**62 + 8, 8), n, w, h, "a crop 2**62 to the right"),
        ((8, 8), None, (-(2**63), 0, 8, 8), n, w, h, "a crop from -2**63"),
        ((0, 0), None, (0, 2**62, 1, 2**62 + 1), 3, w, h, "a crop 2**62 down, not resampled"),
        ((8, 8), None, whole, n, w + 1, h, "the geometry of a wider image"),
        ((8, 8), None, whole, n, w, h + 1, "the geometry of a taller image"),
    ]
    for resize, box, crop, size, gw, gh, what in bad:
        out = np.full(size, FILL, np.uint8)
        try:
            mod.raw_sample(record, gw, gh, resize, box, crop, False, planar, MAX_PIXELS, out)
        except (ValueError, OverflowError) as e:
            if not str(e) or np.any(out != FILL):
                raise Mismatch(f"raw_sample refused {what} ({w}x{h}) without a message, or "
                               "after writing its output") from e
            continue
        raise Mismatch(f"raw_sample accepted {what} ({w}x{h})")


def _records(mod: ModuleType, data: bytes, cpu_limit: float) -> list[bytes]:
    """The records ``raw_record`` makes of ``data``: YUV 4:2:0 (where the JPEG is) and RGB24."""
    yuv = _made(mod, data, mod.RAW_YUV420, cpu_limit)
    rgb = _made(mod, data, mod.RAW_RGB24, cpu_limit)
    if yuv is not None and rgb is not None and yuv[5] == mod.RAW_RGB24 and yuv != rgb:
        raise Mismatch("raw_record stored a JPEG asked for as YUV 4:2:0 as RGB24, not as the "
                       "RGB24 record of it")
    return list(dict.fromkeys(r for r in (yuv, rgb) if r is not None))


def _alike(mod: ModuleType, record: bytes, g: Geometry, planar: bool, row: np.ndarray,
           portable: bool, what: str, cpu_limit: float) -> None:
    """``row``, ``record``'s sample as ``g`` says, is a second call's, the RGB24 record's of
    its pixels where it is YUV, and (``portable``) the portable resampler's."""
    head, buf = read_header(record), _buffer(record)
    w, h = head.width, head.height
    where = f"raw_sample of {what} {w}x{h} {g} planar={planar}"
    if not np.array_equal(row, _sample(mod, buf, w, h, g, planar, cpu_limit,
                                       fill=255 - FILL)[1]):
        raise Mismatch(f"{where}: two calls differ")
    if head.kind.name == "yuv420" and not np.array_equal(row, _sample(
            mod, _buffer(yuv_as_rgb(record)), w, h, g, planar, cpu_limit)[1]):
        raise Mismatch(f"{where}: not the row of the RGB24 record of its pixels "
                       "(libjpeg-turbo's arithmetic)")
    if portable and not np.array_equal(
            row, _sample(mod, buf, w, h, g, planar, cpu_limit, kernel=0)[1]):
        raise Mismatch(f"{where}: the portable resampler's row differs")


def raw_target(mod: ModuleType, cpu_limit: float = CPU_LIMIT) -> Target:
    """The target over ``mod`` (the extension, however it was built); each call bounded to
    ``cpu_limit`` seconds of CPU."""
    fast = mod.resample_kernel(-1) != "portable"

    def target(data: bytes, rng: np.random.Generator) -> str:
        made = _records(mod, data, cpu_limit)
        record = made[int(rng.integers(len(made)))] if made else _forged(mod, data, rng)
        source = "forged" if not made else BY_CODE[record[5]].ext
        head = read_header(record)
        how, given = _damaged(record, rng) if rng.random() < 0.4 else ("", record)
        try:
            head = read_header(given)
            readable = True
        except ValueError:
            readable = False
        w, h, planar = head.width, head.height, bool(rng.integers(2))
        g = draw_geometry(w, h, rng)
        buf = _buffer(given)
        fate = f"damaged-{how}" if how else "kept"
        try:
            r, row = _sample(mod, buf, w, h, g, planar, cpu_limit)
        except ValueError as e:
            if readable or not str(e):
                raise Mismatch(f"raw_sample of a {fate} record {w}x{h}, geometry {g}: {e}") \
                    from e
            return f"raw:{source}:damaged-refused"
        if (r[0] == mod.SAMPLE_DONE) != readable:
            raise Mismatch(f"raw_sample of a {fate} record read_header "
                           f"{'reads' if readable else 'refuses'}: {r[2]!r}")
        if not readable:
            return f"raw:{source}:damaged-refused"
        portable = fast and rng.random() < 0.3
        _alike(mod, given, g, planar, row, portable, f"a {fate} record", cpu_limit)
        if made and not how and not np.array_equal(
                row, _jpeg_row(mod, data, w, h, g, planar, cpu_limit)):
            raise Mismatch(f"raw_sample of the {source} record {w}x{h} {g} planar={planar}: "
                           "not the JPEG path's row at scale 1")
        if rng.random() < 0.15:
            _refusals(mod, buf, w, h, planar)
        return f"raw:{source}:{'damaged-' if how else ''}sampled"

    return target
