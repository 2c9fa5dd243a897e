"""Output writers: deterministic webdataset tar shards and label-list image files.

Tar headers are fixed (mtime 0, uid/gid 0, no user names, mode 0644), so the same samples give
byte-identical shards on any machine. Shards stream to a temporary file while a sha256 is kept
up to date, then are fsynced and renamed: memory holds one sample, never a shard.
"""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path
from types import TracebackType

from imgprep.fsutil import atomic_open, write_bytes_atomic
from imgprep.shards.directio import AppendWriter
from imgprep.shards.index import Layout, LayoutBuilder

BLOCK = 512
RECORD = 20 * BLOCK  # tar pads the archive to whole 10 KiB records, as tarfile does
FLUSH_BYTES = 1 << 20  # members are gathered into writes (and sha256 updates) this large


def tar_header(name: str, size: int) -> tarfile.TarInfo:
    """A member header with every machine-dependent field fixed."""
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode = size, 0, 0o644
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.type = tarfile.REGTYPE
    return ti


_USTAR_MODE_IDS = b"0000644\x000000000\x000000000\x00"  # bytes 100-124: mode, uid, gid
_USTAR_MTIME = b"00000000000\x00"  # bytes 136-148
_USTAR_MAGIC = b"ustar\x0000"  # bytes 257-265
# Sum of every fixed header byte, the checksum field counted as 8 spaces (as POSIX says).
_USTAR_FIXED_SUM = sum(_USTAR_MODE_IDS) + sum(_USTAR_MTIME) + 8 * 32 + ord("0") + sum(_USTAR_MAGIC)
_ZEROS = bytes(BLOCK)


def header_bytes(name: str, size: int) -> bytes:
    """The header block(s) of a regular member ``name`` of ``size`` bytes.

    Short ASCII names (every ImageNet key) get a ustar header assembled here from fixed parts,
    its checksum the fixed parts' sum plus the name's and size's, byte for byte what
    ``tarfile`` writes but ~20x cheaper; anything else goes through ``tarfile``'s PAX encoder.
    """
    if len(name) <= 100 and name.isascii() and size < 8**11:
        n = name.encode("ascii")
        sz = b"%011o\x00" % size
        chk = b"%06o\x00 " % (_USTAR_FIXED_SUM + sum(n) + sum(sz))
        return b"".join((n, _ZEROS[len(n):100], _USTAR_MODE_IDS, sz, _USTAR_MTIME, chk, b"0",
                         _ZEROS[:100], _USTAR_MAGIC, _ZEROS[265:]))
    return tar_header(name, size).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


class ShardWriter:
    """Write one shard atomically: ``with ShardWriter(path) as w: w.add(key, {"jpg": b…})``.

    The tar is streamed to a temporary file while its sha256 and size are kept up to date,
    fsynced and renamed; the folder is fsynced once by the caller, before the manifest.
    Members are gathered into ~1 MB writes that bypass the page cache where the file system
    allows (``imgprep.shards.directio``): the disk writes one while the next is gathered, and the
    final fsync has little left to wait for. ``layout()`` gives every member's data offset
    and size, for the sample index.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.samples = 0
        self.sha256 = ""
        self.bytes = 0
        self._ctx = atomic_open(path, sync_dir=False)
        self._sha = hashlib.sha256()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._layout = LayoutBuilder()

    def __enter__(self) -> ShardWriter:
        f = self._ctx.__enter__()
        try:
            self._out = AppendWriter(f.fileno(), 2 * FLUSH_BYTES)
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
        self._sha.update(self._out.write(self._pending, self._pending_bytes))
        self._pending.clear()
        self._pending_bytes = 0

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
                pending.append(_ZEROS[:pad])
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
                self._write(bytes(2 * BLOCK))
                self._write(bytes(-self.bytes % RECORD))
                self._flush()
                self._out.close()
            except BaseException as e:
                self._out.abort()
                self._ctx.__exit__(type(e), e, e.__traceback__)
                raise
            self.sha256 = self._sha.hexdigest()
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
