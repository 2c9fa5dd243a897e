"""Reading an item's bytes where its form keeps them: the hot path of every conversion.

Most items are raw bytes: ``size`` bytes at ``offset`` of a tar (one ``pread``), or a file
below a folder (``offset < 0``: read up to its listed size, never more). Items whose listing
carries ``Codecs`` may instead be zip members, found by the offset of their local header:
one ``pread`` covers the header and the data (the header's length guessed from the central
directory; read again when the local one is longer). The local header must agree with the
central directory, as ``unzip -t``, ``bsdtar`` and Python's ``zipfile`` require between
them: the same name, method, CRC-32 and sizes (0 where a data descriptor follows the data;
all ones where the local zip64 field holds a size, which is then compared), and data that
ends before the next member's header (``end``, from the listing), followed, where the flags
say so, by a data descriptor that records the same CRC-32 and sizes. Deflated data is
inflated raw (``zlib``, wbits -15) and never past the recorded size, and every member's
CRC-32 is checked. A mismatch is an ``OSError`` that the converter records against the
member.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from imgprep.inputs.sources import Listing

RAW, ZIP_STORED, ZIP_DEFLATED = 0, 1, 2  # the codec column's values
CODEC_NAMES = {RAW: "raw", ZIP_STORED: "zip stored", ZIP_DEFLATED: "zip deflated"}
ZIP_METHODS = {ZIP_STORED: 0, ZIP_DEFLATED: 8}  # the zip method number of each zip codec
LOCAL_MAGIC = b"PK\x03\x04"
LOCAL_HEADER = 30  # fixed part of a zip local header; name and extra field follow
_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # magic, version, flags, method, time, date, crc,
#                                          compressed size, size, name length, extra length
UTF8_NAME, DESCRIPTOR = 0x800, 0x8  # flag bits: name in UTF-8; CRC and sizes follow the data
ZIP64_SIZE = 0xFFFFFFFF  # a size kept in the zip64 extra field instead
DESCRIPTOR_MAGIC, DESCRIPTOR_MAX = b"PK\x07\x08", 24  # a data descriptor's signature, size
MAX_TEXT_BYTES = 64 << 20  # a ground-truth file read whole (LOC_val_solution.csv: ~2 MB)
DAMAGED = "the archive is damaged or was altered (`unzip -t` or `bsdtar -tf` reports it too); " \
    "re-download it"


@dataclass(frozen=True)
class Codecs:
    """Per-item columns of a listing whose items are not all raw: ``codec`` (RAW,
    ZIP_STORED, ZIP_DEFLATED), ``crc`` (CRC-32 of the image bytes), ``stored`` (bytes in the
    container, compressed), ``head`` (guessed length of the local header), ``end`` (where
    the next member's local header, or the central directory, starts: the data must end
    before it). ``Listing.size`` stays the image's own size, ``Listing.offset`` the local
    header's offset and ``Listing.member`` the name the local header must hold."""

    codec: np.ndarray
    crc: np.ndarray
    stored: np.ndarray
    head: np.ndarray
    end: np.ndarray

    def take(self, order: np.ndarray) -> Codecs:
        """The columns of the items ``order`` names, in that order."""
        return Codecs(self.codec[order], self.crc[order], self.stored[order], self.head[order],
                      self.end[order])


@dataclass(frozen=True, slots=True)
class ZipEntry:
    """What the central directory records of one member: its ``name``, the ``offset`` of
    its local header, the header's guessed length ``head``, the ``stored`` (compressed) and
    image ``size``, ``codec``, ``crc`` and ``end`` (where the next member starts)."""

    name: str
    offset: int
    head: int
    stored: int
    size: int
    codec: int
    crc: int
    end: int


def _zip64_sizes(extra: bytes, size: int, stored: int) -> tuple[int, int]:
    """A local header's (size, compressed size), those it leaves to its zip64 extra field
    (all ones) read from there, in that order; -1 for one the field does not hold."""
    at = 0
    while at + 4 <= len(extra):
        kind, n = struct.unpack_from("<HH", extra, at)
        if kind == 1:  # the zip64 extended information
            field, k = extra[at + 4:at + 4 + n], 0
            if size == ZIP64_SIZE:
                size = struct.unpack_from("<Q", field)[0] if len(field) >= 8 else -1
                k = 8
            if stored == ZIP64_SIZE:
                stored = struct.unpack_from("<Q", field, k)[0] if len(field) >= k + 8 else -1
            return size, stored
        at += 4 + n
    return (-1 if size == ZIP64_SIZE else size), (-1 if stored == ZIP64_SIZE else stored)


