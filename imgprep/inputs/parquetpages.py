"""The page headers of a parquet column chunk, read without decoding a page: what pyarrow
will hold to decode the chunk, known before it does.

A column chunk is a run of pages, each a Thrift compact-encoded ``PageHeader`` (the page's
type, its uncompressed and compressed sizes, ...) followed by its compressed bytes. pyarrow
sizes its buffers by these headers, not by the footer's totals, so a footer that understates
a chunk cannot hide a page that decodes to a gigabyte; ``decoded_bytes`` sums the headers'
uncompressed sizes, reading only the headers (a few hundred bytes a page, through a small
buffer; the page bytes are skipped). A header that does not decode, or a page that runs past
the chunk, is a ``ValueError``: the chunk is then not read at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

READ = 1 << 16  # bytes read at a time while walking the headers
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY = range(9)
_LIST, _SET, _MAP, _STRUCT = 9, 10, 11, 12
MAX_DEPTH = 16  # nested structs a header may hold (a PageHeader holds 3)


class _Reader:
    """Bytes of a file from ``pos`` on, a block at a time, never past ``end``."""

    def __init__(self, fd: int, pos: int, end: int) -> None:
        self.fd, self.pos, self.end = fd, pos, end
        self.buf, self.at = b"", 0

    def byte(self) -> int:
        if self.at >= len(self.buf):
            self.buf = os.pread(self.fd, min(READ, self.end - self.pos), self.pos)
            self.at = 0
            if not self.buf:
                raise ValueError("a page header runs past its column chunk")
        self.at += 1
        self.pos += 1
        return self.buf[self.at - 1]

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise ValueError("a page runs past its column chunk")
        ahead = len(self.buf) - self.at
        if n <= ahead:
            self.at += n
        else:
            self.buf, self.at = b"", 0
        self.pos += n

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise ValueError("a varint longer than 64 bits")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)


def _skip(r: _Reader, kind: int, depth: int) -> None:
    """Skip one value of Thrift compact type ``kind``."""
    if kind in (_TRUE, _FALSE):
        return
    if kind == _BYTE:
        r.skip(1)
    elif kind in (_I16, _I32, _I64):
        r.varint()
    elif kind == _DOUBLE:
        r.skip(8)
    elif kind == _BINARY:
        r.skip(r.varint())
    elif kind in (_LIST, _SET):
        head = r.byte()
        count = head >> 4 if head >> 4 != 15 else r.varint()
        for _ in range(count):
            if head & 0x0F in (_TRUE, _FALSE):
                r.skip(1)  # a bool in a list takes a byte of its own
            else:
                _skip(r, head & 0x0F, depth)
    elif kind == _MAP:
        count = r.varint()
        types = r.byte() if count else 0
        for _ in range(count):
            _skip(r, types >> 4, depth)
            _skip(r, types & 0x0F, depth)
    elif kind == _STRUCT:
        _fields(r, depth + 1, {})
    else:
        raise ValueError(f"a page header holds an unknown Thrift type {kind}")


def _fields(r: _Reader, depth: int, wanted: dict[int, int]) -> dict[int, int]:
    """Read a struct's fields: the i32 fields ``wanted`` names ({id: 0}) filled in, the
    rest skipped."""
    if depth > MAX_DEPTH:
        raise ValueError("a page header nests too deep")
    field = 0
    while True:
        head = r.byte()
        if head == _STOP:
            return wanted
        kind = head & 0x0F
        field = field + (head >> 4) if head >> 4 else r.zigzag()
        if field in wanted and kind == _I32:
            wanted[field] = r.zigzag()
        else:
            _skip(r, kind, depth)


def page_sizes(fd: int, start: int, length: int) -> Iterator[tuple[int, int]]:
    """(uncompressed, compressed) size of each page of the column chunk at ``[start,
    start+length)`` of ``fd``, in order; ``ValueError`` when a header does not decode."""
    r = _Reader(fd, start, start + length)
    while r.pos < start + length:
        sizes = _fields(r, 0, {2: 0, 3: 0})  # uncompressed_page_size, compressed_page_size
        if sizes[2] < 0 or sizes[3] < 0:
            raise ValueError("a page header records a negative size")
        r.skip(sizes[3])
        yield sizes[2], sizes[3]


def decoded_bytes(fd: int, start: int, length: int) -> int:
    """What the pages of the column chunk at ``[start, start+length)`` take uncompressed."""
    return sum(u for u, _ in page_sizes(fd, start, length))
