"""The spool: inputs without per-image random access, copied once into staging files that
convert then reads by offset like any source.

A parquet file can be read only a row group (~100 images) at a time and a tar.gz only as one
gzip stream, while a shard's images come, in the seeded order, from every source file. So
each such source file is spooled once: its images, in source order, go into one spool file in
the split's state folder (``<out>/.imgprep/<split>/spool/``, passed in by the caller). That
is the one copy of the input a conversion makes; it costs about the size of the source files
on disk and is removed when the split's manifest is written.

A spool file holds the images back to back, then its index (per image: size as ``<u8``,
name length as ``<u4``, then the names, UTF-8), the images refused instead of stored (their
count as ``<u8``, then per refusal the image's place as ``<u8`` and the reason's length as
``<u4``, then the reasons, UTF-8), the stamp of its source (name, size and modification
time, and the image size cap it was read with: a spool is reused only for the very file and
cap it was made from) and a 48-byte footer (``MAGIC``, image count, data length, names
length, refusals length, stamp length, each ``<u8``). The same source gives the same bytes.

Bounded memory: a job's reader is given the cap (``SpoolJob.max_bytes``, the run's
``--max-image-bytes``) and yields ``Refused`` instead of the bytes of an image whose recorded
size is over it, before reading it (a tar.gz member by its header, a parquet cell by its row
group's column statistics and its length); such an image takes no bytes in the spool, and
the form lists it as an error with the reason.

Crash safety and sharing: a spool file is written under an ``flock`` on its lock file (which
dies with its holder) to a temporary name, fsynced and renamed; a file whose footer checks is
finished. A rerun after ``kill -9`` keeps the finished files and redoes only the one cut
short. Several processes (the workers of one rank, the ranks of a job) share the work:
each starts at its own file (``start``), skips files that are finished or being written,
then waits for those (redoing one whose writer died), so every file is written once. Where
the file system has no ``flock``, each writer uses a temporary name of its own: writers
that race write the same bytes, and the last rename wins.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import multiprocessing as mp
import os
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from imgprep.errors import WaitTimeout
from imgprep.fsutil import TMP_PREFIX, atomic_open, ensure_writable_dir, fsync_dir
from imgprep.job.cpus import rank_cores, read_limits
from imgprep.procs import die_with_parent

MAGIC = b"IMGSPOL2"  # version 2: with refusals and the cap in the stamp
FOOTER = struct.Struct("<8sQQQQQ")
SPOOL_DIR = "spool"  # the spool folder's name in a split's state folder
SUFFIX = ".spool"
LOCK_PREFIX = ".lock-"
POLL_S = 0.5
NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP}  # flock unsupported
CHUNK = 1 << 20


@dataclass(frozen=True)
class Refused:
    """What a spool reader yields instead of an image it must not read (why, in a phrase
    that follows the image's name)."""

    reason: str


Item = tuple[str, bytes | Refused]  # an image's name, and its bytes or why it is refused
Items = Callable[[Path, int | None], Iterator[Item]]  # (source, cap) -> its items, in order


@dataclass(frozen=True, kw_only=True)
class SpoolJob:
    """One source file to spool: ``read(source, max_bytes)`` yields its images, refusing
    those over ``max_bytes`` (None: no cap, for members that are not images); ``spool`` is
    the finished spool file's path. ``read`` is a module-level function (it crosses a
    fork)."""

    source: Path
    spool: Path
    read: Items
    max_bytes: int | None = None


@dataclass(frozen=True)
class SpoolIndex:
    """The images of a finished spool file: item i is ``size[i]`` bytes at ``offset[i]``,
    unless ``refused`` ({item: why}) holds it (then no bytes)."""

    path: Path
    names: tuple[str, ...]
    offset: np.ndarray
    size: np.ndarray
    refused: dict[int, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.names)


def spool_path(folder: Path, index: int, source: Path) -> Path:
    """Where the spool of the ``index``-th source file goes (the index keeps two sources
    of the same name apart)."""
    return folder / f"{index:05d}-{source.name}{SUFFIX}"


def source_stamp(source: Path, max_bytes: int | None = None) -> bytes:
    """What identifies a source file for its spool: name, size, modification time, and the
    image size cap it is read with."""
    st = source.stat()
    cap = "" if max_bytes is None else f"\0{max_bytes}"
    return f"{source.name}\0{st.st_size}\0{st.st_mtime_ns}{cap}".encode()


@contextlib.contextmanager
def _private_open(final: Path) -> Iterator[IO[bytes]]:
    """``atomic_open`` with a temporary name of this process's own, for file systems without
    ``flock``: writers that race each write their own file and rename the same bytes."""
    tmp = final.with_name(f"{TMP_PREFIX}{final.name}.{socket.gethostname()}-{os.getpid()}")
    try:
        with open(tmp, "wb", opener=lambda p, fl: os.open(p, fl | os.O_NOFOLLOW, 0o644)) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(final.parent)


def write_spool(path: Path, items: Iterator[Item], stamp: bytes = b"",
                private: bool = False) -> int:
    """Write ``items`` as the spool file ``path`` (temporary name, fsync, rename) of the
    source ``stamp`` names; returns how many images it holds (refused ones included).
    ``private``: under a temporary name of this process's own (no lock guards the shared
    one)."""
    sizes: list[int] = []
    names: list[bytes] = []
    refused: dict[int, bytes] = {}
    with (_private_open(path) if private else atomic_open(path)) as f:
        for name, data in items:
            if isinstance(data, Refused):
                refused[len(sizes)] = data.reason.encode("utf-8")
                data = b""
            f.write(data)
            sizes.append(len(data))
            names.append(name.encode("utf-8"))
        f.write(np.asarray(sizes, dtype="<u8").tobytes())
        f.write(np.asarray([len(n) for n in names], dtype="<u4").tobytes())
        f.write(b"".join(names))
        block = _refusals_block(refused)
        f.write(block)
        f.write(stamp)
        f.write(FOOTER.pack(MAGIC, len(sizes), sum(sizes), sum(len(n) for n in names),
                            len(block), len(stamp)))
    return len(sizes)


def _refusals_block(refused: dict[int, bytes]) -> bytes:
    places = sorted(refused)
    return b"".join((struct.pack("<Q", len(places)),
                     np.asarray(places, dtype="<u8").tobytes(),
                     np.asarray([len(refused[i]) for i in places], dtype="<u4").tobytes(),
                     *(refused[i] for i in places)))


def _refusals(raw: bytes) -> dict[int, str]:
    """The refusals block read back: {image place: reason}."""
    count, = struct.unpack_from("<Q", raw)
    places = np.frombuffer(raw, dtype="<u8", count=count, offset=8).tolist()
    lengths = np.frombuffer(raw, dtype="<u4", count=count, offset=8 + 8 * count).tolist()
    at, out = 8 + 12 * count, {}
    for place, n in zip(places, lengths, strict=True):
        out[int(place)] = raw[at:at + n].decode("utf-8")
        at += n
    if at != len(raw):
        raise OSError("its refusals do not add up")
    return out


def _footer(fd: int, total: int) -> tuple[int, int, int, int, bytes] | None:
    """(count, data length, names length, refusals length, stamp) when the file's footer and
    length agree."""
    if total < FOOTER.size:
        return None
    magic, count, data, names, refused, stamp = FOOTER.unpack(
        os.pread(fd, FOOTER.size, total - FOOTER.size))
    if magic != MAGIC or data + 12 * count + names + refused + stamp + FOOTER.size != total:
        return None
    return count, data, names, refused, os.pread(fd, stamp, total - FOOTER.size - stamp)


def is_finished(path: Path, stamp: bytes | None = None) -> bool:
    """Whether ``path`` is a complete spool file (of the source ``stamp`` names, when
    given)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        found = _footer(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    return found is not None and (stamp is None or found[4] == stamp)


def read_index(path: Path) -> SpoolIndex:
    """The index of the finished spool file ``path`` (OSError when it is not one)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        found = _footer(fd, os.fstat(fd).st_size)
        if found is None:
            raise OSError(f"{path} is not a finished spool file; rerun the same command")
        count, data, names_len, refused_len, _ = found
        raw = os.pread(fd, 12 * count + names_len + refused_len, data)
    finally:
        os.close(fd)
    size = np.frombuffer(raw, dtype="<u8", count=count).astype(np.int64)
    lengths = np.frombuffer(raw, dtype="<u4", count=count, offset=8 * count)
    broken = OSError(f"{path}: its index does not add up; remove it and rerun")
    try:
        refused = _refusals(raw[12 * count + names_len:])
    except (OSError, ValueError, struct.error) as e:
        raise broken from e
    if int(size.sum()) != data or int(lengths.sum()) != names_len or \
            not all(0 <= i < count for i in refused):
        raise broken
    ends = np.cumsum(lengths, dtype=np.int64) + 12 * count
    starts = ends - lengths
    names = tuple(raw[s:e].decode("utf-8") for s, e in zip(starts.tolist(), ends.tolist(),
                                                           strict=True))
    offset = np.concatenate(([0], np.cumsum(size)[:-1])).astype(np.int64) if count else size
    return SpoolIndex(path, names, offset, size, refused)


@contextlib.contextmanager
def _locked(path: Path, wait: bool) -> Iterator[bool | None]:
    """Hold the lock of the spool file ``path``; yields False (at once) when another
    process holds it and ``wait`` is off, None where the file system has no ``flock``
    (Lustre mounted without it, some NFS set-ups)."""
    fd = os.open(path.with_name(f"{LOCK_PREFIX}{path.name}"),
                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        except OSError as e:
            if e.errno not in NO_LOCKS:
                raise
            yield None
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def spool_one(job: SpoolJob, wait: bool = False) -> bool:
    """Spool ``job`` unless it is finished; False when another process is writing it (and
    ``wait`` is off). Raises what reading the source raises (the spool is left unwritten)."""
    stamp = source_stamp(job.source, job.max_bytes)
    if is_finished(job.spool, stamp):
        return True
    with _locked(job.spool, wait) as held:
        if held is False:
            return False
        if not is_finished(job.spool, stamp):  # finished by the holder we waited for
            write_spool(job.spool, job.read(job.source, job.max_bytes), stamp,
                        private=held is None)
    return True


def _first_pass(job: SpoolJob) -> bool:
    return spool_one(job, wait=False)


def _map(fn: Callable[[SpoolJob], bool], jobs: list[SpoolJob], workers: int) -> list[bool]:
    """``fn`` over ``jobs`` in order, on forked processes when there are several (in this
    process when it is a daemon, which may not have children)."""
    n = min(len(jobs), workers)
    if n <= 1 or mp.current_process().daemon:
        return [fn(j) for j in jobs]
    with mp.get_context("fork").Pool(n, die_with_parent, (os.getpid(),)) as pool:
        return pool.map(fn, jobs, chunksize=1)


def spool_all(jobs: list[SpoolJob], workers: int | None = None, start: int = 0,
              wait_timeout: float = 3600.0) -> int:
    """Make sure every job's spool file is finished, spooling the missing ones on
    ``workers`` processes (default: the cores this process may use), beginning at job
    ``start`` (a rank's own place, so that ranks share the work); returns how many this
    call wrote or found finished by others. Files another process is writing are waited
    for, up to ``wait_timeout`` seconds in all, and redone when their writer died."""
    if not jobs:
        return 0
    ensure_writable_dir(jobs[0].spool.parent)
    k = start % len(jobs)
    todo = [j for j in jobs[k:] + jobs[:k]
            if not is_finished(j.spool, source_stamp(j.source, j.max_bytes))]
    n = workers or rank_cores(read_limits(), 1)
    done = _map(_first_pass, todo, n)
    held = [j for j, ok in zip(todo, done, strict=True) if not ok]
    deadline = time.monotonic() + wait_timeout
    while held:
        if time.monotonic() > deadline:
            raise WaitTimeout(
                f"waited {wait_timeout:.0f} s for another process to spool {held[0].source} "
                f"into {held[0].spool.parent}; check that the other ranks of the job are "
                "running, then rerun the same command")
        time.sleep(POLL_S)
        held = [j for j, ok in zip(held, _map(_first_pass, held, n), strict=True) if not ok]
    return len(todo)


def spool_bytes(jobs: list[SpoolJob]) -> int:
    """About how many bytes the unfinished spool files will take: their sources' sizes (JPEG
    bytes do not compress, so a tar.gz or parquet file is about as big as its images)."""
    return sum(j.source.stat().st_size for j in jobs
               if not is_finished(j.spool, source_stamp(j.source, j.max_bytes)))


@dataclass(frozen=True)
class Kept:
    """What a spool folder holds after ``tidy_spool``: finished spool files and their
    bytes."""

    folder: Path
    files: int
    bytes: int


def tidy_spool(folder: Path, unfinished: bool = True) -> Kept:
    """After a run that failed: remove what it left unfinished in the spool ``folder`` (lock
    files no process holds, with the temporary files they guard; not when ``unfinished`` is
    off), and the folder and its split's state folder when that leaves them empty; finished
    spool files stay, for a rerun of the same input, and are counted. A lock another
    process holds (another run writing now) is left with its temporary files. Nothing
    outside ``folder`` is touched but its parent, removed only when empty."""
    if not folder.is_dir() or folder.is_symlink():
        return Kept(folder, 0, 0)
    for lock in sorted(folder.glob(f"{LOCK_PREFIX}*")) if unfinished else []:
        _remove_if_free(lock, folder / lock.name[len(LOCK_PREFIX):])
    kept = [p for p in folder.glob(f"*{SUFFIX}")
            if not p.name.startswith((TMP_PREFIX, LOCK_PREFIX)) and p.is_file()
            and not p.is_symlink()]
    size = sum(p.stat().st_size for p in kept)
    for d in (folder, folder.parent):
        with contextlib.suppress(OSError):
            d.rmdir()  # only when empty
    return Kept(folder, len(kept), size)


def _remove_if_free(lock: Path, spool: Path) -> None:
    """Remove ``lock`` and the temporary files of ``spool`` when no process holds it."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # held: its writer is alive, or locks do not work here
        for tmp in spool.parent.glob(f"{glob.escape(TMP_PREFIX + spool.name)}*"):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
    finally:
        os.close(fd)


def remove_spool(folder: Path) -> int:
    """Remove a split's spool folder (spool, temporary and lock files); returns how many
    files went. Nothing outside ``folder`` is touched; links are removed, never followed."""
    if not folder.is_dir() or folder.is_symlink():
        return 0
    n = 0
    for p in folder.iterdir():
        if p.is_file() or p.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                n += 1
    with contextlib.suppress(OSError):
        folder.rmdir()
    return n