def _local_header(fd: int, entry: ZipEntry) -> tuple[bytes, int, bool]:
    """The bytes read at the entry's local header (header and, usually, data), where its
    data starts and whether a data descriptor follows it, after checking the header against
    the central directory."""
    buf = os.pread(fd, entry.head + entry.stored, entry.offset)
    if len(buf) < LOCAL_HEADER or buf[:4] != LOCAL_MAGIC:
        raise OSError(f"no zip local header at byte {entry.offset}: the archive changed since "
                      "it was listed, or is damaged; re-download it")
    _, _, flags, method, _, _, crc, stored, size, name_len, extra_len = _LOCAL.unpack_from(buf)
    raw = buf[LOCAL_HEADER:LOCAL_HEADER + name_len + extra_len]
    if len(raw) < name_len + extra_len:
        raw = os.pread(fd, name_len + extra_len, entry.offset + LOCAL_HEADER)
    try:
        name = raw[:name_len].decode("utf-8" if flags & UTF8_NAME else "cp437")
    except UnicodeDecodeError:
        name = repr(raw[:name_len])
    if name != entry.name:
        raise OSError(f"its local header (byte {entry.offset}) names {name!r}: the central "
                      "directory points this entry at another member's bytes, or the header was "
                      f"altered; {DAMAGED}")
    if ZIP64_SIZE in (stored, size):  # the size is in the zip64 field: it must be there
        size, stored = _zip64_sizes(raw[name_len:], size, stored)
    late = bool(flags & DESCRIPTOR)  # CRC and sizes follow the data: 0 here, or the same
    differ = [what for what, local, central in (
        ("CRC-32", crc, entry.crc), ("compressed size", stored, entry.stored),
        ("size", size, entry.size),
    ) if local != central and not (late and local == 0)]
    if method != ZIP_METHODS.get(entry.codec, -1):
        differ.insert(0, "method")
    if differ:
        raise OSError(f"its local header records another {' and '.join(differ)} than the "
                      f"central directory; {DAMAGED}")
    start = LOCAL_HEADER + name_len + extra_len
    if entry.offset + start + entry.stored > entry.end:
        raise OSError(f"its data (bytes {entry.offset + start}-"
                      f"{entry.offset + start + entry.stored - 1}) runs into the next member "
                      f"at byte {entry.end}: members overlap; {DAMAGED}")
    return buf, start, late


def _check_descriptor(fd: int, entry: ZipEntry, at: int) -> None:
    """Refuse a member whose data descriptor (at byte ``at``, before the next member; with
    or without its signature, with 4- or 8-byte sizes) does not record the central
    directory's CRC-32 and sizes."""
    tail = os.pread(fd, max(0, min(DESCRIPTOR_MAX, entry.end - at)), at)
    for skip in (len(DESCRIPTOR_MAGIC), 0):
        if skip and tail[:skip] != DESCRIPTOR_MAGIC:
            continue
        for fmt in ("<III", "<IQQ"):
            if len(tail) >= skip + struct.calcsize(fmt) and struct.unpack_from(
                    fmt, tail, skip) == (entry.crc, entry.stored, entry.size):
                return
    raise OSError(f"its data descriptor (byte {at}) does not record the CRC-32 and sizes of "
                  f"the central directory; {DAMAGED}")


def read_zip_member(fd: int, entry: ZipEntry) -> bytes:
    """The bytes of the zip member ``entry`` in ``fd``, checked against the central
    directory; never more than its recorded sizes are read or inflated."""
    buf, start, late = _local_header(fd, entry)
    stored, size = entry.stored, entry.size
    data = buf[start:start + stored] if start <= entry.head else \
        os.pread(fd, stored, entry.offset + start)
    if len(data) != stored:
        raise OSError(f"the archive ends inside this member ({len(data)} of {stored} bytes): "
                      "it is truncated; re-download it")
    if late:
        _check_descriptor(fd, entry, entry.offset + start + stored)
    if entry.codec == ZIP_DEFLATED:
        inflater = zlib.decompressobj(-15)
        try:
            data = inflater.decompress(data, size + 1)
        except zlib.error as e:
            raise OSError(f"its deflated data is damaged ({e}); re-download the archive") from e
        if len(data) != size or not inflater.eof:
            raise OSError(f"it inflates to other than the {size} bytes its central directory "
                          "records; the archive is damaged: re-download it")
    elif entry.codec != ZIP_STORED:
        raise OSError(f"unknown codec {entry.codec}")
    elif stored != size:
        raise OSError(f"it is stored uncompressed, but the central directory records {stored} "
                      f"bytes stored and a size of {size}; {DAMAGED}")
    if zlib.crc32(data) != entry.crc:
        raise OSError(f"CRC-32 mismatch (the central directory records {entry.crc:08x}, the "
                      f"data gives {zlib.crc32(data):08x}): the archive is damaged; "
                      "re-download it")
    return data


