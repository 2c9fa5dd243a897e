"""Convert's C path turns an image by the EXIF orientation that Pillow's
``ImageOps.exif_transpose`` acts on, however IFD0 holds the tag: repeated, of any TIFF type,
with several values, its value stored after IFD0 or past the payload's end, out of range,
after entries that end Pillow's reading, behind a header Pillow reads or refuses, beside an
XMP packet; in both byte orders. Each payload is built here byte by byte, embedded in a small
JPEG, and the turn each path makes is read off the pixels it gives."""

from __future__ import annotations

import io
import struct
import warnings
from dataclasses import dataclass

import numpy as np
import PIL
import pytest
from PIL import Image, ImageOps

from imgprep import jpegcrop
from imgprep.convert import native
from imgprep.sections import TransformOptions
from tests.support import encode, photo

ext = pytest.importorskip("imgprep._jpegcrop", reason=f"C extension: {jpegcrop.status()}")

ORIENTATION = 0x0112
# the TIFF types (Pillow reads each but 14 and 15; 99 is none)
BYTE, ASCII, SHORT, LONG, RATIONAL, SBYTE, UNDEFINED, SSHORT, SLONG, SRATIONAL = range(1, 11)
FLOAT, DOUBLE, IFD, LONG8, UNKNOWN = 11, 12, 13, 16, 99
UNIT = {BYTE: 1, ASCII: 1, SHORT: 2, LONG: 4, RATIONAL: 8, SBYTE: 1, UNDEFINED: 1, SSHORT: 2,
        SLONG: 4, SRATIONAL: 8, FLOAT: 4, DOUBLE: 8, IFD: 4, LONG8: 8, UNKNOWN: 1}
PACK = {BYTE: "B", SHORT: "H", LONG: "L", RATIONAL: "L", SBYTE: "b", SSHORT: "h", SLONG: "l",
        SRATIONAL: "l", FLOAT: "f", DOUBLE: "d", IFD: "L", LONG8: "Q"}
TURNS = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
         4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
         6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
         8: Image.Transpose.ROTATE_90}
PICTURE = photo((40, 24), 5)  # no two of its turns alike
XMP_8 = b'<x:xmpmeta><rdf:Description tiff:Orientation="8"/></x:xmpmeta>'


@dataclass(frozen=True)
class Entry:
    """An IFD0 entry: ``values`` packed as its type packs them (bytes as they are), ``count``
    how many there are unless given, stored in the entry when they fit its four bytes, else
    after IFD0, or at ``at`` when given."""
    type: int
    values: tuple[float, ...] | bytes
    count: int | None = None
    at: int | None = None
    tag: int = ORIENTATION


@dataclass(frozen=True)
class Form:
    """An Exif payload: ``headers`` times "Exif\\0\\0", a TIFF header (``magic`` after its byte
    order mark, in the other byte order when ``swapped``; IFD0 at ``ifd``), IFD0 (saying it holds
    ``count`` entries unless it holds as many as it says), the values stored after IFD0; cut
    to ``cut`` bytes when given; the JPEG holds ``XMP_8`` too when ``xmp``."""
    entries: tuple[Entry, ...]
    magic: int = 42
    swapped: bool = False
    headers: int = 1
    ifd: int = 8
    count: int | None = None
    cut: int | None = None
    xmp: bool = False

    def payload(self, order: str) -> bytes:
        far_at = self.ifd + 2 + 12 * len(self.entries) + 4
        ifd, far = b"", b""
        for e in self.entries:
            data = e.values if isinstance(e.values, bytes) else struct.pack(
                f"{order}{len(e.values)}{PACK[e.type]}", *e.values)
            count = len(data) // UNIT[e.type] if e.count is None else e.count
            if e.at is not None:
                field = struct.pack(order + "L", e.at)
            elif count * UNIT[e.type] <= 4:
                field = data.ljust(4, b"\0")[:4]
            else:
                field, far = struct.pack(order + "L", far_at + len(far)), far + data
            ifd += struct.pack(f"{order}HHL", e.tag, e.type, count) + field
        mark = b"II" if order == "<" else b"MM"
        magic = struct.pack(({"<": ">", ">": "<"}[order] if self.swapped else order) + "H",
                            self.magic)
        head = mark + magic + struct.pack(order + "L", self.ifd) + b"\0" * (self.ifd - 8)
        count = len(self.entries) if self.count is None else self.count
        tiff = head + struct.pack(order + "H", count) + ifd + struct.pack(order + "L", 0) + far
        return (b"Exif\0\0" * self.headers + tiff)[:self.cut]

    def jpeg(self, order: str) -> bytes:
        return encode(PICTURE, "JPEG", quality=95, exif=self.payload(order),
                      **({"xmp": XMP_8} if self.xmp else {}))


