"""The copy engine of stage-to-node: move shard bytes onto node-local disk, checked.

Shards come from a source (imgprep.stage.remote): a folder (copied in the kernel where the file
systems allow it), a URL (streamed through webdataset's openers) or an S3 store (ranged GETs in
parallel parts, imgprep.stage.s3), the last two hashed as they stream in.

Every copy streams through a temporary name beside its final one, is checked against the
manifest (size always, sha256 unless told "size"), fsynced and renamed: a crash, a full disk or
a corrupt source never leaves a bad file under a shard's final name. Copies run on a small
thread pool whose first error stops the others cleanly.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from imgprep.errors import OutputError, StageError
from imgprep.fsutil import atomic_open, sha256_file, tmp_name
from imgprep.shards.manifest import IndexEntry, ShardEntry
from imgprep.stage.remote import FetchFailed, Source

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
POLL_S = 0.5  # how often a copier waiting on its threads asks whether they are stuck
CLEANUP_S = 10.0  # how long an interrupted copier waits for its threads to clean up
Progress = Callable[[int], None]
T = TypeVar("T")
R = TypeVar("R")


class Stopped(Exception):
    """Another copy failed or the run was interrupted: stop this one cleanly."""


class _Longer(Exception):
    """A streamed file is longer than its manifest says: stop reading it."""


def why(err: BaseException | None) -> str:
    """A short reason for an error: "disk full", the OS's words, or the message."""
    if isinstance(err, OSError):
        return "disk full" if err.errno in DISK_FULL else (err.strerror or str(err))
    return str(err)


