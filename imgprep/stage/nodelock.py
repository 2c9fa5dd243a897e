"""One copier per node folder, and how the node's other processes tell it is alive.

The protocol, in the state folder ``<dst>/.imgprep-stage``:

- The copier holds an exclusive ``flock`` on ``lock`` while it works (every copier takes it, so
  two copiers never share a ``dst``). The kernel drops the lock when the copier dies, however
  it dies.
- ``copier.json`` beside it says who holds it (pid, parent pid, host, ranks) and how it went:
  ``copying``, ``failed`` with its message, or ``done``.
- A waiter never creates anything in ``dst``. It probes the lock with a shared lock released at
  once, and reads ``copier.json``. The copier of its own launch (same host and parent process:
  torchrun's agent, mpirun's daemon, slurmstepd) is gone when the lock is free and the record
  says ``copying`` (it died) or ``failed``. A waiter gives up once that has held for
  ``DEAD_GRACE`` seconds in a row (a new copier may be just starting), and times out after its
  timeout otherwise.

What "done" means (which files, which plan) is the caller's: waiters take a ``staged()`` test.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from imgprep.errors import StageError, WaitTimeout
from imgprep.job.world import World
from imgprep.shards.folder import STAGE_STATE
from imgprep.stage.localdisk import write_small

STATE_DIR = STAGE_STATE
DEAD_GRACE = 3.0  # seconds a copier must look dead before a waiter gives up on it
POLL_MAX = 0.5  # longest sleep between two looks at the lock or the markers


def state_dir(dst: Path) -> Path:
    return dst / STATE_DIR


def lock_path(dst: Path) -> Path:
    return state_dir(dst) / "lock"


def record_path(dst: Path) -> Path:
    return state_dir(dst) / "copier.json"


def read_json(path: Path) -> Any:
    """A small JSON state file, or None when it is missing or damaged (state files are
    rewritten whole, so a damaged one only means "no usable state")."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def record(dst: Path, world: World, state: str, error: str | None = None) -> None:
    """Say in ``copier.json`` who holds the lock and how it is going (for the waiters)."""
    rec = {"pid": os.getpid(), "ppid": os.getppid(), "host": socket.gethostname(),
           "rank": world.rank, "node_rank": world.node_rank, "state": state, "error": error,
           "time": time.time()}
    write_small(record_path(dst), json.dumps(rec).encode(), world.node_rank, durable=False)


def holder(dst: Path) -> str:
    """" (held by pid P on HOST)" from ``copier.json``, or "" when it says nothing."""
    rec = read_json(record_path(dst))
    if isinstance(rec, dict):
        return f" (held by pid {rec.get('pid')} on {rec.get('host')})"
    return ""


def try_lock(fd: int, dst: Path, node: int) -> bool:
    """Take the exclusive lock if nobody holds it; False when another process does."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:
        raise StageError(f"node {node}: cannot lock {lock_path(dst)}: {e.strerror}; use "
                         "a local file system for --dst") from e
    return True


def acquire(fd: int, dst: Path, deadline: float, node: int, timeout: float) -> None:
    """Take the exclusive lock, polling until ``deadline`` (a monotonic time)."""
    delay = 0.05
    while not try_lock(fd, dst, node):
        now = time.monotonic()
        if now >= deadline:
            raise WaitTimeout(
                f"node {node}: waited {timeout:g} s for the lock {lock_path(dst)}"
                f"{holder(dst)} to stage into {dst}; let that process finish or stop it, "
                "then rerun (or raise --timeout)")
        time.sleep(min(delay, deadline - now))
        delay = min(delay * 1.5, POLL_MAX)


@contextlib.contextmanager
def held(dst: Path, node: int, deadline: float, timeout: float) -> Iterator[None]:
    """Hold the node's copier lock (waiting for it until ``deadline``); released on exit, as
    the kernel releases it if this process dies. ``dst``'s state folder must exist."""
    try:
        fd = os.open(lock_path(dst), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise StageError(f"node {node}: cannot create {lock_path(dst)}: {e.strerror}; "
                         "pick a writable node-local --dst") from e
    try:
        acquire(fd, dst, deadline, node, timeout)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def lock_free(dst: Path) -> bool:
    """Whether no process holds the copier's lock (probed with a shared lock, released at once;
    a waiter creates nothing in ``dst``)."""
    try:
        fd = os.open(lock_path(dst), os.O_RDONLY | os.O_CLOEXEC)
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


def copier_gone(dst: Path, world: World) -> str | None:
    """Why this launch's copier will never finish (dead or failed), or None if it still may."""
    if not lock_free(dst):
        return None
    rec = read_json(record_path(dst))
    if not isinstance(rec, dict) or rec.get("host") != socket.gethostname() \
            or rec.get("ppid") != os.getppid():
        return None  # no copier of this launch has started yet
    who = f"copier (local rank 0, pid {rec.get('pid')}) of node {world.node_rank}"
    if rec.get("state") == "failed":
        return f"{who} failed staging into {dst}: {rec.get('error')}"
    if rec.get("state") == "copying":
        return f"{who} died before finishing staging into {dst}; rerun the job to resume"
    return None


def wait_for_copier(staged: Callable[[], bool], dst: Path, world: World, timeout: float,
                    t0: float) -> None:
    """Wait until ``staged()`` says the copier finished; fail early if it died or failed, and
    time out ``timeout`` seconds after ``t0`` (a monotonic time)."""
    deadline, delay, gone_since = t0 + timeout, 0.05, None
    while not staged():
        now = time.monotonic()
        gone = copier_gone(dst, world)
        if gone is None:
            gone_since = None
        elif gone_since is None:
            gone_since = now
        elif now - gone_since >= DEAD_GRACE:
            raise StageError(gone)
        if now >= deadline:
            state = "is still copying" if not lock_free(dst) else \
                "never started, or runs in another launch"
            raise WaitTimeout(
                f"node {world.node_rank}: waited {timeout:g} s for the copier (local rank "
                f"0) to stage into {dst}; it {state}: check local rank 0's output, then "
                "rerun the job to resume (or raise --timeout)")
        time.sleep(min(delay, max(deadline - now, 0.01)))
        delay = min(delay * 1.5, POLL_MAX)
