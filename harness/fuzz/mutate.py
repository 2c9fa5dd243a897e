"""Ways a JPEG breaks, each a function ``(data, rng, others) -> bytes``: cut short, padded
as a preallocated file written halfway, trailing data, bit flips, interesting bytes,
marker segments shuffled, dropped or repeated, declared sizes (huge, zero, or just under
and just over what the per-image budget lets the file's bytes declare), bad Huffman and
quantisation tables, quantisation tables holding zeros, nonsense scan parameters and
restart intervals, sampling factors (legal combinations, and values out of range), scans
repeated up to thousands of times or dropped, stray markers in the entropy-coded data, and
splices of two files. Every mutator is deterministic in ``rng``, so an input is reproduced
from the seed alone; ``mutate`` draws them by ``WEIGHTS``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import struct
from collections.abc import Callable, Sequence

import numpy as np

from imgprep.budget import LIMITS

Mutator = Callable[[bytes, np.random.Generator, Sequence[bytes]], bytes]
SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
ARITHMETIC = {0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
INTERESTING = (0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF)
FACTORS = (0, 1, 1, 2, 2, 3, 4, 4, 5, 15)  # a sampling factor: legal ones (1..4) most often
MAX_BYTES = 1 << 18  # what repeating scans may grow an input to
MOST_REPEATS = 3000
_NEXT_MARKER = re.compile(rb"\xff+[^\x00\xd0-\xd7\xff]")  # past entropy-coded data


def legal_samplings() -> list[tuple[int, ...]]:
    """Every (h, v) of Y, Cb and Cr that libjpeg decodes: factors 1..4, at most 10 blocks an
    MCU, the largest factors a whole multiple of each (311 combinations)."""
    out = []
    for f in itertools.product(range(1, 5), repeat=6):
        hs, vs = f[0::2], f[1::2]
        if sum(h * v for h, v in zip(hs, vs, strict=True)) <= 10 and all(
                max(hs) % h == 0 and max(vs) % v == 0 for h, v in zip(hs, vs, strict=True)):
            out.append(f)
    return out


LEGAL_SAMPLINGS = legal_samplings()


def segments(data: bytes) -> list[tuple[int, int, int]]:
    """The marker segments from SOI up to and including SOS: (marker, start, end) with
    ``data[start:end]`` the whole segment (marker and length included)."""
    out: list[tuple[int, int, int]] = []
    i = 2
    while i + 4 <= len(data) and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        length = struct.unpack(">H", data[i + 2:i + 4])[0]
        out.append((marker, i, min(len(data), i + 2 + length)))
        if marker == 0xDA:
            break
        i += 2 + length
    return out


def _scan_start(data: bytes) -> int:
    """Where the entropy-coded data begins (the end of the headers)."""
    segs = segments(data)
    return segs[-1][2] if segs and segs[-1][0] == 0xDA else len(data) // 2


def _payload(data: bytes, rng: np.random.Generator, markers: set[int]) -> tuple[int, int]:
    """The payload range (after marker and length) of a random segment among ``markers``,
    or (0, 0) when there is none."""
    found = [(s + 4, e) for m, s, e in segments(data) if m in markers and e > s + 4]
    return found[int(rng.integers(len(found)))] if found else (0, 0)


def scans(data: bytes) -> list[tuple[int, int]]:
    """Each scan as (start, end): its SOS segment and its entropy-coded data, up to the next
    marker that is not a restart marker."""
    out: list[tuple[int, int]] = []
    i = 2
    while i + 4 <= len(data) and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF or 0xD0 <= marker <= 0xD7:  # fill byte, stray restart marker
            i += 1 if marker == 0xFF else 2
            continue
        if marker == 0xD9:
            break
        end = i + 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
        if marker == 0xDA:
            found = _NEXT_MARKER.search(data, end)
            end = found.start() if found else len(data)
            out.append((i, end))
        i = end
    return out


def _frame(data: bytes) -> tuple[int, int, list[int]] | None:
    """The first frame header: its marker, where its payload starts, and where each
    component's sampling byte is."""
    for marker, s, e in segments(data):
        if marker in SOF_MARKERS and e - s >= 10:
            n = data[s + 9]
            return marker, s + 4, [s + 11 + 3 * i for i in range(n) if s + 11 + 3 * i < e]
    return None


