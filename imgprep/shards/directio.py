"""Appending a large file past the page cache: O_DIRECT from two aligned buffers, on a thread.

A conversion writes hundreds of GB that nothing reads back soon. Through the page cache every
new page must be found (once memory is full, by evicting another) and later written back, at a
CPU cost per MB that grows with memory pressure; with ``O_DIRECT`` the bytes go from a reused
buffer to the disk. Whole ``ALIGN`` blocks are written at aligned offsets by a thread while the
caller fills the other buffer, so the disk's time overlaps the caller's work; the file's last
partial block goes through the page cache. Only local disk file systems get ``O_DIRECT``: on
NFS every direct write waits for a COMMIT, a flush of the server's disk per megabyte, which
is the contention a shared file server must be spared. Elsewhere, and where the file system
refuses the flag (when it is set, or at the first write), the same bytes go through the page
cache, with writeback started as the file grows. Either way the file is byte for byte the same.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

ALIGN = 4096  # covers 512- and 4096-byte logical blocks, and the page size
LOCAL_DISK_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs"})
MOUNTINFO = "/proc/self/mountinfo"
WRITEBACK_BYTES = 8 << 20  # page-cache fallback: writeback is started every this many bytes
_SYNC_FILE_RANGE_WRITE = 2


def _sync_file_range() -> Callable[..., int] | None:
    """Linux's sync_file_range, which starts writeback without waiting (None elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
        fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
        return fn
    return None


_START_WRITEBACK = _sync_file_range()


def file_system(fd: int, mountinfo: str = MOUNTINFO) -> str | None:
    """The type of the file system holding ``fd`` (``ext4``, ``nfs4`` …), from the mount
    whose device is the file's; None when no mount matches or there is no mount table."""
    st = os.fstat(fd)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == dev and " - " in line:
                    return line.split(" - ", 1)[1].split()[0]
    except OSError:
        return None
    return None


def set_direct(fd: int, on: bool) -> bool:
    """Turn ``O_DIRECT`` on or off for ``fd``; whether it is now on."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags | flag) if on else (flags & ~flag))
    except OSError:
        return False
    return on


class Digest(Protocol):
    """What AppendWriter keeps up to date with the bytes appended: a hashlib object."""

    def update(self, data: memoryview, /) -> None: ...


def _buffer(size: int) -> mmap.mmap:
    """A page-aligned buffer of at least ``size`` bytes (whole ALIGN blocks)."""
    return mmap.mmap(-1, max(ALIGN, -(-size // ALIGN) * ALIGN), flags=mmap.MAP_PRIVATE)


class AppendWriter:
    """Append to the (empty) file open as ``fd``: ``write(pieces, size)`` copies them into the
    current buffer and returns a view of them (valid until the next call); its whole blocks
    are then written by a thread while the next call fills the other buffer. ``close()``
    writes the rest and waits. A write's OSError is raised by the next call. ``digest`` (a
    hashlib object) is updated with every byte appended, in order, on the same thread: the
    checksum of a shard costs the caller nothing while it converts the next images.
    """

    def __init__(self, fd: int, capacity: int, direct: bool = True,
                 digest: Digest | None = None) -> None:
        self.fd = fd
        self.digest = digest
        self.direct = direct and file_system(fd) in LOCAL_DISK_FS and set_direct(fd, True)
        self._bufs = [_buffer(capacity), _buffer(capacity)]
        self._fill = 0  # bytes in the current buffer, a carried partial block first
        self._offset = 0  # file offset of the current buffer's first byte
        self._synced = 0  # page-cache fallback: bytes whose writeback was started
        self._thread: threading.Thread | None = None
        self._error: OSError | None = None

    def write(self, pieces: Sequence[bytes], size: int) -> memoryview:
        """Append ``pieces`` (``size`` bytes in all)."""
        buf, start = self._room(size)
        pos = start
        for p in pieces:
            n = len(p)
            buf[pos:pos + n] = p
            pos += n
        if pos != start + size:
            raise ValueError(f"pieces of {pos - start} bytes, said to be {size}")
        return self._commit(buf, start, pos)

    def copy_from(self, fd: int, size: int) -> None:
        """Append the first ``size`` bytes of the file open as ``fd``, read straight into the
        buffer (a piece of the file written elsewhere)."""
        done, most = 0, len(self._bufs[0]) - ALIGN
        while done < size:
            n = min(size - done, most)
            buf, start = self._room(n)
            with memoryview(buf) as view:
                got = os.preadv(fd, [view[start:start + n]], done)
            if got != n:
                raise OSError(f"short read of a piece: {got} bytes at {done}, not {n}")
            self._commit(buf, start, start + n).release()
            done += n

    def _room(self, size: int) -> tuple[mmap.mmap, int]:
        """The current buffer, grown to take ``size`` more bytes, and where they go."""
        self._wait()
        start = self._fill
        end = start + size
        if end > len(self._bufs[0]):  # a sample larger than the buffer: grow it
            bigger = _buffer(2 * end)
            bigger[:start] = self._bufs[0][:start]
            self._bufs[0] = bigger
        return self._bufs[0], start

    def _commit(self, buf: mmap.mmap, start: int, end: int) -> memoryview:
        """Bytes ``[start, end)`` of ``buf`` are filled: hand its whole blocks to the thread
        (the digest takes the new bytes there) and return a view of the new bytes."""
        whole = end - end % ALIGN
        if whole:
            view = memoryview(buf)[:whole]
            new = memoryview(buf)[start:end]
            self._thread = threading.Thread(target=self._hash_write,
                                            args=(new, view, self._offset),
                                            name="imgprep-append", daemon=True)
            self._thread.start()
            self._bufs[1][:end - whole] = buf[whole:end]  # the partial block goes first next
            self._bufs.reverse()
            self._offset += whole
            self._fill = end - whole
        else:
            self._fill = end
            if self.digest is not None:
                self.digest.update(memoryview(buf)[start:end])
        return memoryview(buf)[start:end]

    def close(self) -> None:
        """Write what is left (through the page cache: it is less than a block) and wait."""
        self._wait()
        if self._fill:
            set_direct(self.fd, False)
            self.direct = False
            self._write_at(memoryview(self._bufs[0])[:self._fill], self._offset)
            self._fill = 0
            self._raise()

    def abort(self) -> None:
        """Wait for the write in flight and drop any error: the file is being discarded
        (its descriptor must not close under the thread)."""
        self._join()
        self._error = None

    def _wait(self) -> None:
        self._join()
        self._raise()

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _hash_write(self, new: memoryview, view: memoryview, offset: int) -> None:
        """On the thread: the digest takes the ``new`` bytes, then ``view`` is written."""
        try:
            if self.digest is not None:
                self.digest.update(new)
        finally:
            new.release()
        self._write_at(view, offset)

    def _write_at(self, view: memoryview, offset: int) -> None:
        """Write all of ``view`` at ``offset`` (on the thread); the first refusal of
        ``O_DIRECT`` switches to the page cache for good and writes the same bytes again."""
        try:
            done = 0
            while done < len(view):
                try:
                    done += os.pwrite(self.fd, view[done:], offset + done)
                except OSError as e:
                    if not (self.direct and e.errno == errno.EINVAL):
                        raise
                    self.direct = set_direct(self.fd, False)
            end = offset + len(view)
            if not self.direct and _START_WRITEBACK is not None \
                    and end - self._synced >= WRITEBACK_BYTES:
                _START_WRITEBACK(self.fd, self._synced, 0, _SYNC_FILE_RANGE_WRITE)
                self._synced = end
        except OSError as e:
            self._error = e
        finally:
            view.release()
