"""``imgprep stage-to-node``: copy the shards a node needs from the file server to local disk.

One process per node copies (the *copier*); the node's other processes wait for it. No MPI or
process group is involved, so it works under torchrun, mpirun, srun or a plain loop:

- With a launcher, local rank 0 copies and the other local ranks wait. ``--num-nodes`` /
  ``--node-rank`` (launcher "explicit") make each process its node's copier. With no launcher,
  processes sharing a ``dst`` race for its lock: the first copies; the others block on the lock,
  then return if the node is staged, or else finish the job themselves.
- The copier holds an exclusive ``flock`` on ``<dst>/.imgprep-stage/lock`` while it works
  (every copier takes it, so two copiers never share a ``dst``); ``copier.json`` beside it
  says who holds it (pid, parent pid, host) and how it went (copying, failed with its message,
  done). The kernel drops the lock when the copier dies.
- A done-marker per split (``done-<split>.json``) holds the plan's fingerprint: the sha256 of
  the source manifest's bytes, mode, seed, num_nodes, node_rank and verify. The node is staged
  for a plan when each split's marker has the plan's fingerprint, its node-local manifest is
  the one the marker names, and every shard has its size. A marker from another plan is void.
- A waiter stops waiting when the node is staged; fails when, for ``DEAD_GRACE`` seconds in a
  row, the lock is free, the node is not staged and ``copier.json`` names a copier of the same
  launch (same host and parent process: torchrun's agent, mpirun's daemon, slurmstepd) that is
  copying (it died) or failed; and times out after ``timeout`` seconds otherwise.

Each copy streams through a temporary name in ``dst``, hashed as it goes (the source is read
once), is checked against the manifest, fsynced and renamed: a crash, a full disk or a corrupt
source never leaves a bad file under a shard's final name, and a rerun skips what is there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from imgprep.assign import MODES, node_shards
from imgprep.errors import ImgprepError, ManifestError, OutputError, StageError, WaitTimeout
from imgprep.fsutil import atomic_open, fsync_dir, sweep_tmp, tmp_name
from imgprep.manifest import (
    Manifest,
    NodeSection,
    ShardEntry,
    find_manifests,
    manifest_path,
    parse_manifest,
    write_manifest,
)
from imgprep.world import World

VERIFY_MODES = ("sha256", "size")
STATE_DIR = ".imgprep-stage"
MARKER_VERSION = 1  # bump when a marker's meaning changes: old markers then no longer count
DEAD_GRACE = 3.0  # seconds a copier must look dead before a waiter gives up on it
POLL_MAX = 0.5  # longest sleep between two looks at the lock or the markers
PLAIN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")  # split and error-log names
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
Progress = Callable[[int], None]
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class StageOptions:
    """What ``imgprep stage-to-node`` needs; the node's files are a pure function of these."""

    src: Path  # converted folder on the shared file server (holds <split>.json manifests)
    dst: Path  # node-local folder
    mode: str = "replicate"  # or "partition" (imgprep.assign.MODES)
    split: str | None = None  # None: every manifest found in src
    seed: int = 0
    jobs: int = 2  # parallel copy streams (threads)
    verify: str = "sha256"  # or "size"
    timeout: float = 3600.0  # seconds a waiting rank waits for the copier
    chunk: int = 8 << 20  # read size: large sequential reads


@dataclass(frozen=True)
class SplitPlan:
    """One split: its source manifest, the sha256 of its bytes, the shards this node needs and
    the fingerprint a done-marker must carry to say they are staged."""

    source: Path
    manifest: Manifest
    sha256: str
    needed: tuple[ShardEntry, ...]
    fingerprint: str

    @property
    def split(self) -> str:
        return self.manifest.split


# ---------------------------------------------------------------------------- planning