def _one(type_: int, *values: float, **kw: int) -> Form:
    return Form((Entry(type_, values, **kw),))


def _text(type_: int, data: bytes) -> Form:
    return Form((Entry(type_, data),))


SIX = Entry(SHORT, (6,))
OTHER = Entry(ASCII, b"abc\0", tag=0x010F)  # Make
BEYOND = 4096  # an offset past every payload here
FORMS = {
    # (a) the tag twice
    "repeated": Form((SIX, Entry(SHORT, (3,)))),
    "repeated-second-out-of-range": Form((SIX, Entry(SHORT, (9,)))),
    "repeated-second-of-unknown-type": Form((SIX, Entry(UNKNOWN, b"\3\0\0\0"))),
    "repeated-second-empty": Form((SIX, Entry(SHORT, (3,), count=0))),
    "repeated-first-empty": Form((Entry(SHORT, (6,), count=0), Entry(SHORT, (3,)))),
    "repeated-second-past-the-end": Form((SIX, Entry(SHORT, (3, 3, 3), at=BEYOND))),
    # (b), (c) signed types
    "sshort-6": _one(SSHORT, 6),
    "sshort-minus-2": _one(SSHORT, -2),
    "slong-6": _one(SLONG, 6),
    "slong-minus-1": _one(SLONG, -1),
    "sbyte-7": _one(SBYTE, 7),
    "sbyte-minus-3": _one(SBYTE, -3),
    # (d) several values
    "short-count-2": _one(SHORT, 6, 3),
    "short-count-2-first-1": _one(SHORT, 1, 6),
    "short-count-3-after-ifd0": _one(SHORT, 5, 3, 3),
    "long-count-2-after-ifd0": _one(LONG, 7, 3),
    "short-count-3-past-the-end": _one(SHORT, 5, 3, 3, at=BEYOND),
    # other types
    "long-6": _one(LONG, 6),
    "long-4294967294": _one(LONG, 2**32 - 2),
    "ifd-type-6": _one(IFD, 6),
    "long8-6": _one(LONG8, 6),
    "byte-6": _one(BYTE, 6),
    "undefined-6": _text(UNDEFINED, b"\6"),
    "ascii-6": _text(ASCII, b"6\0"),
    "rational-6": _one(RATIONAL, 6, 1),
    "rational-12-over-2": _one(RATIONAL, 12, 2),
    "rational-13-over-2": _one(RATIONAL, 13, 2),
    "rational-over-0": _one(RATIONAL, 6, 0),
    "srational-minus-12-over-minus-2": _one(SRATIONAL, -12, -2),
    "srational-12-over-minus-2": _one(SRATIONAL, 12, -2),
    "float-6": _one(FLOAT, 6.0),
    "float-6.5": _one(FLOAT, 6.5),
    "float-nan": _one(FLOAT, float("nan")),
    "double-3": _one(DOUBLE, 3.0),
    "unknown-type": _text(UNKNOWN, b"\6\0\0\0"),
    "empty": _one(SHORT, 6, count=0),
    # values out of range
    "short-0": _one(SHORT, 0),
    "short-1": _one(SHORT, 1),
    "short-9": _one(SHORT, 9),
    "short-65535": _one(SHORT, 65535),
    # where IFD0 and its entries end
    "after-another-tag": Form((OTHER, SIX)),
    "before-another-tag": Form((Entry(ASCII, b"abc\0", tag=0x0131), SIX, OTHER)),
    "after-a-value-past-the-end": Form((Entry(LONG, (1, 1), at=BEYOND, tag=0x0111), SIX)),
    "after-a-value-larger-than-the-payload": Form((Entry(LONG, (1, 1), count=2**30, at=0,
                                                         tag=0x0111), SIX)),
    "count-past-the-end": Form((SIX,), count=40),
    "entry-cut-short": Form((OTHER, SIX), cut=6 + 8 + 2 + 12 + 6),
    "ifd0-past-the-end": Form((SIX,), ifd=BEYOND, cut=40),
    "ifd0-later": Form((SIX,), ifd=20),
    # headers
    "magic-swapped": Form((SIX,), swapped=True),
    "magic-43": Form((SIX,), magic=43),  # BigTIFF's
    "magic-43-swapped": Form((SIX,), magic=43, swapped=True),
    "magic-0": Form((SIX,), magic=0),
    "header-only": Form((SIX,), cut=6 + 6),
    "three-exif-headers": Form((SIX,), headers=3),
    # an XMP packet saying 8 beside the EXIF
    "xmp-beside-a-tag": Form((SIX,), xmp=True),
    "xmp-beside-a-tag-out-of-range": Form((Entry(SHORT, (9,)),), xmp=True),
    "xmp-beside-a-skipped-tag": Form((Entry(UNKNOWN, b"\6\0\0\0"),), xmp=True),
    "xmp-beside-no-tiff": Form((SIX,), cut=6, xmp=True),
    "xmp-beside-an-unreadable-header": Form((SIX,), magic=0, xmp=True),
    "xmp-beside-a-cut-header": Form((SIX,), cut=6 + 6, xmp=True),
}

