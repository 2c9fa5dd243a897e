"""A fast reader of plain tar headers, for listing: a few microseconds a member.

``scan`` walks the headers of the tar at ``[base, base+limit)`` of a file with one ``pread``
a header (``imgprep.shards.tarfmt.walk``) and returns ``(name, offset_data, size, is_file)``
per member, exactly as ``tarfile`` would give them, and where the closing zero block is. It
answers for what the ILSVRC2012 tars and ordinary writers use: ustar/GNU regular files and
folders, and pax extended headers that set only the path, size, times or owners. Anything
else (links, devices, GNU long names, sparse files, global pax headers, names that are not
UTF-8, a header that does not decode, a header or member cut short) raises ``Fallback``: the
caller then lists that tar with ``tarfile``, whose answer (and error handling) is the
reference.
"""

from __future__ import annotations

import functools
import os

from imgprep.shards.tarfmt import FOLDER, REGULAR, HeaderError, padded, walk

Entry = tuple[str, int, int, bool]  # name, offset of the data, size, a regular file
_PAX_KEPT = {"path", "size", "mtime", "atime", "ctime", "uid", "gid", "uname", "gname"}


class Fallback(Exception):  # noqa: N818 - a signal to the caller, not an error
    """The tar uses something this scanner leaves to ``tarfile``."""


def scan(fd: int, base: int, limit: int) -> tuple[list[Entry], int]:
    """Every member of the tar at ``[base, base+limit)`` of ``fd`` and the offset (from
    ``base``) of its closing zero block; ``Fallback`` when ``tarfile`` must decide."""
    out: list[Entry] = []
    end = 0
    try:
        for name, kind, _, offset, size, via, pax in walk(functools.partial(os.pread, fd),
                                                          limit, base=base):
            if kind == REGULAR and not via:  # the usual member: a plain file
                end = offset + padded(size)
            elif kind == FOLDER and not via:
                end = offset
            elif kind != REGULAR or via != b"x" or pax is None or not pax.keys() <= _PAX_KEPT:
                raise Fallback(f"member {name!r} of type {kind!r}, extended by {via!r}")
            else:
                end = offset + padded(size)
            if not name.isascii():
                try:
                    name.encode("utf-8")
                except UnicodeEncodeError:
                    raise Fallback("a name that is not UTF-8") from None
            out.append((name, offset, size, kind == REGULAR))
    except HeaderError as e:
        raise Fallback(str(e)) from None
    if not out:
        raise Fallback("an empty archive")
    return out, end