def _fingerprint(manifest_sha256: str, opts: StageOptions, world: World) -> str:
    key = {"version": MARKER_VERSION, "manifest_sha256": manifest_sha256, "mode": opts.mode,
           "seed": opts.seed, "num_nodes": world.num_nodes, "node_rank": world.node_rank,
           "verify": opts.verify}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _load_split(path: Path, opts: StageOptions, world: World) -> SplitPlan:
    """Read one source manifest (once: the bytes hashed are the bytes parsed) and plan it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(f"no manifest {path}: that split was not converted (or not "
                            "finished); run imgprep convert or pick another --split") from None
    except OSError as e:
        raise ManifestError(f"cannot read manifest {path}: {e.strerror}; check the file "
                            "server and rerun") from e
    try:
        decoded = json.loads(data)
    except ValueError as e:
        raise ManifestError(f"{path} is not valid JSON ({e}); reconvert or restore it") from e
    m = parse_manifest(decoded, str(path))
    if m.format != "shards":
        raise StageError(f"{path} describes a label list; stage-to-node copies shards only: "
                         "convert with --format shards")
    if m.node is not None:
        raise StageError(f"{path} is node {m.node.node_rank}'s manifest (only its shards); "
                         "stage from the full conversion on the file server")
    if not PLAIN_NAME.match(m.split) or (m.error_log and not PLAIN_NAME.match(m.error_log)):
        raise ManifestError(f"{path}: split {m.split!r} or error log {m.error_log!r} is not a "
                            "plain file name; reconvert or restore the manifest")
    picked = node_shards([s.samples for s in m.shards], world.num_nodes, opts.mode,
                         opts.seed)[world.node_rank]
    sha = hashlib.sha256(data).hexdigest()
    return SplitPlan(path, m, sha, tuple(m.shards[i] for i in picked),
                     _fingerprint(sha, opts, world))


def plan_node(opts: StageOptions, world: World) -> list[SplitPlan]:
    """What this node needs, from the source manifest(s) alone (no tar is opened)."""
    paths = [manifest_path(opts.src, opts.split)] if opts.split else find_manifests(opts.src)
    if not paths:
        raise ManifestError(f"no manifest in {opts.src}: the conversion did not finish, or "
                            "--src is not a converted folder; run imgprep convert first")
    plan = [_load_split(p, opts, world) for p in paths]
    splits = [sp.split for sp in plan]
    names = [e.name for sp in plan for e in sp.manifest.shards]
    if len(set(splits)) != len(splits) or len(set(names)) != len(names):
        raise ManifestError(f"the manifests in {opts.src} ({', '.join(p.name for p in paths)}) "
                            "repeat a split or a shard name; pick one with --split")
    return plan


def node_manifest(sp: SplitPlan, opts: StageOptions, world: World) -> Manifest:
    """The source manifest cut down to this node's shards, saying which part of what it is."""
    m = sp.manifest
    return replace(m, shards=list(sp.needed), total_samples=sum(e.samples for e in sp.needed),
                   node=NodeSection(world.node_rank, world.num_nodes, opts.mode, opts.seed,
                                    m.total_samples, len(m.shards),
                                    tuple((e.name, e.samples) for e in m.shards)))


# ---------------------------------------------------------------------------- state files


def _state(dst: Path) -> Path:
    return dst / STATE_DIR


def _marker_path(dst: Path, split: str) -> Path:
    return _state(dst) / f"done-{split}.json"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def _marker_matches(sp: SplitPlan, dst: Path) -> dict[str, Any] | None:
    marker = _read_json(_marker_path(dst, sp.split))
    if isinstance(marker, dict) and marker.get("fingerprint") == sp.fingerprint:
        return marker
    return None


def is_staged(plan: Sequence[SplitPlan], dst: Path) -> bool:
    """Whether ``dst`` holds ``plan``: markers of this plan, their node manifests, and every
    shard at its size (cheap enough to poll; the copier checked the bytes before the marker)."""
    for sp in plan:
        marker = _marker_matches(sp, dst)
        if marker is None:
            return False
        try:
            data = manifest_path(dst, sp.split).read_bytes()
            if hashlib.sha256(data).hexdigest() != marker.get("manifest_sha256"):
                return False
            if any((dst / e.name).stat().st_size != e.bytes for e in sp.needed):
                return False
        except OSError:
            return False
    return True


def _why(err: BaseException | None) -> str:
    if isinstance(err, OSError):
        return "disk full" if err.errno in DISK_FULL else (err.strerror or str(err))
    return str(err)


def _write_small(path: Path, data: bytes, node: int, durable: bool = True) -> None:
    """Write a small file atomically; a failure is a StageError that says what to do."""
    try:
        with atomic_open(path, durable=durable) as f:
            f.write(data)
    except OutputError as e:
        raise StageError(f"node {node}: cannot write {path}: {_why(e.__cause__ or e)}; free "
                         "space there or use another --dst, then rerun to resume") from e


