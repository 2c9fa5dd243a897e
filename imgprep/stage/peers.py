"""The node copiers' meeting point during fan-out: a key-value store (torch's TCPStore) that
carries what each node holds, heartbeats and failures, so that a node that dies or fails
stops all the others with a message naming it.

Liveness is counted in heartbeats (``HEARTBEAT``, 5 s, or less when the caller's timeout is
short): every node beats ``BEATS`` times a heartbeat; one that has not beaten for a whole
heartbeat counts as dead, its watcher publishes that within a beat, and every other node reads
it within another: every node stops within two heartbeats of a death.

Keys, under a prefix of their own: ``have/<k>`` (node k's holdings, with ``have/count``),
``hb/<k>`` (a counter node k bumps every beat), ``first`` ("<k>\t<what>": node k failed, or
its watcher saw it die; set only by the first to publish) with ``failseq`` (how many
published), ``dead/<k>`` (set by node k's watcher once it saw k die), ``done/<k>`` (with
``done/count``) and ``left`` (the nodes leave together, the store's host last; a dead node's
watcher counts it as left, so that nobody waits for it).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from imgprep.errors import StageError, WaitTimeout
from imgprep.job.rendezvous import Rendezvous

HEARTBEAT = 5.0  # seconds without a beat after which a started node counts as dead
BEATS = 10  # beats a heartbeat (and looks at the watched node's count)
POLL = 0.1  # seconds between two looks at a counter a wait is for


class PeerFailed(StageError):
    """This node stops because another one failed or died (which the message names)."""


def open_store(rv: Rendezvous, me: int, timeout: float) -> tuple[Any, bool]:
    """The copiers' store (node 0 hosts it unless one already listens) and whether this
    process hosts it."""
    import torch.distributed as dist

    host = me == 0 and not rv.store_listens
    try:
        store = dist.TCPStore(rv.addr, rv.port, None, host, timedelta(seconds=timeout),
                              wait_for_workers=False)
    except (RuntimeError, OSError, ValueError) as e:
        what = "listen" if host else "reach node 0's copier"
        raise StageError(f"node {me}: cannot {what} at {rv}: {str(e).splitlines()[0]}; "
                         "check the address and that node 0 runs the same command (or raise "
                         "--timeout)") from e
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") if rv.store_listens else "0"
    return dist.PrefixStore(f"imgprep-fanout/{restart}/", store), host



@dataclass
class Watch:
    """Heartbeats and published failures of the copiers, in the store.

    Each node watches one other: the next one round the ring that has not finished. Whenever
    some node is dead and another alive, an alive one watches a dead one, so a death is
    always seen, and the store's load is O(nodes), not O(nodes^2): a look is two or three
    store calls, at most once a beat (``heartbeat / BEATS``). The watcher publishes the death
    like a failure, so that every node reads it from ``failseq`` and ``first``.
    """

    store: Any
    me: int
    n: int
    heartbeat: float  # seconds without a beat after which a started node counts as dead
    where: str
    stop: threading.Event = field(default_factory=threading.Event)
    watched: int | None = None  # the node this one watches
    seen: tuple[int, float] = (0, 0.0)  # its heartbeat count, and when that last changed
    finished: set[int] = field(default_factory=set)  # nodes known done: skipped round the ring
    looked: float = 0.0  # when the store was last read
    found: str | None = None
    lost: str | None = None

    @property
    def beat(self) -> float:
        """Seconds between two beats, and between two looks at the store."""
        return self.heartbeat / BEATS

    def start(self) -> None:
        threading.Thread(target=self._beat, name="fanout-heartbeat", daemon=True).start()

    def _beat(self) -> None:
        while not self.stop.wait(self.beat):
            try:
                self.store.add(f"hb/{self.me}", 1)
            except (RuntimeError, OSError) as e:  # the store is gone
                self.lost = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                return

    def fail(self, message: str) -> None:
        """Publish this node's failure so the others name it."""
        self._publish(self.me, f"failed: {message}")

    def _publish(self, k: int, what: str) -> None:
        """Say node k failed or died, unless another node's failure came first (it wins)."""
        with contextlib.suppress(RuntimeError, OSError):
            self.store.compare_set("first", "", f"{k}\t{what}")
            self.store.add("failseq", 1)

    def verdict(self) -> str | None:
        """Why some node will never finish (it failed or died) and what to do; None while all
        look alive. Reads the store at most once a beat."""
        if self.lost is not None:
            return f"lost the meeting point {self.where} ({self.lost}): node 0 died or " \
                   "cannot be reached; rerun to resume"
        now = time.monotonic()
        if self.found is not None or now - self.looked < self.beat:
            return self.found
        self.looked = now
        try:
            self.found = self._published() or self._watch(now)
        except (RuntimeError, OSError, ValueError) as e:
            return f"lost the meeting point {self.where} ({str(e).splitlines()[0]}): node 0 " \
                   "died or cannot be reached; rerun to resume"
        return self.found

    def _published(self) -> str | None:
        """The first failure or death published, if any (one key, whatever the node count)."""
        if int(self.store.add("failseq", 0)) == 0:
            return None
        k, what = self.store.get("first").decode().split("\t", 1)
        return f"node {k} {what}"

    def _watch(self, now: float) -> str | None:
        """Check the watched node's beats; publish its death once it stopped beating for a
        heartbeat after it had started, unless it finished; count it as left."""
        k = next((j for j in ((self.me + i) % self.n for i in range(1, self.n))
                  if j not in self.finished), None)
        if k is None:
            return None
        if k != self.watched:
            self.watched, self.seen = k, (-1, now)
        beats = int(self.store.add(f"hb/{k}", 0))
        if beats != self.seen[0]:
            self.seen = (beats, now)
            return None
        if beats == 0 or now - self.seen[1] <= self.heartbeat:
            return None
        if self.store.check([f"done/{k}"]):
            self.finished.add(k)  # it left: watch the next one from the next look
            return None
        what = f"died (no heartbeat for {now - self.seen[1]:.1f} s); rerun to resume"
        self._publish(k, what)
        with contextlib.suppress(RuntimeError, OSError):  # once per dead node, whoever saw it
            if self.store.compare_set(f"dead/{k}", "", str(self.me)) == str(self.me).encode():
                self.store.add("left", 1)  # it never will: the store's host need not wait
        return f"node {k} {what}"


def announce(store: Any, key: str, me: int, value: str = "1") -> None:
    """Set ``<key>/<me>`` and count it, so that waiters read one counter, not every key."""
    store.set(f"{key}/{me}", value)
    store.add(f"{key}/count", 1)


def await_all(watch: Watch, key: str, deadline: float, what: str) -> None:
    """Wait until every node announced ``key``, failing on a verdict or at ``deadline``."""
    while int(watch.store.add(f"{key}/count", 0)) < watch.n:
        if (why := watch.verdict()) is not None:
            raise PeerFailed(f"node {watch.me}: fan-out stopped: {why}")
        if time.monotonic() > deadline:
            missing = [k for k in range(watch.n) if not watch.store.check([f"{key}/{k}"])]
            raise WaitTimeout(f"node {watch.me}: waited --timeout for node(s) "
                              f"{', '.join(map(str, missing))} to {what} at {watch.where}; "
                              "start every node with the same command, or raise --timeout")
        time.sleep(POLL)