@dataclass(frozen=True, kw_only=True)
class ArchiveMember:
    """A small file inside an archive (ground truth, a class map), read on demand as text;
    ``str()`` names it as ``archive/member`` for messages."""

    archive: Path
    entry: ZipEntry

    @property
    def member(self) -> str:
        return self.entry.name

    @property
    def name(self) -> str:
        return self.member.rpartition("/")[2]

    def __str__(self) -> str:
        return f"{self.archive}/{self.member}"

    def read_bytes(self) -> bytes:
        """Its bytes, checked; refused unread when it records over ``MAX_TEXT_BYTES``."""
        if max(self.entry.size, self.entry.stored) > MAX_TEXT_BYTES:
            raise OSError(f"{self}: its central directory records {self.entry.size:,} bytes, "
                          f"more than a ground-truth file holds ({MAX_TEXT_BYTES:,} at most); "
                          f"not read: {DAMAGED}")
        fd = os.open(self.archive, os.O_RDONLY)
        try:
            return read_zip_member(fd, self.entry)
        except OSError as e:
            raise OSError(f"{self}: {e}") from e
        finally:
            os.close(fd)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)


def over_cap(recorded: str, max_bytes: int) -> str:
    """Why an image is not read: its ``recorded`` size ("its tar header records N bytes") is
    over ``--max-image-bytes`` (checked before anything of it is read)."""
    return (f"{recorded}, over --max-image-bytes ({max_bytes:,}); not read: no ImageNet image "
            "comes near that (the largest is about 15 MB), so the file is damaged or was "
            "altered; pass a larger --max-image-bytes to read it anyway")


TextFile = Path | ArchiveMember  # a small text file (ground truth): on disk or in an archive


class SourceReader:
    """Reads item bytes with ``pread`` from a handful of cached file descriptors."""

    def __init__(self, containers: tuple[str, ...]) -> None:
        self._containers = containers
        self._fds: dict[int, int] = {}

    def _fd(self, container: int) -> int:
        fd = self._fds.get(container)
        if fd is None:
            fd = self._fds[container] = os.open(self._containers[container], os.O_RDONLY)
        return fd

    def read(self, container: int, offset: int, size: int, member: str) -> bytes:
        """``size`` bytes at ``offset`` of a tar container, or the file ``member`` below a
        folder container (``offset < 0``; ``member`` is not used otherwise), which must
        still be the ``size`` bytes it was listed with (at most that many are read)."""
        root = self._containers[container]
        if offset < 0:
            with open(os.path.join(root, member), "rb") as f:
                data = f.read(size + 1)
            if len(data) != size:
                raise OSError(f"it is no longer the {size} bytes it was listed with: the "
                              "folder changed during the run; rerun the same command")
            return data
        data = os.pread(self._fd(container), size, offset)
        if len(data) != size:
            raise OSError(f"short read from {root} at {offset}: source changed or truncated")
        return data

    def read_item(self, listing: Listing, i: int) -> bytes:
        """The bytes of item ``i`` of ``listing``, whatever its codec."""
        container, offset = int(listing.container[i]), int(listing.offset[i])
        size, codecs = int(listing.size[i]), listing.codecs
        if codecs is None or codecs.codec[i] == RAW:
            return self.read(container, offset, size, listing.member_str(i) if offset < 0 else "")
        return read_zip_member(self._fd(container), ZipEntry(
            listing.member_str(i), offset, int(codecs.head[i]), int(codecs.stored[i]), size,
            int(codecs.codec[i]), int(codecs.crc[i]), int(codecs.end[i])))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> SourceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