def _record(dst: Path, world: World, state: str, error: str | None = None) -> None:
    """Say in ``copier.json`` who holds the lock and how it is going (for the waiters)."""
    rec = {"pid": os.getpid(), "ppid": os.getppid(), "host": socket.gethostname(),
           "rank": world.rank, "node_rank": world.node_rank, "state": state, "error": error,
           "time": time.time()}
    _write_small(_state(dst) / "copier.json", json.dumps(rec).encode(), world.node_rank,
                 durable=False)


def _holder(dst: Path) -> str:
    rec = _read_json(_state(dst) / "copier.json")
    if isinstance(rec, dict):
        return f" (held by pid {rec.get('pid')} on {rec.get('host')})"
    return ""


# ---------------------------------------------------------------------------- lock


def _lock_path(dst: Path) -> Path:
    return _state(dst) / "lock"


def _try_lock(fd: int, dst: Path, node: int) -> bool:
    """Take the exclusive lock if nobody holds it; False when another process does."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:
        raise StageError(f"node {node}: cannot lock {_lock_path(dst)}: {e.strerror}; use "
                         "a local file system for --dst") from e
    return True


def _acquire(fd: int, dst: Path, deadline: float, node: int, timeout: float) -> None:
    """Take the exclusive lock, polling until ``deadline`` (a monotonic time)."""
    delay = 0.05
    while not _try_lock(fd, dst, node):
        now = time.monotonic()
        if now >= deadline:
            raise WaitTimeout(
                f"node {node}: waited {timeout:g} s for the lock {_lock_path(dst)}"
                f"{_holder(dst)} to stage into {dst}; let that process finish or stop it, "
                "then rerun (or raise --timeout)")
        time.sleep(min(delay, deadline - now))
        delay = min(delay * 1.5, POLL_MAX)


def _lock_free(dst: Path) -> bool:
    """Whether no process holds the copier's lock (probed with a shared lock, released at once;
    a waiter creates nothing in ``dst``)."""
    try:
        fd = os.open(_lock_path(dst), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops the probe's lock


def _copier_gone(dst: Path, world: World) -> str | None:
    """Why this launch's copier will never finish (dead or failed), or None if it still may."""
    if not _lock_free(dst):
        return None
    rec = _read_json(_state(dst) / "copier.json")
    if not isinstance(rec, dict) or rec.get("host") != socket.gethostname() \
            or rec.get("ppid") != os.getppid():
        return None  # no copier of this launch has started yet
    who = f"copier (local rank 0, pid {rec.get('pid')}) of node {world.node_rank}"
    if rec.get("state") == "failed":
        return f"{who} failed staging into {dst}: {rec.get('error')}"
    if rec.get("state") == "copying":
        return f"{who} died before finishing staging into {dst}; rerun the job to resume"
    return None


def _wait(plan: Sequence[SplitPlan], opts: StageOptions, world: World, t0: float) -> None:
    """Wait for this node's copier to stage ``plan``; fail early if it died or failed."""
    deadline, delay, gone_since = t0 + opts.timeout, 0.05, None
    while not is_staged(plan, opts.dst):
        now = time.monotonic()
        why = _copier_gone(opts.dst, world)
        if why is None:
            gone_since = None
        elif gone_since is None:
            gone_since = now
        elif now - gone_since >= DEAD_GRACE:
            raise StageError(why)
        if now >= deadline:
            state = "is still copying" if not _lock_free(opts.dst) else \
                "never started, or runs in another launch"
            raise WaitTimeout(
                f"node {world.node_rank}: waited {opts.timeout:g} s for the copier (local rank "
                f"0) to stage into {opts.dst}; it {state}: check local rank 0's output, then "
                "rerun the job to resume (or raise --timeout)")
        time.sleep(min(delay, max(deadline - now, 0.01)))
        delay = min(delay * 1.5, POLL_MAX)


# ---------------------------------------------------------------------------- copying


class _Stopped(Exception):
    """Another copy failed or the run was interrupted: stop this one cleanly."""


