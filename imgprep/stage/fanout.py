"""Fan-out: every node ends with every shard, and the file server is read once in all.

Each node copier reads from the file server only the shards it owns (the partition share,
imgprep.job.assign.node_shards); the shards then travel node to node over a Gloo process group of
the copiers (TCP, CPU tensors). The protocol, after the copiers meet (imgprep.job.rendezvous):

1. Every copier publishes in the store which shards its ``dst`` already holds (checked as for
   any rerun) with a digest of its plan; plans that differ stop every node.
2. Every node computes the same list of transfers: for each shard some node lacks, one
   *sender* (its owner if it holds it or nobody does, so the owner reads the file server; else
   the first holder after the owner) and a *chain*: the nodes that lack it, in ring order after
   the sender. Transfers go round-robin over senders, so all senders stream at once.
3. Each shard travels its chain in chunks, pipelined: a node forwards chunk c while the next
   one arrives, so a shard takes about size / link rate to reach every node, not N times that,
   and with every node sending, every link carries data in both directions. Every node walks
   the same (round, chunk, sender) order (imgprep.stage.schedule.walk), posting sends and
   receives a few steps ahead without waiting and waiting only on the receive at hand; a
   receive's data only depends on messages earlier in that order, so the walk cannot deadlock
   (imgprep.stage.fanout_net). Disk reads (a read-ahead thread) and disk writes with hashing
   (``jobs`` writer threads) overlap the network (imgprep.stage.fanout_disk).
4. Every received shard is written to its temporary name, hashed as it lands, checked against
   the manifest's size and sha256, fsynced and renamed: nothing partial or bad under a final
   name. A node that receives a bad shard stops and names it and its sender.
5. Liveness (imgprep.stage.peers): each copier beats in the store ten times a heartbeat (5 s, or
   ``timeout``/2 if shorter). A node that stopped beating for a heartbeat after it had started,
   or that published a failure, stops every other node within two heartbeats with a message
   naming it (the first failure published wins); one that
   never joins is reported when ``timeout`` runs out. A node whose own file-server read or disk
   hangs keeps beating, so it watches itself: moving no byte for ``stall`` seconds while not
   waiting on a peer, it fails, naming what it was doing. The nodes leave together, the
   store's host last.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgprep.errors import ImgprepError, StageError
from imgprep.job.rendezvous import Rendezvous
from imgprep.stage.fanout_disk import Writers
from imgprep.stage.fanout_net import NET_CHUNK, Engine, open_group
from imgprep.stage.peers import (
    HEARTBEAT,
    POLL,
    PeerFailed,
    Watch,
    announce,
    await_all,
    open_store,
)
from imgprep.stage.pool import Progress, StallClock, stall_message
from imgprep.stage.remote import STALL_S, Source
from imgprep.stage.schedule import Counts, Shard, Transfer, plan_transfers

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class FanoutJob:
    """One node's part: every shard (in the same order on every node), which of them its
    ``dst`` holds already, and a digest of the plan that every node must share."""

    origin: Source  # the file server (imgprep.stage.remote)
    shards: Sequence[Shard]
    have: Sequence[bool]
    digest: str
    dst: Path
    me: int
    n: int
    jobs: int
    timeout: float
    stall: float = STALL_S  # seconds this node may move no byte unless waiting on a peer
    chunk: int = NET_CHUNK


@dataclass(frozen=True, kw_only=True)
class FanoutResult:
    """What one node's fan-out moved: bytes read from the file server, received from and sent
    to other nodes, shards renamed into place here, and the seconds from all nodes joined to
    all finished."""

    read: int = 0
    received: int = 0
    sent: int = 0
    written: int = 0
    seconds: float = 0.0


def _exchange(job: FanoutJob, watch: Watch) -> list[list[bool]]:
    """Publish what this node holds; learn what every node holds (same plan, or stop)."""
    store = watch.store
    announce(store, "have", job.me, json.dumps(
        {"digest": job.digest, "have": "".join("1" if h else "0" for h in job.have)}))
    await_all(watch, "have", time.monotonic() + job.timeout, "join the fan-out")
    views = [json.loads(store.get(f"have/{k}")) for k in range(job.n)]
    for k, v in enumerate(views):
        if v["digest"] != job.digest:
            raise StageError(f"node {job.me}: node {k} stages another plan (other manifests, "
                             "seed or options); run the same command on every node")
    return [[c == "1" for c in v["have"]] for v in views]


def _move(job: FanoutJob, rv: Rendezvous, watch: Watch, transfers: Sequence[Transfer],
          tick: Progress) -> tuple[Counts, Any]:
    """Run the engine on its own thread; this thread watches the others and the clock.
    Returns the counts and the copiers' group (the links stay open until every node is
    done)."""
    counts = Counts()
    failures: list[BaseException] = []
    box: list[Any] = []  # the group, once open
    done = threading.Event()
    writers = Writers(job.shards, job.dst, job.me, job.jobs, tick, counts, failures.append)
    engine = Engine(job.origin, job.shards, transfers, job.me, job.dst, job.chunk, writers,
                    counts, failures.append)

    def run() -> None:
        try:
            box.append(open_group(watch.store, rv, job.me, job.n, job.timeout))
            engine.run(box[0])
            writers.close()
        except BaseException as e:  # raised by the watching thread
            failures.append(e)
        finally:
            done.set()

    threading.Thread(target=run, name="fanout-engine", daemon=True).start()
    clock = StallClock(job.stall)
    while not done.wait(POLL) and not failures:
        if (why := watch.verdict()) is not None:
            raise PeerFailed(f"node {job.me}: fan-out stopped: {why}")
        if (idle := clock.stuck(engine.progress(), not box or engine.waiting_on is not None)):
            raise StageError(stall_message(job.me, engine.doing, idle))
    if failures:
        _raise(failures[0], job, watch, engine.waiting_on)
    return counts, box[0] if box else None


def _raise(err: BaseException, job: FanoutJob, watch: Watch, peer: int | None) -> None:
    """Raise the engine's error: a node's own failure as it is (and published for the
    others); a broken link as the failure of the node that caused it, when one is named."""
    if isinstance(err, ImgprepError) or not isinstance(err, RuntimeError):
        raise err  # Gloo reports a broken or timed-out link as a RuntimeError
    until = time.monotonic() + 2 * watch.heartbeat  # its watcher's verdict, then a look
    while time.monotonic() < until:
        if (why := watch.verdict()) is not None:
            raise PeerFailed(f"node {job.me}: fan-out stopped: {why}") from err
        time.sleep(POLL)
    who = f"node {peer}" if peer is not None else "a peer"
    raise StageError(f"node {job.me}: fan-out lost {who}: {str(err).splitlines()[0]}; check "
                     "that node's output, then rerun to resume (or raise --timeout)") from err


def _leave(job: FanoutJob, watch: Watch, hosting: bool) -> None:
    """Say this node is done, wait for all, and let the store's host go last."""
    announce(watch.store, "done", job.me)
    await_all(watch, "done", time.monotonic() + job.timeout, "finish")
    watch.store.add("left", 1)
    until = time.monotonic() + 10
    while hosting and int(watch.store.add("left", 0)) < job.n and time.monotonic() < until:
        time.sleep(POLL)


