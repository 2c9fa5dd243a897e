"""Stored pixels in shards: the record a raw sample's image member holds, the Python home of
its layout (``imgprep/csrc/rawformat.h`` is the C one; a test holds them equal through the
constants the extension exports).

A sample converted with ``--store yuv420`` or ``--store rgb`` (or stored raw by
``--store mixed``) has, in place of ``<key>.jpg``, one member named by its kind (``KINDS``):
``<key>.yuv420`` or ``<key>.rgb24``, holding one record, little-endian::

    b"IPXL"  u8 version (1)  u8 mode  u16 0  u32 width  u32 height      (16 bytes)
    rgb:    height rows of width x 3 bytes (R, G, B)
    yuv420: the Y plane (height rows of width bytes), then Cb and Cr (ceil(height / 2) rows
            of ceil(width / 2) bytes each): the JPEG's own components before upsampling

The pixels are the full-scale decode of the JPEG the shard would hold (the planes for
``yuv420``), so nothing is lost that the JPEG keeps. A record is whole only when its length
is exactly what its header declares (``read_header``): readers check it before any pixel.
The member extensions are not image formats any reader knows (Pillow's ``.rgb`` is SGI's,
so the RGB kind is ``.rgb24``): webdataset readers see them as bytes.

This module is plain Python (struct), so that ``verify``, ``info`` and the loaders' reader
can read headers where the extension is not built.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"IPXL"
VERSION = 1
HEADER = struct.Struct("<4sBBHII")  # magic, version, mode, reserved, width, height
MAX_SIDE = 65500  # imgprep/csrc/bounds.h's MAX_SIDE
JPEG = "jpeg"  # the store mode that keeps JPEGs; its member is .jpg


@dataclass(frozen=True)
class Kind:
    """One kind of stored pixels: its name (a ``--store`` mode), its member extension and
    the record's mode byte."""

    name: str
    ext: str
    code: int


KINDS = (Kind("rgb", "rgb24", 1), Kind("yuv420", "yuv420", 2))
BY_NAME = {k.name: k for k in KINDS}
BY_EXT = {k.ext: k for k in KINDS}
BY_CODE = {k.code: k for k in KINDS}
IMAGE_EXTS = ("jpg", *(k.ext for k in KINDS))  # the members a sample's image may be


@dataclass(frozen=True)
class RawHeader:
    """A record's header: its kind and the image's size."""

    kind: Kind
    width: int
    height: int

    @property
    def size(self) -> int:
        """The bytes the whole record must hold."""
        return record_size(self.kind, self.width, self.height)


def record_size(kind: Kind, width: int, height: int) -> int:
    """The bytes of a record of ``kind`` and size, header included."""
    pixels = width * height
    if kind.name == "rgb":
        return HEADER.size + 3 * pixels
    return HEADER.size + pixels + 2 * ((width + 1) // 2) * ((height + 1) // 2)


def read_header(data: bytes | memoryview) -> RawHeader:
    """The header of the record ``data``, checked: magic, version, mode, sides 1..65500 and
    the length the header implies (ValueError saying which is wrong)."""
    if len(data) < HEADER.size:
        raise ValueError(f"a stored-pixel record of {len(data)} bytes is shorter than its "
                         f"{HEADER.size}-byte header")
    magic, version, code, reserved, w, h = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("not a stored-pixel record (no IPXL header)")
    if version != VERSION or reserved:
        raise ValueError(f"a stored-pixel record of version {version} (this imgprep reads "
                         f"{VERSION})")
    kind = BY_CODE.get(code)
    if kind is None or not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE):
        raise ValueError(f"a stored-pixel record of mode {code}, {w}x{h}: no such mode, or a "
                         f"side outside 1..{MAX_SIDE}")
    head = RawHeader(kind, w, h)
    if len(data) != head.size:
        raise ValueError(f"a {kind.name} record of {w}x{h} holds {head.size} bytes, this one "
                         f"{len(data)}: cut short or padded")
    return head


def is_record(data: bytes | memoryview) -> bool:
    """Whether ``data`` begins as a record does (its magic; ``read_header`` checks the rest)."""
    return bytes(data[:4]) == MAGIC


def image_member(fields: dict[str, bytes]) -> str | None:
    """The extension of a sample's one image member (``.jpg``, or stored pixels), or None
    when it has none or more than one."""
    found = [e for e in IMAGE_EXTS if e in fields]
    return found[0] if len(found) == 1 else None


def record_problem(data: bytes, size: int, resize: str) -> str | None:
    """Why a record is not what convert writes at ``size`` (``resize``: ``center-crop``, a
    square of that side; ``short-side``, that short side), or None: its header and length,
    then its size (what ``imgprep verify`` checks of each stored-pixel sample)."""
    try:
        head = read_header(data)
    except ValueError as e:
        return f"is damaged ({e})"
    w, h = head.width, head.height
    if (resize == "center-crop" and (w, h) != (size, size)) or \
            (resize == "short-side" and min(w, h) != size):
        return f"is {w}x{h}, expected {resize} {size}"
    return None
