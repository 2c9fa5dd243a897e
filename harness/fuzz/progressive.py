"""A progressive JPEG of as many scans as asked, written in Python (libjpeg's encoder, which
Pillow drives, writes its fixed script of about 10): the fuzz seeds that bring scan counts
near the budget's limit (``imgprep/csrc/budget.h``) with real, legal data.

The image is YCbCr 4:4:4 in one flat quantisation table; the scans are a DC scan of all
three components at point transform ``dc_bits``, then ``dc_bits`` DC refinement scans (one
bit each), then each component's AC coefficients in bands of ``band`` (spectral selection,
no successive approximation): ``1 + dc_bits + 3 * ceil(63 / band)`` scans, 190 at ``band``
1. The Huffman tables are fixed (every DC category 4 bits; end-of-band 1 bit, every other AC
symbol 9), so no statistics are gathered.
"""

from __future__ import annotations

import struct

import numpy as np
from PIL import Image

QUANT = 8  # every entry of the one quantisation table
_ZIGZAG = np.array([n for _s, _k, n in sorted(
    (x + y, y if (x + y) % 2 else -y, 8 * y + x) for y in range(8) for x in range(8))])
_U = np.arange(8)
_DCT = np.where(_U[:, None] == 0, np.sqrt(1 / 8), 0.5) * np.cos(
    (2 * _U[None, :] + 1) * _U[:, None] * np.pi / 16)  # orthonormal: JPEG's forward DCT
_AC_SYMBOLS = [0x00, 0xF0] + [r << 4 | s for r in range(16) for s in range(1, 11)]
_DC_CODES = {s: (s, 4) for s in range(12)}
_AC_CODES = {0x00: (0, 1), **{sym: (0x100 | i, 9) for i, sym in enumerate(_AC_SYMBOLS[1:])}}


def _segment(marker: int, payload: bytes) -> bytes:
    return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload


def _tables() -> bytes:
    """DQT (table 0) and DHT (DC table 0, AC table 0) for the codes above."""
    dqt = _segment(0xDB, bytes([0]) + bytes([QUANT] * 64))
    dc_bits = [0] * 16
    dc_bits[3] = 12
    ac_bits = [0] * 16
    ac_bits[0], ac_bits[8] = 1, len(_AC_SYMBOLS) - 1
    dht = _segment(0xC4, bytes([0x00, *dc_bits, *range(12)]) +
                   bytes([0x10, *ac_bits, *_AC_SYMBOLS]))
    return dqt + dht


class _Bits:
    """An entropy-coded segment: bits in, bytes out (1-padded, 0xFF stuffed)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def put(self, value: int, n: int) -> None:
        if n:
            self.parts.append(format(value, f"0{n}b"))

    def value(self, v: int) -> None:
        """A coefficient's category code's extra bits (its magnitude, ones' complement)."""
        s = abs(v).bit_length()
        self.put(v if v >= 0 else v + (1 << s) - 1, s)

    def bytes(self) -> bytes:
        bits = "".join(self.parts)
        bits += "1" * (-len(bits) % 8)
        raw = int(bits, 2).to_bytes(len(bits) // 8, "big") if bits else b""
        return raw.replace(b"\xff", b"\xff\x00")


def _coefficients(img: Image.Image) -> np.ndarray:
    """Quantised DCT coefficients of ``img`` in YCbCr, (component, block, zigzag index)."""
    w, h = img.size
    pw, ph = -(-w // 8) * 8, -(-h // 8) * 8
    px = np.asarray(img.convert("YCbCr"), np.float64)
    px = np.pad(px, ((0, ph - h), (0, pw - w), (0, 0)), mode="edge") - 128
    blocks = px.reshape(ph // 8, 8, pw // 8, 8, 3).transpose(4, 0, 2, 1, 3).reshape(3, -1, 8, 8)
    coef = np.einsum("ux,cbxy,vy->cbuv", _DCT, blocks, _DCT).reshape(3, -1, 64)
    return np.rint(coef[:, :, _ZIGZAG] / QUANT).astype(np.int64)


def _sos(components: list[int], ss: int, se: int, ah: int, al: int) -> bytes:
    sel = b"".join(bytes([c + 1, 0x00]) for c in components)
    return _segment(0xDA, bytes([len(components)]) + sel + bytes([ss, se, ah << 4 | al]))


def _dc_scans(coef: np.ndarray, dc_bits: int) -> bytes:
    first, pred = _Bits(), [0, 0, 0]
    for b in range(coef.shape[1]):
        for c in range(3):
            v = int(coef[c, b, 0]) >> dc_bits
            diff, pred[c] = v - pred[c], v
            first.put(*_DC_CODES[abs(diff).bit_length()])
            first.value(diff)
    out = _sos([0, 1, 2], 0, 0, 0, dc_bits) + first.bytes()
    for al in range(dc_bits - 1, -1, -1):
        refine = _Bits()
        for b in range(coef.shape[1]):
            for c in range(3):
                refine.put(int(coef[c, b, 0]) >> al & 1, 1)
        out += _sos([0, 1, 2], 0, 0, al + 1, al) + refine.bytes()
    return out


def _ac_scan(coef: np.ndarray, c: int, ss: int, se: int) -> bytes:
    bits = _Bits()
    for block in coef[c, :, ss:se + 1].tolist():
        run = 0
        for v in block:
            if v == 0:
                run += 1
                continue
            while run > 15:
                bits.put(*_AC_CODES[0xF0])
                run -= 16
            bits.put(*_AC_CODES[run << 4 | abs(v).bit_length()])
            bits.value(v)
            run = 0
        if run:
            bits.put(*_AC_CODES[0x00])  # end of band: a run of one block
    return _sos([c], ss, se, 0, 0) + bits.bytes()


def progressive(img: Image.Image, *, band: int, dc_bits: int) -> bytes:
    """``img`` as a progressive JPEG of ``1 + dc_bits + 3 * ceil(63 / band)`` scans."""
    if not (1 <= band <= 63 and 0 <= dc_bits <= 13):
        raise ValueError(f"band must be 1..63 and dc_bits 0..13, not {band} and {dc_bits}")
    coef = _coefficients(img.convert("RGB"))
    w, h = img.size
    sof = _segment(0xC2, struct.pack(">BHHB", 8, h, w, 3) +
                   b"".join(bytes([c + 1, 0x11, 0]) for c in range(3)))
    jfif = _segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
    scans = _dc_scans(coef, dc_bits) + b"".join(
        _ac_scan(coef, c, ss, min(ss + band - 1, 63)) for c in range(3)
        for ss in range(1, 64, band))
    return b"\xff\xd8" + jfif + _tables() + sof + scans + b"\xff\xd9"
