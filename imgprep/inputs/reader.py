"""Reading an item's bytes where its form keeps them: the hot path of every conversion.

Most items are raw bytes: ``size`` bytes at ``offset`` of a tar (one ``pread``), or a file
below a folder (``offset < 0``). Items whose listing carries ``Codecs`` may instead be zip
members, found by the offset of their local header: one ``pread`` covers the header and the
data (the header's length guessed from the central directory; read again when the local one
is longer), deflated data is inflated raw (``zlib``, wbits -15) and every member's CRC-32 is
checked. A mismatch is an ``OSError`` that the converter records against the member.
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
LOCAL_MAGIC = b"PK\x03\x04"
LOCAL_HEADER = 30  # fixed part of a zip local header; name and extra field follow


@dataclass(frozen=True)
class Codecs:
    """Per-item columns of a listing whose items are not all raw: ``codec`` (RAW,
    ZIP_STORED, ZIP_DEFLATED), ``crc`` (CRC-32 of the image bytes), ``stored`` (bytes in the
    container, compressed), ``head`` (guessed length of the local header). ``Listing.size``
    stays the image's own size and ``Listing.offset`` the local header's offset."""

    codec: np.ndarray
    crc: np.ndarray
    stored: np.ndarray
    head: np.ndarray

    def take(self, order: np.ndarray) -> Codecs:
        """The columns of the items ``order`` names, in that order."""
        return Codecs(self.codec[order], self.crc[order], self.stored[order], self.head[order])


def read_zip_member(fd: int, offset: int, head: int, stored: int, size: int, codec: int,
                    crc: int) -> bytes:
    """The bytes of the zip member whose local header is at ``offset`` of ``fd``, checked."""
    buf = os.pread(fd, head + stored, offset)
    if len(buf) < LOCAL_HEADER or buf[:4] != LOCAL_MAGIC:
        raise OSError(f"no zip local header at byte {offset}: the archive changed since it "
                      "was listed, or is damaged; re-download it")
    name_len, extra_len = struct.unpack_from("<HH", buf, 26)
    start = LOCAL_HEADER + name_len + extra_len
    data = buf[start:start + stored] if start <= head else os.pread(fd, stored, offset + start)
    if len(data) != stored:
        raise OSError(f"the archive ends inside this member ({len(data)} of {stored} bytes): "
                      "it is truncated; re-download it")
    if codec == ZIP_DEFLATED:
        inflater = zlib.decompressobj(-15)
        try:
            data = inflater.decompress(data, size + 1)
        except zlib.error as e:
            raise OSError(f"its deflated data is damaged ({e}); re-download the archive") from e
        if len(data) != size or not inflater.eof:
            raise OSError(f"it inflates to other than the {size} bytes its central directory "
                          "records; the archive is damaged: re-download it")
    elif codec != ZIP_STORED:
        raise OSError(f"unknown codec {codec}")
    if zlib.crc32(data) != crc:
        raise OSError(f"CRC-32 mismatch (the central directory records {crc:08x}, the data "
                      f"gives {zlib.crc32(data):08x}): the archive is damaged; re-download it")
    return data


@dataclass(frozen=True, kw_only=True)
class ArchiveMember:
    """A small file inside an archive (ground truth, a class map), read on demand as text;
    ``str()`` names it as ``archive/member`` for messages."""

    archive: Path
    member: str
    offset: int
    size: int
    stored: int
    codec: int
    crc: int
    head: int

    @property
    def name(self) -> str:
        return self.member.rpartition("/")[2]

    def __str__(self) -> str:
        return f"{self.archive}/{self.member}"

    def read_bytes(self) -> bytes:
        fd = os.open(self.archive, os.O_RDONLY)
        try:
            return read_zip_member(fd, self.offset, self.head, self.stored, self.size,
                                   self.codec, self.crc)
        except OSError as e:
            raise OSError(f"{self}: {e}") from e
        finally:
            os.close(fd)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)


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
        folder container (``offset < 0``; ``member`` is not used otherwise)."""
        root = self._containers[container]
        if offset < 0:
            with open(os.path.join(root, member), "rb") as f:
                return f.read()
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
        return read_zip_member(self._fd(container), offset, int(codecs.head[i]),
                               int(codecs.stored[i]), size, int(codecs.codec[i]),
                               int(codecs.crc[i]))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> SourceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
