"""The per-image budget: what decoding one untrusted image may cost is set by the bytes it
holds, not by the size its header claims; anything over it is refused before the memory its
header asks for is allocated.

JPEG (every decode path: the extension's, and Pillow's after a check):

- bytes: a Huffman-coded image spends at least one bit on each 8x8 block of each component
  (every block has a DC code, one bit at the least), so a header declaring more blocks than
  ``BLOCKS_PER_BYTE`` (8) a byte of the file is cut short or forged; an arithmetic-coded one
  may pack ``ARITH_BLOCKS_PER_BYTE`` blocks a byte (a stated limit: adaptive coding has no
  such floor, but no photograph comes near it);
- time: at most ``MAX_SCANS`` scans (libjpeg-turbo's own ``TJFLAG_LIMITSCANS``), and at most
  ``MAX_BLOCK_SCANS`` (2^26) blocks decoded over all scans, each scan counting the blocks of
  the components it codes (about 10 ns each on one core: under a second);
- memory: libjpeg's own limit at the coefficient buffer the declared blocks need, plus 32 MiB;
- a quantisation table entry of 0 (illegal, T.81 B.2.4.1; the image decodes flat).

The extension applies these inside libjpeg (imgprep/csrc/budget.h: on the header, then scan
by scan) and exports the limits, which ``LIMITS`` reads; where it is not built, ``prescan``
walks the file's markers in Python (no decode) and holds it to the same limits, and tells
what the bytes show of its end (no end-of-image marker, bytes after it).

Other formats (Pillow decodes them whole): at most ``OTHER_PIXELS_PER_BYTE`` declared pixels
a byte of the file, or ``OTHER_PIXELS_FLOOR`` whatever the size (``other_refusal``): deflate,
LZW and run-length coding reach about a thousand to one on flat pictures, while a forged
header or a bitmap's early end-of-picture code claims any size at all.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from types import ModuleType

_ext: ModuleType | None
try:
    from imgprep import _jpegcrop as _ext
except ImportError:  # built optionally: prescan serves without it
    _ext = None


@dataclass(frozen=True)
class Limits:
    """The JPEG budget's numbers (the module docstring says what each bounds)."""

    max_scans: int = 500
    max_block_scans: int = 1 << 26
    blocks_per_byte: int = 8
    arith_blocks_per_byte: int = 512


# Where the extension is built, its own numbers (a test holds the defaults equal to them).
LIMITS = Limits(**{f: getattr(_ext, f"BUDGET_{f.upper()}") for f in Limits.__dataclass_fields__}
                ) if _ext is not None else Limits()
OTHER_PIXELS_PER_BYTE = 4096
OTHER_PIXELS_FLOOR = 1 << 24

_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # DHT, JPG, DAC are not frames
_STANDALONE = frozenset([0x01, *range(0xD0, 0xD8)])  # TEM, RSTn: no length
_NEXT_MARKER = re.compile(rb"\xff+[^\x00\xd0-\xd7\xff]")  # past entropy-coded data


@dataclass(frozen=True)
class JpegLayout:
    """What a JPEG's markers say, read without decoding (``prescan``)."""

    width: int = 0
    height: int = 0
    precision: int = 0
    components: int = 0
    blocks: int = 0  # 8x8 blocks over all components
    arithmetic: bool = False
    scans: int = 0
    block_scans: int = 0  # blocks over all scans (each scan: its components' blocks)
    zero_table: int | None = None  # a quantisation table a component uses that holds a 0
    end: int | None = None  # the offset just past the end-of-image marker; None: none
    frame: bool = False  # a frame header was read


@dataclass
class _Walk:
    """The state of ``prescan``'s walk."""

    blocks_of: dict[int, int]  # component id -> its blocks
    tables: dict[int, int]  # component id -> its quantisation table
    zero_tables: set[int]
    fields: dict[str, object]


