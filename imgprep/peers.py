"""The node copiers' meeting point during fan-out: a key-value store (torch's TCPStore) that
carries what each node holds, heartbeats and failures, so that a node that dies or fails
stops all the others with a message naming it.

Keys, under a prefix of their own: ``have/<k>`` (node k's holdings), ``hb/<k>`` (a counter
node k bumps every ``HEARTBEAT`` seconds), ``fail/<k>`` ("<sequence>\t<message>": the first
failure published wins), ``done/<k>`` and ``left`` (the nodes leave together, the store's host
last).
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
from imgprep.rendezvous import Rendezvous

HEARTBEAT = 0.5  # seconds between two heartbeats
POLL = 0.1  # seconds between two looks at the store


class PeerFailed(StageError):
    """This node stops because another one failed or died (which the message names)."""


@dataclass
class StallClock:
    """How long this node has moved no byte while not waiting on a peer. A node whose own
    file-server read or disk hangs keeps its heartbeat, so the others cannot tell it from a
    slow one; it tells itself, and its failure then stops every node."""

    limit: float  # seconds without progress after which the node counts as stuck
    mark: tuple[int, ...] = ()
    since: float = field(default_factory=time.monotonic)

    def stuck(self, progress: tuple[int, ...], on_peer: bool) -> float | None:
        """Seconds since ``progress`` (byte counters) last changed, once over the limit while
        not ``on_peer`` (waiting on another node, whose stall is its own to report)."""
        now = time.monotonic()
        if on_peer or progress != self.mark:
            self.mark, self.since = progress, now
            return None
        return now - self.since if now - self.since > self.limit else None


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
    """Heartbeats and published failures of the copiers, in the store."""

    store: Any
    me: int
    n: int
    dead_after: float
    where: str
    stop: threading.Event = field(default_factory=threading.Event)
    seen: dict[int, tuple[int, float]] = field(default_factory=dict)  # beats, when they changed
    looked: float = 0.0  # when the heartbeats were last read
    lost: str | None = None

    def start(self) -> None:
        threading.Thread(target=self._beat, name="fanout-heartbeat", daemon=True).start()

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT):
            try:
                self.store.add(f"hb/{self.me}", 1)
            except (RuntimeError, OSError) as e:  # the store is gone
                self.lost = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                return

    def fail(self, message: str) -> None:
        """Publish this node's failure so the others name it."""
        with contextlib.suppress(RuntimeError, OSError):
            seq = self.store.add("failseq", 1)
            self.store.set(f"fail/{self.me}", f"{seq}\t{message}")

    def verdict(self) -> str | None:
        """Why another node will never finish (it failed or died) and what to do; None while
        all look alive. A few store calls a look, heartbeats at most once a ``HEARTBEAT``."""
        if self.lost is not None:
            return f"lost the meeting point {self.where} ({self.lost}): node 0 died or " \
                   "cannot be reached; rerun to resume"
        try:
            if int(self.store.add("failseq", 0)) > 0:
                failed = []
                for k in range(self.n):
                    if k != self.me and self.store.check([f"fail/{k}"]):
                        seq, msg = self.store.get(f"fail/{k}").decode().split("\t", 1)
                        failed.append((int(seq), k, msg))
                if failed:
                    _, k, msg = min(failed)
                    return f"node {k} failed: {msg}"
            now = time.monotonic()
            if now - self.looked < HEARTBEAT:
                return None
            self.looked = now
            for k in range(self.n):
                beats = int(self.store.add(f"hb/{k}", 0)) if k != self.me else 0
                last = self.seen.get(k)
                if last is None or beats != last[0]:
                    self.seen[k] = (beats, now)
                elif beats > 0 and now - last[1] > self.dead_after \
                        and not self.store.check([f"done/{k}"]):
                    return f"node {k} died (no heartbeat for {now - last[1]:.0f} s); rerun " \
                           "to resume"
        except (RuntimeError, OSError, ValueError) as e:
            return f"lost the meeting point {self.where} ({str(e).splitlines()[0]}): node 0 " \
                   "died or cannot be reached; rerun to resume"
        return None


def await_all(watch: Watch, key: str, deadline: float, what: str) -> None:
    """Wait until every node set ``<key>/<k>``, failing on a verdict or at ``deadline``."""
    keys = [f"{key}/{k}" for k in range(watch.n)]
    while not watch.store.check(keys):
        if (why := watch.verdict()) is not None:
            raise PeerFailed(f"node {watch.me}: fan-out stopped: {why}")
        if time.monotonic() > deadline:
            missing = [k for k in range(watch.n) if not watch.store.check([keys[k]])]
            raise WaitTimeout(f"node {watch.me}: waited --timeout for node(s) "
                              f"{', '.join(map(str, missing))} to {what} at {watch.where}; "
                              "start every node with the same command, or raise --timeout")
        time.sleep(POLL)