def size_text(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def check_space(dst: Path, need: int, shards: int, node: int) -> int:
    """``need`` (bytes still to copy), or a StageError when ``dst`` has not that much free."""
    free = shutil.disk_usage(dst).free
    if free < need:
        raise StageError(f"node {node}: {dst} has {size_text(free)} free but "
                         f"{size_text(need)} ({shards} shards) still to copy; free space "
                         "or use another --dst, then rerun")
    return need


def write_small(path: Path, data: bytes, node: int, durable: bool = True) -> None:
    """Write a small file atomically; a failure is a StageError that says what to do."""
    try:
        with atomic_open(path, durable=durable) as f:
            f.write(data)
    except OutputError as e:
        raise StageError(f"node {node}: cannot write {path}: {why(e.__cause__ or e)}; free "
                         "space there or use another --dst, then rerun to resume") from e


def write_error(err: OSError, name: str, dst: Path, node: int) -> StageError:
    """The one-line error for a failed write of ``name`` into ``dst``."""
    if err.errno in DISK_FULL:
        return StageError(f"node {node}: disk full writing {name} in {dst}; free "
                          "space there or use another --dst, then rerun to resume")
    return StageError(f"node {node}: cannot write {name} in {dst}: "
                      f"{err.strerror or err}; check that folder, then rerun to resume")


def parallel(fn: Callable[[T], R], items: Sequence[T], jobs: int, stop: threading.Event,
             stuck: Callable[[], str | None] | None = None) -> list[R]:
    """``fn`` over ``items`` on ``jobs`` threads, results in order. The first error sets
    ``stop`` (running calls clean up and end), no other item starts, and it is raised.

    ``stuck()``, asked every ``POLL_S`` while calls run, may return why they hang (a read the
    file server never answers): that is raised at once as a StageError. The threads are
    daemons, so one stuck in a read cannot hold the process at exit."""
    if not items:
        return []
    results: list[Any] = [None] * len(items)
    errors: list[tuple[int, BaseException]] = []
    lock, todo, finished = threading.Lock(), iter(range(len(items))), threading.Event()
    running = [min(jobs, len(items))]

    def work() -> None:
        try:
            while not stop.is_set() and (i := _next(lock, todo)) is not None:
                try:
                    results[i] = fn(items[i])
                except BaseException as e:
                    stop.set()  # at once: no other item may start
                    with lock:
                        errors.append((i, e))
        finally:
            with lock:
                running[0] -= 1
                if not running[0]:
                    finished.set()

    for _ in range(running[0]):
        threading.Thread(target=work, name="stage", daemon=True).start()
    try:  # Event.wait, not Thread.join: a join that Ctrl-C interrupts marks the thread ended
        while not finished.wait(POLL_S):
            if stuck is not None and (why := stuck()) is not None:
                if errors:
                    break  # raise that error, without waiting for a call stuck in a read
                raise StageError(why)
    except StageError:  # stuck: waiting for the stuck call would never end
        stop.set()
        raise
    except BaseException:  # Ctrl-C: running calls see ``stop`` and clean up
        stop.set()
        finished.wait(CLEANUP_S)
        raise
    if errors:  # the first real one: the others only stopped because of it
        real = [e for _, e in sorted(errors, key=lambda ie: ie[0]) if not isinstance(e, Stopped)]
        raise (real or [errors[0][1]])[0]
    return results


def _next(lock: threading.Lock, todo: Iterator[int]) -> int | None:
    with lock:
        return next(todo, None)


@dataclass
class StallClock:
    """How long nothing moved while nobody else was waited on. A read that hangs (a dead
    file server, a stuck mount) neither fails nor ends; this is how its copier tells."""

    limit: float  # seconds without progress after which the copy counts as stuck
    mark: tuple[int, ...] = ()
    since: float = field(default_factory=time.monotonic)

    def stuck(self, progress: tuple[int, ...], on_peer: bool = False) -> float | None:
        """Seconds since ``progress`` (byte counters) last changed, once over the limit while
        not ``on_peer`` (waiting on another node, whose stall is its own to report)."""
        now = time.monotonic()
        if on_peer or progress != self.mark:
            self.mark, self.since = progress, now
            return None
        return now - self.since if now - self.since > self.limit else None


def stall_message(node: int, doing: str, idle: float) -> str:
    """The one line a copier that is stuck ``doing`` something for ``idle`` seconds says."""
    return (f"node {node}: stuck {doing}: no byte moved for {idle:.0f} s (a hung file server "
            "or disk); check it, then rerun to resume (or raise --stall-timeout)")


class CopyWatch:
    """The copy threads' bytes and the files they are on, for ``parallel``'s ``stuck``."""

    def __init__(self, limit: float, node: int, tick: Progress) -> None:
        self.clock, self.node, self.outer = StallClock(limit), node, tick
        self.moved = 0
        self.busy: dict[str, None] = {}  # files being copied, in start order
        self.lock = threading.Lock()

    def tick(self, k: int) -> None:
        with self.lock:
            self.moved += k
        self.outer(k)

    def copying(self, name: str, copy: Callable[[], R]) -> R:
        with self.lock:
            self.busy[name] = None
        try:
            return copy()
        finally:
            with self.lock:
                self.busy.pop(name, None)

    def stuck(self) -> str | None:
        if (idle := self.clock.stuck((self.moved,))) is None:
            return None
        with self.lock:
            names = ", ".join(self.busy) or "the last shards"
        return stall_message(self.node, f"copying {names} from the file server", idle)


def copy_all(files: Sequence[tuple[Source, str, ShardEntry]], dst: Path, verify: str,
             chunk: int, node: int, tick: Progress, jobs: int, stall: float) -> int:
    """``copy_shard`` every ``(origin, manifest, entry)`` on ``jobs`` threads; stops with a
    StageError naming the files (URLs for remote sources) when no byte moved for ``stall``
    seconds. Returns the bytes read."""
    stop, watch = threading.Event(), CopyWatch(stall, node, tick)
    return sum(parallel(lambda f: watch.copying(
        f[2].name if f[0].folder is not None else f[0].where(f[2].name), lambda: copy_shard(
            f[0], f[1], f[2], dst, verify, chunk, node, watch.tick, stop)), files, jobs, stop,
        watch.stuck))


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
    n, in_kernel = 0, hasattr(os, "copy_file_range")
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


def drop_stale(dst: Path, split: str, keep: set[str]) -> None:
    """Remove shards of ``split`` from ``dst`` that are not in ``keep`` (another mode or node
    count): nothing in ``dst`` may look like part of the node's data but the manifest's."""
    pattern = re.compile(re.escape(split) + r"-\d{6}\.tar")
    for p in dst.glob(f"{split}-*.tar"):
        if pattern.fullmatch(p.name) and p.name not in keep and p.is_file():
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def remove(path: Path, node: int) -> None:
    """Remove ``path`` if it is there; a file that cannot be removed stops staging."""
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        raise StageError(f"node {node}: cannot replace {path}: {e.strerror}; remove it by "
                         "hand, then rerun") from e


def open_tmp(final: Path) -> int:
    """Open ``final``'s temporary name for writing, never through a link planted there."""
    return os.open(tmp_name(final), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
                   | os.O_NOFOLLOW, 0o644)


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
    h, n = hashlib.sha256(), 0
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
    final, src = dst / e.name, origin.where(e.name)
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