def _frame(seg: bytes, marker: int, w: _Walk) -> None:
    """A frame header (SOFn): size, precision, components and their blocks."""
    if len(seg) < 6:
        return
    precision, height, width, n = struct.unpack(">BHHB", seg[:6])
    comps = [seg[6 + 3 * i:9 + 3 * i] for i in range(n) if len(seg) >= 9 + 3 * i]
    hmax = max((c[1] >> 4 for c in comps), default=1) or 1
    vmax = max((c[1] & 15 for c in comps), default=1) or 1
    for cid, hv, tq in comps:
        bw = -(-width * (hv >> 4) // (hmax * 8))
        bh = -(-height * (hv & 15) // (vmax * 8))
        w.blocks_of[cid] = bw * bh
        w.tables[cid] = tq
    w.fields.update(width=width, height=height, precision=precision, components=n,
                    blocks=sum(w.blocks_of.values()), frame=True,
                    arithmetic=marker in range(0xC9, 0xD0))


def _quant(seg: bytes, w: _Walk) -> None:
    """Quantisation tables (DQT): which of them hold a 0."""
    i = 0
    while i < len(seg):
        wide, t = seg[i] >> 4, seg[i] & 15
        size = 128 if wide else 64
        values = seg[i + 1:i + 1 + size]
        entries = struct.unpack(f">{len(values) // 2}H", values[:len(values) // 2 * 2]) \
            if wide else tuple(values)
        if 0 in entries:
            w.zero_tables.add(t)
        else:
            w.zero_tables.discard(t)
        i += 1 + size


def prescan(data: bytes) -> JpegLayout:
    """Walk the markers of the JPEG ``data`` (no decode; about 20 us for an ImageNet photo):
    its frame, quantisation tables and scans, and where its end-of-image marker is."""
    w = _Walk({}, {}, set(), {})
    scans = block_scans = 0
    end = None
    i = 2 if data[:2] == b"\xff\xd8" else len(data)
    while i + 1 < len(data):
        j = data.find(b"\xff", i)
        while 0 <= j < len(data) - 1 and data[j + 1] == 0xFF:
            j += 1  # fill bytes
        if j < 0 or j + 1 >= len(data):
            break
        marker, i = data[j + 1], j + 2
        if marker == 0xD9:
            end = i
            break
        if marker in _STANDALONE or marker == 0x00:
            continue
        size = int.from_bytes(data[i:i + 2], "big")
        seg, i = data[i + 2:i + size], i + max(size, 2)
        if marker in _SOF:
            _frame(seg, marker, w)
        elif marker == 0xDB:
            _quant(seg, w)
        elif marker == 0xDA:
            scans += 1
            block_scans += sum(w.blocks_of.get(seg[1 + 2 * k], 0)
                               for k in range(seg[0] if seg else 0) if 2 + 2 * k <= len(seg))
            m = _NEXT_MARKER.search(data, i)
            i = m.end() - 2 if m else len(data)
    zero = next((t for t in w.tables.values() if t in w.zero_tables), None)
    return JpegLayout(**w.fields, scans=scans, block_scans=block_scans,  # type: ignore[arg-type]
                      zero_table=zero, end=end)


def unreadable(layout: JpegLayout) -> str | None:
    """What makes a JPEG one that no decoder here reads (its frame says so), or None."""
    if not layout.frame:
        return ("an unreadable JPEG image: no frame header before its data ends or breaks "
                "(truncated, or damaged there)")
    if layout.precision != 8:
        return (f"a {layout.precision}-bit JPEG (only 8-bit JPEGs are read; 12- and 16-bit "
                "ones are medical and raw-photo formats)")
    if layout.width == 0 or layout.height == 0:
        return f"a JPEG whose header declares a size of {layout.width}x{layout.height}"
    if layout.components not in (1, 3, 4):
        return (f"a {layout.components}-component JPEG (only grayscale, YCbCr/RGB and "
                "CMYK/YCCK ones are read)")
    return None


def refusal(layout: JpegLayout, nbytes: int) -> str | None:
    """Why the JPEG ``layout`` describes breaks its budget in ``nbytes`` bytes, or None (the
    extension's words, imgprep/csrc/budget.c)."""
    per_byte = LIMITS.arith_blocks_per_byte if layout.arithmetic else LIMITS.blocks_per_byte
    if layout.blocks > per_byte * nbytes:
        return (f"the header declares {layout.width}x{layout.height} ({layout.blocks} blocks "
                f"of 8x8) but the file holds only {nbytes} bytes, too few for that image (at "
                f"least {-(-layout.blocks // per_byte)}): cut short or forged")
    if layout.zero_table is not None:
        return (f"quantisation table {layout.zero_table} holds a 0 (illegal in JPEG: the "
                "image decodes flat)")
    if layout.scans > LIMITS.max_scans:
        return (f"a JPEG of more than {LIMITS.max_scans} scans (a legal progressive image "
                "has about 10): refused before decoding them all")
    if layout.block_scans > LIMITS.max_block_scans:
        return (f"a JPEG whose {layout.scans} scans decode over {LIMITS.max_block_scans} "
                f"blocks of 8x8 ({layout.width}x{layout.height} in {layout.components} "
                "components): refused before decoding them all")
    return None


def other_refusal(width: int, height: int, nbytes: int, fmt: str) -> str | None:
    """Why a ``fmt`` image declaring ``width`` x ``height`` in ``nbytes`` bytes breaks its
    budget, or None."""
    most = max(OTHER_PIXELS_FLOOR, OTHER_PIXELS_PER_BYTE * nbytes)
    if width * height <= most:
        return None
    return (f"the {fmt} header declares {width}x{height} = {width * height} pixels but the "
            f"file holds only {nbytes} bytes (at most {OTHER_PIXELS_PER_BYTE} pixels a byte, "
            f"or {OTHER_PIXELS_FLOOR} in all, are decoded): cut short or forged")
