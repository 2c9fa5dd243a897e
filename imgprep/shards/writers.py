"""Output writers: deterministic webdataset tar shards and label-list image files.

Tar headers are fixed (mtime 0, uid/gid 0, no user names, mode 0644: ``tarfmt.header_bytes``),
so the same samples give byte-identical shards on any machine. Shards stream to a temporary
file while a sha256 is kept up to date, then are fsynced and renamed: memory holds one sample,
never a shard.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import TracebackType

from imgprep.fsutil import atomic_open, write_bytes_atomic
from imgprep.shards.directio import AppendWriter
from imgprep.shards.layout import Layout, LayoutBuilder
from imgprep.shards.tarfmt import BLOCK, ZERO_BLOCK, end_of_archive, header_bytes
from imgprep.shards.tarfmt import RECORD as RECORD  # as before, for the scripts

FLUSH_BYTES = 1 << 20  # members are gathered into writes (and sha256 updates) this large


class ShardWriter:
    """Write one shard atomically: ``with ShardWriter(path) as w: w.add(key, {"jpg": b…})``.

    The tar is streamed to a temporary file while its sha256 and size are kept up to date,
    fsynced and renamed; the folder is fsynced once by the caller, before the manifest.
    Members are gathered into ~1 MB writes that bypass the page cache where the file system
    allows (``imgprep.shards.directio``): the disk writes one while the next is gathered, and the
    final fsync has little left to wait for. ``layout()`` gives every member's data offset
    and size, for the sample index.
    """

    def __init__(self, path: Path, *, piece: bool = False) -> None:
        self.path = path
        self.piece = piece
        self.samples = 0
        self.sha256 = ""
        self.bytes = 0
        self._ctx = atomic_open(path, durable=not piece, sync_dir=False)
        self._sha = None if piece else hashlib.sha256()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._layout = LayoutBuilder()

    def __enter__(self) -> ShardWriter:
        f = self._ctx.__enter__()
        try:
            self._out = AppendWriter(f.fileno(), 2 * FLUSH_BYTES, direct=not self.piece,
                                     digest=self._sha)
        except BaseException as e:
            self._ctx.__exit__(type(e), e, e.__traceback__)
            raise
        return self

    def _write(self, b: bytes) -> None:
        self._pending.append(b)
        self._pending_bytes += len(b)
        self.bytes += len(b)
        if self._pending_bytes >= FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        self._out.write(self._pending, self._pending_bytes)
        self._pending.clear()
        self._pending_bytes = 0

    def append_piece(self, piece: Path, layout: Layout) -> None:
        """Append the members of ``piece`` (written by a ``piece=True`` writer, whose
        ``layout()`` is ``layout``) and remove it."""
        if self._pending:
            self._flush()
        fd = os.open(piece, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            self._out.copy_from(fd, size)
        finally:
            os.close(fd)
        self._layout.extend(layout, self.bytes)
        self.bytes += size
        self.samples += layout.samples
        piece.unlink()

    def add(self, key: str, fields: dict[str, bytes]) -> None:
        """Append one sample: one member ``<key>.<ext>`` per field, extensions sorted."""
        pending, pos = self._pending, self.bytes
        for ext in sorted(fields):
            data = fields[ext]
            n = len(data)
            header = header_bytes(f"{key}.{ext}", n)
            pos += len(header)
            self._layout.add_member(key, ext, pos, n)
            pending += (header, data)
            pos += n
            if pad := -n % BLOCK:
                pending.append(ZERO_BLOCK[:pad])
                pos += pad
        self._pending_bytes += pos - self.bytes
        self.bytes = pos
        self.samples += 1
        if self._pending_bytes >= FLUSH_BYTES:
            self._flush()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        if et is None:
            try:
                if not self.piece:
                    self._write(end_of_archive(self.bytes))
                self._flush()
                self._out.close()
            except BaseException as e:
                self._out.abort()
                self._ctx.__exit__(type(e), e, e.__traceback__)
                raise
            self.sha256 = "" if self._sha is None else self._sha.hexdigest()
        else:
            self._out.abort()
        self._ctx.__exit__(et, ev, tb)

    def layout(self) -> Layout:
        """Where each sample's members lie in the shard (data offsets and sizes)."""
        return self._layout.layout()


def write_list_image(path: Path, data: bytes) -> str:
    """Write one converted image atomically (no per-file fsync); returns its sha256.

    Resume verifies sizes and checksums from the chunk record, so a file that a power loss
    left empty is caught and rewritten.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, data, durable=False)
    return hashlib.sha256(data).hexdigest()