def _blocks(width: int, height: int, factors: Sequence[tuple[int, int]]) -> int:
    """The 8x8 blocks a frame of ``width`` x ``height`` declares (libjpeg's count)."""
    hmax = max((h for h, _v in factors), default=1) or 1
    vmax = max((v for _h, v in factors), default=1) or 1
    return sum(-(-width * h // (hmax * 8)) * -(-height * v // (vmax * 8)) for h, v in factors)


def _largest(blocks: Callable[[int], int], most: int) -> int:
    """The largest side in 0..65535 whose ``blocks`` are at most ``most``."""
    lo, hi = 0, 65535
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if blocks(mid) <= most else (lo, mid - 1)
    return lo


def truncate(data: bytes, rng: np.random.Generator, _: Sequence[bytes]) -> bytes:
    return data[:int(rng.integers(0, len(data)))]


def zero_padded(data: bytes, rng: np.random.Generator, _: Sequence[bytes]) -> bytes:
    """The first part of the file, then zeros: a preallocated file written only in part."""
    cut = int(rng.integers(len(data) // 4, len(data)))
    return data[:cut] + bytes(int(rng.integers(1, 4 * len(data))))


def trailing(data: bytes, rng: np.random.Generator, _: Sequence[bytes]) -> bytes:
    junk = rng.integers(0, 256, int(rng.integers(1, 2 * len(data))), dtype=np.uint8)
    return data + (bytes(len(junk)) if rng.random() < 0.5 else junk.tobytes())


def bit_flips(data: bytes, rng: np.random.Generator, _: Sequence[bytes]) -> bytes:
    out = bytearray(data)
    for _i in range(int(rng.integers(1, 9))):
        i = int(rng.integers(len(out)))
        out[i] ^= 1 << int(rng.integers(8))
    return bytes(out)


def interesting_bytes(data: bytes, rng: np.random.Generator, _: Sequence[bytes]) -> bytes:
    out = bytearray(data)
    for _i in range(int(rng.integers(1, 5))):
        out[int(rng.integers(len(out)))] = INTERESTING[int(rng.integers(len(INTERESTING)))]
    return bytes(out)


def shuffle_segments(data: bytes, rng: np.random.Generator, _: Sequence[bytes]) -> bytes:
    """The header segments before SOS shuffled, one dropped or one repeated."""
    segs = segments(data)
    if len(segs) < 3:
        return data
    head = [data[s:e] for _m, s, e in segs[:-1]]
    kind = int(rng.integers(3))
    if kind == 0:
        head = [head[i] for i in rng.permutation(len(head))]
    elif kind == 1:
        del head[int(rng.integers(len(head)))]
    else:
        head.insert(int(rng.integers(len(head) + 1)), head[int(rng.integers(len(head)))])
    sos_start = segs[-1][1]
    return data[:2] + b"".join(head) + data[sos_start:]


def _at_budget(data: bytes, frame: tuple[int, int, list[int]], rng: np.random.Generator
               ) -> tuple[int, int]:
    """A height and width whose blocks are just within the budget's bytes rule for ``data``
    (8 blocks a byte, 512 when arithmetic-coded), or just past it; one side kept or drawn,
    the other found."""
    marker, start, at = frame
    per_byte = LIMITS.arith_blocks_per_byte if marker in ARITHMETIC else LIMITS.blocks_per_byte
    most = per_byte * len(data)
    factors = [(data[i] >> 4, data[i] & 15) for i in at]
    height, width = struct.unpack(">HH", data[start + 1:start + 5])
    if rng.random() < 0.5:
        width = int(math.exp(rng.uniform(0, math.log(65535))))
    height = _largest(lambda h: _blocks(width, h, factors), most)
    if height == 0:  # too wide for even one row
        height, width = 1, _largest(lambda w: _blocks(w, 1, factors), most)
    if rng.random() < 0.5:  # just past it
        if height < 65535:
            height += 1
        else:
            width = min(65535, width + 1)
    return height, width


def declared_size(data: bytes, rng: np.random.Generator, _: Sequence[bytes]) -> bytes:
    """The frame header's height and width set to huge, zero or odd values, or to a size
    just within or just past what the budget lets the file's bytes declare."""
    frame = _frame(data)
    if frame is None:
        return data
    start = frame[1]
    if rng.random() < 0.5:
        h, w = _at_budget(data, frame, rng)
    else:
        choices = (0, 1, 65535, 65500, 32768, int(rng.integers(1, 65536)))
        h, w = (choices[int(rng.integers(len(choices)))] for _ in range(2))
    out = bytearray(data)
    out[start + 1:start + 5] = struct.pack(">HH", h, w)
    return bytes(out)


def zero_quant(data: bytes, rng: np.random.Generator, _: Sequence[bytes]) -> bytes:
    """Entries of a quantisation table set to 0 (illegal; the budget refuses a table a
    component uses that holds one): the DC entry, a run, or all 64."""
    start, end = _payload(data, rng, {0xDB})
    tables, i = [], start
    while i < end:
        size = 2 if data[i] >> 4 else 1
        tables.append((i + 1, size))
        i += 1 + 64 * size
    if not tables:
        return data
    first, size = tables[int(rng.integers(len(tables)))]
    kind = int(rng.integers(3))
    a = int(rng.integers(64)) if kind == 1 else 0
    b = 1 if kind == 0 else 64 if kind == 2 else int(rng.integers(a + 1, 65))
    out = bytearray(data)
    for k in range(a, b):
        at = first + k * size
        if at + size <= end:
            out[at:at + size] = bytes(size)
    return bytes(out)


def sampling_factors(data: bytes, rng: np.random.Generator, _: Sequence[bytes]) -> bytes:
    """The frame header's sampling factors rewritten (the entropy-coded data then no longer
    matches them): one factor of one component to any value (0 and past 4 too), every
    component to a legal combination, or every factor drawn from 1..4."""
    frame = _frame(data)
    if frame is None or not frame[2]:
        return data
    at, out = frame[2], bytearray(data)
    kind = int(rng.integers(3))
    if kind == 0:
        i, v = at[int(rng.integers(len(at)))], FACTORS[int(rng.integers(len(FACTORS)))]
        out[i] = v << 4 | out[i] & 15 if rng.random() < 0.5 else out[i] & 0xF0 | v
    elif kind == 1:
        f = LEGAL_SAMPLINGS[int(rng.integers(len(LEGAL_SAMPLINGS)))]
        for c, i in enumerate(at[:3]):
            out[i] = f[2 * c] << 4 | f[2 * c + 1]
    else:
        for i in at:
            out[i] = int(rng.integers(1, 5)) << 4 | int(rng.integers(1, 5))
    return bytes(out)


def scan_counts(data: bytes, rng: np.random.Generator, _: Sequence[bytes]) -> bytes:
    """One scan repeated right after itself, up to ``MOST_REPEATS`` times (log-uniform; no
    input past ``MAX_BYTES``), or scans dropped."""
    found = scans(data)
    if not found:
        return data
    if rng.random() < 0.25:
        keep = rng.random(len(found)) < 0.5
        cut = [se for se, k in zip(found, keep, strict=True) if not k] or [found[0]]
        out, i = bytearray(), 0
        for s, e in cut:
            out += data[i:s]
            i = e
        return bytes(out + data[i:])
    s, e = found[int(rng.integers(len(found)))]
    n = int(math.exp(rng.uniform(0, math.log(MOST_REPEATS))))
    n = max(1, min(n, (MAX_BYTES - len(data)) // (e - s)))
    return data[:e] + data[s:e] * n + data[e:]


def bad_tables(data: bytes, rng: np.random.Generator, _: Sequence[bytes]) -> bytes:
    """Random bytes over part of a Huffman (DHT) or quantisation (DQT) table."""
    start, end = _payload(data, rng, {0xC4} if rng.random() < 0.7 else {0xDB})
    if end <= start:
        return data
    out = bytearray(data)
    i = int(rng.integers(start, end))
    n = int(rng.integers(1, min(17, end - i) + 1))
    out[i:i + n] = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    return bytes(out)


def frame_and_scan_fields(data: bytes, rng: np.random.Generator,
                          _: Sequence[bytes]) -> bytes:
    """A byte of the frame header (precision, component count, sampling factors, table
    numbers), the scan header (selectors, spectral range, approximation) or the restart
    interval set to a random value."""
    start, end = _payload(data, rng, SOF_MARKERS | {0xDA, 0xDD})
    if end <= start:
        return data
    out = bytearray(data)
    out[int(rng.integers(start, end))] = int(rng.integers(256))
    return bytes(out)


def stray_marker(data: bytes, rng: np.random.Generator, _: Sequence[bytes]) -> bytes:
    """A marker (RSTn, EOI, SOS, DHT, anything) inserted into the entropy-coded data."""
    scan = _scan_start(data)
    if scan >= len(data) - 2:
        return data
    i = int(rng.integers(scan, len(data) - 2))
    marker = int(rng.choice([0xD0 + int(rng.integers(8)), 0xD9, 0xDA, 0xC4,
                             int(rng.integers(0xC0, 0xFF))]))
    return data[:i] + bytes([0xFF, marker]) + data[i:]


def splice(data: bytes, rng: np.random.Generator, others: Sequence[bytes]) -> bytes:
    """This file's headers with another file's entropy-coded data (or the reverse cut)."""
    other = others[int(rng.integers(len(others)))] if others else data
    return data[:_scan_start(data)] + other[_scan_start(other):]


MUTATORS: dict[str, Mutator] = {
    "truncate": truncate,
    "zero-padded": zero_padded,
    "trailing": trailing,
    "bit-flips": bit_flips,
    "interesting-bytes": interesting_bytes,
    "shuffle-segments": shuffle_segments,
    "declared-size": declared_size,
    "bad-tables": bad_tables,
    "zero-quant": zero_quant,
    "frame-and-scan-fields": frame_and_scan_fields,
    "sampling-factors": sampling_factors,
    "scan-counts": scan_counts,
    "stray-marker": stray_marker,
    "splice": splice,
}
# how often each is drawn, against 1 for the rest: a size just within the budget decodes up
# to the targets' 4 megapixels, three times the cost of an average input
WEIGHTS: dict[str, float] = {"declared-size": 0.5}
_NAMES = list(MUTATORS)
_CUMULATIVE = list(itertools.accumulate(WEIGHTS.get(n, 1.0) for n in _NAMES))


def mutate(data: bytes, rng: np.random.Generator, others: Sequence[bytes]
           ) -> tuple[str, bytes]:
    """One to three mutations of ``data`` in a row, each drawn by ``WEIGHTS``; their names
    joined by ``+``."""
    names = []
    for _ in range(int(rng.integers(1, 4))):
        pick = bisect.bisect(_CUMULATIVE, rng.random() * _CUMULATIVE[-1])
        name = _NAMES[min(pick, len(_NAMES) - 1)]
        data = MUTATORS[name](data, rng, others) if data else data
        names.append(name)
    return "+".join(names), data