# Pillow 13 reads these otherwise (a repeated tag's first copy; at most two "Exif\0\0" headers
# stripped; a value stored at an offset skipped, where it ended IFD0 before, once such values
# add up past the payload). The C path reads them as Pillow 11.2 to 12.3 and pillow-simd 12.1.1
# do whichever Pillow is installed, so that its output depends on none: the turn it makes.
PILLOW_12_ONLY = {"repeated": 3, "repeated-second-out-of-range": 1,
                  "after-a-value-larger-than-the-payload": 1, "three-exif-headers": 6}
PILLOW_13 = int(PIL.__version__.split(".")[0]) >= 13


def _turn(shown: np.ndarray, stored: np.ndarray) -> int:
    """The orientation (1..8) that turns the ``stored`` pixels into the ``shown`` ones."""
    for k in range(1, 9):
        turned = stored if k == 1 else np.asarray(Image.fromarray(stored).transpose(TURNS[k]))
        if turned.shape == shown.shape and np.array_equal(turned, shown):
            return k
    raise AssertionError("the pixels shown are no turn of those stored")


def c_turn(data: bytes) -> int:
    """The turn the extension's decode stage makes (whole, at full scale)."""
    def decoded(turn: bool) -> np.ndarray:
        status, message, rgbx, w, h, *_ = ext.frame(
            data, min(PICTURE.size), native.RESIZE["short-side"],
            native.FILTER_CODES["bilinear"], TransformOptions().max_pixels, turn, True, 0)
        assert status == native.CONVERTED, message
        return np.frombuffer(rgbx, np.uint8).reshape(h, w, 4)[..., :3]
    return _turn(decoded(True), decoded(False))


def pillow_turn(data: bytes) -> int:
    """The turn ``ImageOps.exif_transpose`` makes, as convert's Pillow path calls it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow's corrupt-EXIF warnings
        img = Image.open(io.BytesIO(data))
        img.load()
        shown = ImageOps.exif_transpose(img)
    return _turn(np.asarray(shown.convert("RGB")), np.asarray(img.convert("RGB")))


@pytest.mark.parametrize("order", ["<", ">"], ids=["II", "MM"])
@pytest.mark.parametrize("name", FORMS)
def test_the_c_path_turns_by_the_orientation_pillow_reads(name: str, order: str,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    data = FORMS[name].jpeg(order)
    turn = c_turn(data)
    if name in PILLOW_12_ONLY:
        assert turn == PILLOW_12_ONLY[name]
        if PILLOW_13:
            return  # the installed Pillow turns it otherwise
    assert turn == pillow_turn(data)
    opts = TransformOptions(exif_transpose=True, resize="short-side", size=16)
    ours = native.convert_native(data, opts, pixels=True)
    monkeypatch.setattr(native, "JPEG_MAGIC", b"never a prefix")  # Pillow decodes and turns
    theirs = native.convert_native(data, opts, pixels=True)
    assert (ours.jpeg, ours.size) == (theirs.jpeg, theirs.size)