def fan_out(job: FanoutJob, rv: Rendezvous, tick: Progress) -> FanoutResult:
    """Meet the other copiers at ``rv`` and move shards until every node holds every one.
    Returns what this node moved; raises StageError naming the node that failed or died."""
    store, hosting = open_store(rv, job.me, job.timeout)
    watch = Watch(store, job.me, job.n, min(HEARTBEAT, job.timeout / 2), str(rv))
    watch.start()
    try:
        have = _exchange(job, watch)
        t0 = time.monotonic()
        transfers = plan_transfers(have, [s.owner for s in job.shards])
        log.debug("node %d: %d transfers in the fan-out", job.me, len(transfers))
        counts = Counts()
        group = None
        if transfers:
            counts, group = _move(job, rv, watch, transfers, tick)
        _leave(job, watch, hosting)
        seconds = time.monotonic() - t0
        del group  # the links close once every node has all it needs
        return FanoutResult(read=counts.read, received=counts.received, sent=counts.sent,
                            written=counts.written, seconds=seconds)
    except PeerFailed:
        _linger(watch, hosting)
        raise  # another node's failure: it published it
    except BaseException as e:
        if isinstance(e, RuntimeError) and not isinstance(e, ImgprepError):
            # the store failed outside the engine: its host is gone
            why = watch.verdict() or f"{str(e).splitlines()[0]}; rerun to resume"
            raise PeerFailed(f"node {job.me}: fan-out stopped: {why}") from e
        watch.fail(str(e) if isinstance(e, ImgprepError) else f"{type(e).__name__}: {e}")
        _linger(watch, hosting)
        raise
    finally:
        watch.stop.set()


def _linger(watch: Watch, hosting: bool) -> None:
    """On failure, the store's host stays until every other node has left (read why; a dead
    one is counted as left by its watcher), or a heartbeat has passed (every live node looks
    ten times a heartbeat; another may have died unseen): its leaving must not hide the
    cause."""
    watch.stop.set()  # no more heartbeats: this node is leaving
    with contextlib.suppress(RuntimeError, OSError):
        watch.store.add("left", 1)
        until = time.monotonic() + watch.heartbeat
        while hosting and int(watch.store.add("left", 0)) < watch.n and time.monotonic() < until:
            time.sleep(POLL)
