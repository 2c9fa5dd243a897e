"""Output writers: deterministic webdataset tar shards and label-list image files.

Tar headers are fixed (mtime 0, uid/gid 0, no user names, mode 0644), so the same samples give
byte-identical shards on any machine. Shards stream to a temporary file while a sha256 is kept
up to date, then are fsynced and renamed: memory holds one sample, never a shard.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from types import TracebackType
from typing import IO

from imgprep.fsutil import atomic_open, write_bytes_atomic


class _HashingWriter(io.RawIOBase):
    """Counts and hashes everything written through it."""

    def __init__(self, f: IO[bytes]) -> None:
        super().__init__()
        self._f, self.sha = f, hashlib.sha256()
        self.bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self._f.write(b)
        self.sha.update(b)
        self.bytes += len(b)
        return len(b)

    def tell(self) -> int:
        return self.bytes


def tar_header(name: str, size: int) -> tarfile.TarInfo:
    """A member header with every machine-dependent field fixed."""
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode = size, 0, 0o644
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.type = tarfile.REGTYPE
    return ti


class ShardWriter:
    """Write one shard atomically: ``with ShardWriter(path) as w: w.add(key, {"jpg": b…})``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.samples = 0
        self.sha256 = ""
        self.bytes = 0
        self._ctx = atomic_open(path)

    def __enter__(self) -> ShardWriter:
        f = self._ctx.__enter__()
        self._hw = _HashingWriter(f)
        self._tar = tarfile.open(fileobj=self._hw, mode="w", format=tarfile.PAX_FORMAT)
        return self

    def add(self, key: str, fields: dict[str, bytes]) -> None:
        """Append one sample: one member ``<key>.<ext>`` per field, extensions sorted."""
        for ext in sorted(fields):
            data = fields[ext]
            self._tar.addfile(tar_header(f"{key}.{ext}", len(data)), io.BytesIO(data))
        self.samples += 1

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        if et is None:
            try:
                self._tar.close()
            except BaseException as e:
                self._ctx.__exit__(type(e), e, e.__traceback__)
                raise
            self.sha256, self.bytes = self._hw.sha.hexdigest(), self._hw.bytes
        self._ctx.__exit__(et, ev, tb)


def write_list_image(path: Path, data: bytes) -> str:
    """Write one converted image atomically (no per-file fsync); returns its sha256.

    Resume verifies sizes and checksums from the chunk record, so a file that a power loss
    left empty is caught and rewritten.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, data, durable=False)
    return hashlib.sha256(data).hexdigest()