def _parallel(fn: Callable[[T], R], items: Sequence[T], jobs: int,
              stop: threading.Event) -> list[R]:
    """``fn`` over ``items`` on ``jobs`` threads, results in order. The first error sets
    ``stop`` (running calls clean up and end), cancels the rest and is raised."""
    if not items:
        return []

    def guarded(item: T) -> R:
        if stop.is_set():
            raise _Stopped
        try:
            return fn(item)
        except BaseException:
            stop.set()  # at once: this thread's next item must not start
            raise

    ex = ThreadPoolExecutor(max_workers=min(jobs, len(items)), thread_name_prefix="stage")
    futures = [ex.submit(guarded, item) for item in items]
    try:
        wait(futures, return_when=FIRST_EXCEPTION)
    except BaseException:  # Ctrl-C while waiting
        stop.set()
        raise
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
    errors = [e for f in futures if not f.cancelled() and (e := f.exception()) is not None]
    if errors:  # the first real one: the others only stopped because of it
        raise next((e for e in errors if not isinstance(e, _Stopped)), errors[0])
    return [f.result() for f in futures]


def _write_all(fd: int, data: bytes) -> None:
    """os.write until all of ``data`` is written (a write may be partial)."""
    view = memoryview(data)
    while len(view):
        view = view[os.write(fd, view):]


def _hash_file(path: Path, chunk: int, stop: threading.Event) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(chunk):
            if stop.is_set():
                raise _Stopped
            h.update(block)
    return h.hexdigest()


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
            raise _Stopped
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


def _present(path: Path, e: ShardEntry, opts: StageOptions, trusted: bool,
             stop: threading.Event) -> bool:
    """Whether ``path`` already holds shard ``e``: its size, and its sha256 unless verify is
    "size" or a done-marker of this plan vouches for it (``trusted``)."""
    try:
        if not path.is_file() or path.stat().st_size != e.bytes:
            return False
        return trusted or opts.verify == "size" or _hash_file(path, opts.chunk, stop) == e.sha256
    except OSError:
        return False  # unreadable: copy it again


def _copy_shard(sp: SplitPlan, e: ShardEntry, opts: StageOptions, node: int, tick: Progress,
                stop: threading.Event) -> int:
    """Copy the source shard to its temporary name in ``dst`` (read once), check its size and
    sha256 against the manifest, fsync, rename. Returns the bytes read. ``dst/<name>`` is
    never bad."""
    src, final = sp.source.parent / e.name, opts.dst / e.name
    tmp = tmp_name(final)

    def read_error(err: OSError) -> StageError:
        if isinstance(err, FileNotFoundError):
            return StageError(f"node {node}: source shard {src} vanished (listed in "
                              f"{sp.source}); restore it or reconvert, then rerun to resume")
        return StageError(f"node {node}: cannot read source shard {src}: {err.strerror or err}; "
                          "check the file server, then rerun to resume")

    def write_error(err: OSError) -> StageError:
        if err.errno in DISK_FULL:
            return StageError(f"node {node}: disk full writing {e.name} in {opts.dst}; free "
                              "space there or use another --dst, then rerun to resume")
        return StageError(f"node {node}: cannot write {e.name} in {opts.dst}: "
                          f"{err.strerror or err}; check that folder, then rerun to resume")

    try:
        fin = open(src, "rb", buffering=0)
    except OSError as err:
        raise read_error(err) from err
    try:
        with fin:
            with contextlib.suppress(OSError, AttributeError):
                os.posix_fadvise(fin.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
                             | os.O_NOFOLLOW, 0o644)
            except OSError as err:
                raise write_error(err) from err
            try:
                try:
                    n = _transfer(fin.fileno(), fd, e.bytes, opts.chunk, stop, tick)
                except OSError as err:
                    if err.errno in DISK_FULL:
                        raise write_error(err) from err
                    raise StageError(f"node {node}: copying {src} to {opts.dst} failed: "
                                     f"{err.strerror or err}; check the file server and that "
                                     "folder, then rerun to resume") from err
                if n != e.bytes:
                    raise StageError(
                        f"node {node}: source shard {src} has {'over ' if n > e.bytes else ''}"
                        f"{n} bytes, its manifest {sp.source.name} says {e.bytes}: the file "
                        "server's copy is corrupt or was rewritten; reconvert or restore it, "
                        "then rerun")
                # The copy is hashed as it landed (from the page cache): the source is read
                # once, and what is checked is what will be used.
                if opts.verify == "sha256" and (
                        got := _hash_file(tmp, opts.chunk, stop)) != e.sha256:
                    raise StageError(
                        f"node {node}: source shard {src} does not match its manifest "
                        f"{sp.source.name} (sha256 {got[:12]}... != {e.sha256[:12]}...): the "
                        "file server's copy is corrupt; reconvert or restore it, then rerun")
                try:
                    os.fsync(fd)
                except OSError as err:
                    raise write_error(err) from err
            finally:
                os.close(fd)
        try:
            os.replace(tmp, final)
        except OSError as err:
            raise write_error(err) from err
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return n


