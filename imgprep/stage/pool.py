"""The copy threads of stage-to-node and how a copier tells they hang.

``parallel`` runs a function over items on a few threads, results in order; the first error
stops the others cleanly and is raised. A read that hangs (a dead file server, a stuck mount)
neither fails nor ends: ``StallClock`` measures how long no byte moved, and ``CopyWatch``
turns that into one line naming the files being copied.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from imgprep.errors import StageError

POLL_S = 0.5  # how often a copier waiting on its threads asks whether they are stuck
CLEANUP_S = 10.0  # how long an interrupted copier waits for its threads to clean up
Progress = Callable[[int], None]  # called with the bytes just moved
T = TypeVar("T")
R = TypeVar("R")


class Stopped(Exception):
    """Another copy failed or the run was interrupted: stop this one cleanly."""


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
    lock = threading.Lock()
    todo = iter(range(len(items)))
    finished = threading.Event()
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
    _wait(finished, stop, errors, stuck)
    if errors:  # the first real one: the others only stopped because of it
        by_item = [e for _, e in sorted(errors, key=lambda ie: ie[0])]
        real = [e for e in by_item if not isinstance(e, Stopped)]
        raise real[0] if real else errors[0][1]
    return results


def _wait(finished: threading.Event, stop: threading.Event,
          errors: list[tuple[int, BaseException]], stuck: Callable[[], str | None] | None) -> None:
    """Wait for the threads to finish, raising at once when they are stuck (or on Ctrl-C,
    after giving them ``CLEANUP_S`` to clean up)."""
    try:  # Event.wait, not Thread.join: a join that Ctrl-C interrupts marks the thread ended
        while not finished.wait(POLL_S):
            if stuck is not None and (why := stuck()) is not None:
                if errors:
                    return  # raise that error, without waiting for a call stuck in a read
                raise StageError(why)
    except StageError:  # stuck: waiting for the stuck call would never end
        stop.set()
        raise
    except BaseException:  # Ctrl-C: running calls see ``stop`` and clean up
        stop.set()
        finished.wait(CLEANUP_S)
        raise


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
            self.mark = progress
            self.since = now
            return None
        idle = now - self.since
        return idle if idle > self.limit else None


def stall_message(node: int, doing: str, idle: float) -> str:
    """The one line a copier that is stuck ``doing`` something for ``idle`` seconds says."""
    return (f"node {node}: stuck {doing}: no byte moved for {idle:.0f} s (a hung file server "
            "or disk); check it, then rerun to resume (or raise --stall-timeout)")


class CopyWatch:
    """The copy threads' bytes and the files they are on, for ``parallel``'s ``stuck``."""

    def __init__(self, limit: float, node: int, tick: Progress) -> None:
        self.clock = StallClock(limit)
        self.node = node
        self.outer = tick
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
