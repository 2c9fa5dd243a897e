"""A fast reader of plain tar headers, for listing: a few microseconds a member.

``scan`` walks the headers of the tar at ``[base, base+limit)`` of a file with one ``pread``
a header and returns ``(name, offset_data, size, is_file)`` per member, exactly as
``tarfile`` would give them, and where the closing zero block is. It understands what the
ILSVRC2012 tars and ordinary writers use: ustar/GNU regular files and folders, and PAX
extended headers that set only the path, size, times or owners. Anything else (links,
devices, GNU long names, sparse files, global PAX headers, base-256 numbers, a checksum that
does not add up, a header or member cut short) raises ``Fallback``: the caller then lists
that tar with ``tarfile``, whose answer (and error handling) is the reference.
"""

from __future__ import annotations

import os
from zlib import adler32

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
Entry = tuple[str, int, int, bool]  # name, offset of the data, size, a regular file
_PAX_IGNORED = {b"mtime", b"atime", b"ctime", b"uid", b"gid", b"uname", b"gname"}


class Fallback(Exception):  # noqa: N818 - a signal to the caller, not an error
    """The tar uses something this scanner leaves to ``tarfile``."""


def _octal(field: bytes) -> int:
    if field[:1] in (b"\x80", b"\xff"):
        raise Fallback("base-256 number")
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        raise Fallback("bad number") from None


def _text(field: bytes) -> str:
    try:
        return field.split(b"\0", 1)[0].decode("utf-8")
    except UnicodeDecodeError:
        raise Fallback("name is not UTF-8") from None


def _pax(data: bytes) -> tuple[str | None, int | None]:
    """(path, size) from a PAX extended header, refusing any other meaningful keyword."""
    path = size = None
    pos = 0
    while pos < len(data) and data[pos] != 0:
        sp = data.find(b" ", pos)
        try:
            length = int(data[pos:sp])
        except ValueError:
            raise Fallback("bad PAX record") from None
        record = data[sp + 1:pos + length]
        key, eq, value = record.partition(b"=")
        if length <= 0 or sp < 0 or not eq or not record.endswith(b"\n"):
            raise Fallback("bad PAX record")
        value = value[:-1]
        if key == b"path":
            try:
                path = value.decode("utf-8")
            except UnicodeDecodeError:
                raise Fallback("PAX path is not UTF-8") from None
        elif key == b"size":
            size = _octal_free_int(value)
        elif key not in _PAX_IGNORED:
            raise Fallback(f"PAX keyword {key!r}")
        pos += length
    return path, size


def _octal_free_int(value: bytes) -> int:
    try:
        return int(value)
    except ValueError:
        raise Fallback("bad PAX size") from None


def _checksum_ok(buf: bytes) -> bool:
    """tarfile's (unsigned) header checksum: the bytes' sum with the field read as spaces.
    Each half sums to under 65521, so adler32's low half is its exact sum plus one."""
    total = (adler32(buf[:256]) & 0xFFFF) + (adler32(buf[256:]) & 0xFFFF) - 2
    return total - sum(buf[148:156]) + 256 == _octal(buf[148:156])


def _header(buf: bytes) -> tuple[bytes, str, int]:
    """(type flag, name, size) of one checked ustar/GNU header block."""
    if not _checksum_ok(buf):
        raise Fallback("checksum")
    kind = buf[156:157]
    try:
        name = buf[:100].split(b"\0", 1)[0].decode("utf-8")
    except UnicodeDecodeError:
        raise Fallback("name is not UTF-8") from None
    if kind == b"\0" and name.endswith("/"):
        kind = b"5"
    if kind == b"5":
        name = name.rstrip("/")
    if buf[345]:
        name = f"{_text(buf[345:500])}/{name}"
    return kind, name, _octal(buf[124:136])


def scan(fd: int, base: int, limit: int) -> tuple[list[Entry], int]:
    """Every member of the tar at ``[base, base+limit)`` of ``fd`` and the offset (from
    ``base``) of its closing zero block; ``Fallback`` when ``tarfile`` must decide."""
    out: list[Entry] = []
    pos = 0
    pax: tuple[str | None, int | None] | None = None
    pread = os.pread
    while True:
        if pos + BLOCK > limit:
            raise Fallback("header past the end")
        buf = pread(fd, BLOCK, base + pos)
        if len(buf) != BLOCK:
            raise Fallback("short read")
        if buf == ZERO_BLOCK:
            if pax is not None or pos == 0:
                raise Fallback("empty archive or dangling PAX header")
            return out, pos
        kind, name, size = _header(buf)
        data = pos + BLOCK
        if kind == b"x" and pax is None:
            if data + size > limit:
                raise Fallback("PAX header past the end")
            pax = _pax(pread(fd, size, base + data))
            pos = data + -(-size // BLOCK) * BLOCK
            continue
        if kind == b"0" and pax is None:  # the usual member: a plain file
            out.append((name, data, size, True))
            pos = data + -(-size // BLOCK) * BLOCK
            continue
        if kind not in (b"0", b"\0", b"5"):
            raise Fallback(f"member type {kind!r}")
        if pax is not None:
            if kind == b"5":
                raise Fallback("PAX header on a folder")
            name = pax[0] if pax[0] is not None else name
            size = pax[1] if pax[1] is not None else size
            pax = None
        is_file = kind != b"5"
        out.append((name, data, size, is_file))
        pos = data + (-(-size // BLOCK) * BLOCK if is_file else 0)