def _drop_stale(plan: Sequence[SplitPlan], dst: Path) -> None:
    """Remove shards of the staged splits that this plan does not hold (another mode or node
    count): nothing in ``dst`` may look like part of the node's data but the manifest's."""
    for sp in plan:
        keep = {e.name for e in sp.needed}
        pattern = re.compile(re.escape(sp.split) + r"-\d{6}\.tar")
        for p in dst.glob(f"{sp.split}-*.tar"):
            if pattern.fullmatch(p.name) and p.name not in keep and p.is_file():
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def _unlink(path: Path, node: int) -> None:
    """Remove ``path`` if it is there; a file that cannot be removed stops staging."""
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        raise StageError(f"node {node}: cannot replace {path}: {e.strerror}; remove it by "
                         "hand, then rerun") from e


def _finish_split(sp: SplitPlan, opts: StageOptions, world: World) -> None:
    """Copy the split's error log, write its node-local manifest, then its done-marker."""
    node, dst = world.node_rank, opts.dst
    if sp.manifest.error_log:
        log = sp.source.parent / sp.manifest.error_log
        try:
            data = log.read_bytes()
        except OSError as e:
            raise StageError(f"node {node}: cannot read the error log {log} that {sp.source} "
                             f"names ({e.strerror}); restore it or reconvert, then rerun") from e
        _write_small(dst / log.name, data, node)
    if sp.manifest.index is not None:  # the sample index travels with the shards
        src = sp.source.parent / sp.manifest.index.name
        try:
            data = src.read_bytes()
        except OSError as e:
            raise StageError(f"node {node}: cannot read the index {src} ({e.strerror}); "
                             f"rebuild it with: imgprep index {src.parent}, then rerun") from e
        _write_small(dst / src.name, data, node)
    try:
        path = write_manifest(dst, node_manifest(sp, opts, world))
    except OutputError as e:
        raise StageError(f"node {node}: cannot write the manifest in {dst}: "
                         f"{_why(e.__cause__ or e)}; free space there or use another --dst, "
                         "then rerun to resume") from e
    marker = {"fingerprint": sp.fingerprint, "split": sp.split, "source": str(sp.source),
              "source_sha256": sp.sha256, "mode": opts.mode, "seed": opts.seed,
              "num_nodes": world.num_nodes, "node_rank": world.node_rank, "verify": opts.verify,
              "shards": len(sp.needed), "bytes": sum(e.bytes for e in sp.needed),
              "manifest_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    _write_small(_marker_path(dst, sp.split), json.dumps(marker, indent=1).encode(), node)


def _stage(plan: Sequence[SplitPlan], opts: StageOptions, world: World,
           progress: Progress | None, on_start: Callable[[int], None] | None
           ) -> tuple[int, int, int]:
    """The copier's work, under the lock. Returns (shards copied, skipped, bytes read)."""
    dst, node = opts.dst, world.node_rank
    trusted = {sp.split for sp in plan if _marker_matches(sp, dst) is not None}
    for sp in plan:  # void the markers before anything in dst changes
        _unlink(_marker_path(dst, sp.split), node)
    fsync_dir(_state(dst))
    for folder in (dst, _state(dst)):
        sweep_tmp(folder)
    _drop_stale(plan, dst)

    items = [(sp, e) for sp in plan for e in sp.needed]
    stop = threading.Event()
    there = _parallel(lambda it: _present(dst / it[1].name, it[1], opts, it[0].split in trusted,
                                          stop), items, opts.jobs, stop)
    todo = [it for it, ok in zip(items, there, strict=True) if not ok]
    for _, e in todo:
        _unlink(dst / e.name, node)  # a bad copy: free its space before the check
    need = sum(e.bytes for _, e in todo)
    free = shutil.disk_usage(dst).free
    if free < need:
        raise StageError(f"node {node}: {dst} has {_size(free)} free but {_size(need)} "
                         f"({len(todo)} shards) still to copy; free space or use another "
                         "--dst, then rerun")
    if on_start is not None:
        on_start(need)

    lock = threading.Lock()

    def tick(k: int) -> None:
        if progress is not None:
            with lock:
                progress(k)

    read = _parallel(lambda it: _copy_shard(it[0], it[1], opts, node, tick, stop), todo,
                     opts.jobs, stop)
    fsync_dir(dst)  # every shard's rename is on disk before a manifest names it
    for sp in plan:
        _finish_split(sp, opts, world)
    return len(todo), len(items) - len(todo), sum(read)


# ---------------------------------------------------------------------------- entry point


def _summary(role: str, plan: Sequence[SplitPlan], opts: StageOptions, world: World, t0: float,
             copied: int = 0, skipped: int = 0, read: int = 0) -> dict[str, Any]:
    seconds = time.monotonic() - t0
    return {
        "role": role, "rank": world.rank, "local_rank": world.local_rank,
        "node_rank": world.node_rank, "num_nodes": world.num_nodes, "mode": opts.mode,
        "verify": opts.verify, "splits": [sp.split for sp in plan],
        "shards_needed": sum(len(sp.needed) for sp in plan), "shards_copied": copied,
        "shards_skipped": skipped, "bytes_read": read, "bytes_written": read,
        "seconds": round(seconds, 3),
        "mb_per_s": round(read / seconds / 1e6, 1) if read and seconds > 0 else 0.0,
        "dst": str(opts.dst),
        "manifests": [str(manifest_path(opts.dst, sp.split)) for sp in plan],
    }


def _check_options(opts: StageOptions) -> None:
    if opts.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {opts.mode!r}")
    if opts.verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES}, not {opts.verify!r}")
    if opts.jobs < 1 or opts.chunk < 1 or not opts.timeout > 0:
        raise ValueError("jobs, chunk and timeout must be positive")


