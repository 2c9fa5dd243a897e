"""The copy engine of stage-to-node: move shard bytes onto node-local disk, checked.

Shards come from a source (imgprep.stage.remote): a folder (copied in the kernel where the file
systems allow it), a URL (streamed through webdataset's openers) or an S3 store (ranged GETs in
parallel parts, imgprep.stage.s3), the last two hashed as they stream in.

Every copy streams through a temporary name beside its final one, is checked against the
manifest (size always, sha256 unless told "size"), fsynced and renamed: a crash, a full disk or
a corrupt source never leaves a bad file under a shard's final name. Copies run on a small
thread pool (imgprep.stage.pool) whose first error stops the others cleanly.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from imgprep.errors import StageError
from imgprep.fsutil import sha256_file, tmp_name
from imgprep.shards.manifest import IndexEntry, ShardEntry
from imgprep.stage.localdisk import DISK_FULL, open_tmp, write_error
from imgprep.stage.plan import PlannedShard
from imgprep.stage.pool import CopyWatch, Progress, Stopped, parallel
from imgprep.stage.remote import FetchFailed, Source


class _Longer(Exception):
    """A streamed file is longer than its manifest says: stop reading it."""


def copy_all(files: Sequence[PlannedShard], dst: Path, verify: str, chunk: int, node: int,
             tick: Progress, jobs: int, stall: float) -> int:
    """``copy_shard`` every planned shard on ``jobs`` threads; stops with a StageError naming
    the files (URLs for remote sources) when no byte moved for ``stall`` seconds. Returns the
    bytes read."""
    stop = threading.Event()
    watch = CopyWatch(stall, node, tick)

    def copy(f: PlannedShard) -> int:
        origin = f.plan.origin
        name = f.entry.name if origin.folder is not None else origin.where(f.entry.name)
        return watch.copying(name, lambda: copy_shard(
            origin, f.plan.source, f.entry, dst, verify, chunk, node, watch.tick, stop))

    return sum(parallel(copy, files, jobs, stop, watch.stuck))


def _write_all(fd: int, data: bytes | memoryview) -> None:
    """os.write until all of ``data`` is written (a write may be partial)."""
    view = memoryview(data)
    while len(view):
        view = view[os.write(fd, view):]


def hash_file(path: Path, chunk: int, stop: threading.Event) -> str:
    """The sha256 of ``path``; raises Stopped as soon as ``stop`` is set."""

    def check() -> None:
        if stop.is_set():
            raise Stopped

    return sha256_file(path, chunk, check)


_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.ETXTBSY)


def _transfer(src: int, dst: int, expected: int, chunk: int, stop: threading.Event,
              tick: Progress) -> int:
    """Copy ``src`` to ``dst`` from their current offsets, in the kernel (copy_file_range,
    as GNU cp does: no trip through user space) where the file systems allow it, else with
    large reads and writes. Stops one chunk past ``expected`` (enough to tell a longer
    source). Returns the bytes copied."""
    n = 0
    in_kernel = hasattr(os, "copy_file_range")
    while n <= expected:
        if stop.is_set():
            raise Stopped
        if in_kernel:
            try:
                k = os.copy_file_range(src, dst, chunk)
            except OSError as err:
                if err.errno not in _NO_KERNEL_COPY:
                    raise
                in_kernel = False  # offsets have advanced by what was copied: go on from there
                continue
        else:
            data = os.read(src, chunk)
            k = len(data)
            _write_all(dst, data)
        if not k:
            break
        n += k
        tick(k)
    return n


def present(path: Path, e: ShardEntry | IndexEntry, verify: str, chunk: int, trusted: bool,
            stop: threading.Event) -> bool:
    """Whether ``path`` already holds shard ``e``: its size, and its sha256 unless verify is
    "size" or a done-marker of this plan vouches for it (``trusted``)."""
    try:
        if not path.is_file() or path.stat().st_size != e.bytes:
            return False
        return trusted or verify == "size" or hash_file(path, chunk, stop) == e.sha256
    except OSError:
        return False  # unreadable: copy it again


def _read_error(err: OSError, src: str, manifest: str, node: int) -> StageError:
    if isinstance(err, FetchFailed) and err.advice:  # the source knows the next step
        return StageError(f"node {node}: cannot read source shard {src} (listed in "
                          f"{manifest}): {err.strerror}; {err.advice}")
    if isinstance(err, FileNotFoundError):
        return StageError(f"node {node}: source shard {src} vanished (listed in "
                          f"{manifest}); restore it or reconvert, then rerun to resume")
    return StageError(f"node {node}: cannot read source shard {src}: {err.strerror or err}; "
                      "check the file server (the URL or command), then rerun to resume")


def _pull(origin: Source, e: ShardEntry | IndexEntry, fd: int, chunk: int,
          stop: threading.Event, tick: Progress) -> tuple[int, str | None]:
    """Read file ``e`` of ``origin`` into ``fd``: by path for a folder (in the kernel where it
    can be), else streamed, hashed as it streams in. Stops one chunk past the manifest's size.
    Returns the bytes read and, streamed, their sha256."""
    if origin.folder is not None:
        with open(origin.folder / e.name, "rb", buffering=0) as fin:
            with contextlib.suppress(OSError, AttributeError):
                os.posix_fadvise(fin.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            return _transfer(fin.fileno(), fd, e.bytes, chunk, stop, tick), None
    h = hashlib.sha256()
    n = 0
    with contextlib.suppress(_Longer), origin.open(e.name) as fin:
        while True:  # leaving the block normally checks that the fetch ended well
            if stop.is_set():
                raise Stopped
            if not (block := fin.read(chunk)):
                break
            h.update(block)
            _write_all(fd, block)
            n += len(block)
            tick(len(block))
            if n > e.bytes:
                raise _Longer  # stops the fetch: the size check says what is wrong
    return n, h.hexdigest()


def _check(n: int, got: str | None, e: ShardEntry | IndexEntry, src: str, manifest: str,
           tmp: Path, verify: str, chunk: int, node: int, stop: threading.Event) -> None:
    """The copy at ``tmp`` (``n`` bytes; ``got``: its sha256 if known) is shard ``e``, or a
    StageError. A copy from a folder is hashed as it landed (from the page cache): the source
    is read once, and what is checked is what will be used."""
    if n != e.bytes:
        raise StageError(
            f"node {node}: source shard {src} has {'over ' if n > e.bytes else ''}{n} bytes, "
            f"its manifest {manifest} says {e.bytes}: the file server's copy is corrupt or "
            "was rewritten; reconvert or restore it, then rerun")
    if verify != "sha256":
        return
    if (got := got or hash_file(tmp, chunk, stop)) != e.sha256:
        raise StageError(
            f"node {node}: source shard {src} does not match its manifest {manifest} "
            f"(sha256 {got[:12]}... != {e.sha256[:12]}...): the file server's copy is "
            "corrupt; reconvert or restore it, then rerun")


def copy_shard(origin: Source, manifest: str, e: ShardEntry | IndexEntry, dst: Path,
               verify: str, chunk: int, node: int, tick: Progress, stop: threading.Event) -> int:
    """Copy file ``e`` of ``origin`` (listed in ``manifest``) to its temporary name in ``dst``
    (read once), check its size and sha256 against the manifest, fsync, rename. Returns the
    bytes read. ``dst/<name>`` is never bad."""
    final = dst / e.name
    src = origin.where(e.name)
    tmp = tmp_name(final)
    try:
        try:
            fd = open_tmp(final)
        except OSError as err:
            raise write_error(err, e.name, dst, node) from err
        try:
            try:
                n, got = _pull(origin, e, fd, chunk, stop, tick)
            except (FileNotFoundError, FetchFailed) as err:
                raise _read_error(err, src, manifest, node) from err
            except OSError as err:
                if err.errno in DISK_FULL:
                    raise write_error(err, e.name, dst, node) from err
                raise StageError(f"node {node}: copying {src} to {dst} failed: "
                                 f"{err.strerror or err}; check the file server and that "
                                 "folder, then rerun to resume") from err
            _check(n, got, e, src, manifest, tmp, verify, chunk, node, stop)
            try:
                os.fsync(fd)
            except OSError as err:
                raise write_error(err, e.name, dst, node) from err
        finally:
            os.close(fd)
        try:
            os.replace(tmp, final)
        except OSError as err:
            raise write_error(err, e.name, dst, node) from err
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return n


def copy_index(ix: IndexEntry | None, origin: Source, manifest: str, dst: Path, chunk: int,
               node: int) -> int:
    """Copy a split's sample index (if it has one) from ``origin``, checked by its sha256
    like a shard; returns the bytes read. Small: every node reads it, fan-out or not."""
    stop = threading.Event()
    if ix is None or present(dst / ix.name, ix, "sha256", chunk, False, stop):
        return 0
    return copy_shard(origin, manifest, ix, dst, "sha256", chunk, node, lambda k: None, stop)
