"""Ways a JPEG breaks, each a function ``(data, rng, others) -> bytes``: cut short, padded
as a preallocated file written halfway, trailing data, bit flips, interesting bytes,
marker segments shuffled, dropped or repeated, huge or zero dimensions in the frame header,
bad Huffman and quantisation tables, nonsense scan parameters, sampling factors and restart
intervals, stray markers in the entropy-coded data, and splices of two files. Every
mutator is deterministic in ``rng``, so an input is reproduced from the seed alone.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

import numpy as np

Mutator = Callable[[bytes, np.random.Generator, Sequence[bytes]], bytes]
SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
INTERESTING = (0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF)


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


def huge_dimensions(data: bytes, rng: np.random.Generator, _: Sequence[bytes]) -> bytes:
    """The frame header's height and width set to huge, zero or odd values."""
    start, end = _payload(data, rng, SOF_MARKERS)
    if end - start < 5:
        return data
    choices = (0, 1, 65535, 65500, 32768, int(rng.integers(1, 65536)))
    h, w = (choices[int(rng.integers(len(choices)))] for _ in range(2))
    out = bytearray(data)
    out[start + 1:start + 5] = struct.pack(">HH", h, w)
    return bytes(out)


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
    "huge-dimensions": huge_dimensions,
    "bad-tables": bad_tables,
    "frame-and-scan-fields": frame_and_scan_fields,
    "stray-marker": stray_marker,
    "splice": splice,
}


def mutate(data: bytes, rng: np.random.Generator, others: Sequence[bytes]
           ) -> tuple[str, bytes]:
    """One to three mutations of ``data`` in a row; their names joined by ``+``."""
    names = []
    for _ in range(int(rng.integers(1, 4))):
        name = list(MUTATORS)[int(rng.integers(len(MUTATORS)))]
        data = MUTATORS[name](data, rng, others) if data else data
        names.append(name)
    return "+".join(names), data