def _prepare_dst(opts: StageOptions, node: int) -> None:
    if opts.dst.exists() and os.path.samefile(opts.src, opts.dst):
        raise StageError(f"node {node}: --dst {opts.dst} is the source folder; pick a "
                         "node-local folder")
    try:
        _state(opts.dst).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StageError(f"node {node}: cannot create {_state(opts.dst)}: {e.strerror}; pick "
                         "a writable node-local --dst") from e


def stage_to_node(opts: StageOptions, world: World, progress: Progress | None = None,
                  on_start: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Stage this node's shards of ``opts.src`` into ``opts.dst`` (or wait for the process
    that does); returns a summary. Call it in every process of the job.

    The copier calls ``on_start(bytes_to_copy)`` once, then ``progress(nbytes)`` as bytes are
    written (from its copy threads, one call at a time); waiters call neither. ``bytes_read``
    counts shard bytes read from the source (0 for waiters and for shards already staged).
    """
    t0 = time.monotonic()
    _check_options(opts)
    plan = plan_node(opts, world)
    node = world.node_rank
    if world.launcher != "single" and world.local_rank != 0:
        _wait(plan, opts, world, t0)
        return _summary("waiter", plan, opts, world, t0)
    _prepare_dst(opts, node)
    try:
        fd = os.open(_lock_path(opts.dst), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise StageError(f"node {node}: cannot create {_lock_path(opts.dst)}: {e.strerror}; "
                         "pick a writable node-local --dst") from e
    try:  # closing fd releases the lock, as the kernel does if this process dies
        _acquire(fd, opts.dst, t0 + opts.timeout, node, opts.timeout)
        if world.launcher == "single" and is_staged(plan, opts.dst):
            return _summary("waiter", plan, opts, world, t0)  # someone staged it already
        _record(opts.dst, world, "copying")
        try:
            copied, skipped, read = _stage(plan, opts, world, progress, on_start)
        except BaseException as e:
            err = e
            if isinstance(e, OSError) and not isinstance(e, ImgprepError):  # e.g. EIO in dst
                err = StageError(f"node {node}: {e}; check {opts.dst}, then rerun to resume")
            why = "interrupted" if isinstance(e, KeyboardInterrupt) else \
                str(err) if isinstance(err, ImgprepError) else repr(err)
            with contextlib.suppress(ImgprepError, OSError):
                _record(opts.dst, world, "failed", why)
            if err is not e:
                raise err from e
            raise
        _record(opts.dst, world, "done")
    finally:
        os.close(fd)
    return _summary("copier", plan, opts, world, t0, copied, skipped, read)
