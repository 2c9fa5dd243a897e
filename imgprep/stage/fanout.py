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
   the same (round, chunk, sender) order (imgprep.stage.schedule.walk), posting sends and receives a
   few steps ahead without waiting and waiting only on the receive at hand; a receive's data
   only depends on messages earlier in that order, so the walk cannot deadlock. Disk reads
   (a read-ahead thread) and disk writes with hashing (``jobs`` writer threads) overlap the
   network.
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

import collections
import contextlib
import hashlib
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from imgprep.errors import ImgprepError, StageError
from imgprep.fsutil import tmp_name
from imgprep.job.rendezvous import Rendezvous, local_address_towards
from imgprep.stage.copier import Progress, StallClock, open_tmp, stall_message, write_error
from imgprep.stage.peers import (
    HEARTBEAT,
    POLL,
    PeerFailed,
    Watch,
    announce,
    await_all,
    open_store,
)
from imgprep.stage.remote import STALL_S, Source
from imgprep.stage.schedule import Counts, Shard, Transfer, chunks, plan_transfers, walk

NET_CHUNK = 4 << 20  # bytes a message carries: small enough to pipeline, large enough to stream
IN_FLIGHT = 8  # sends (and receives) a node keeps posted ahead


# ---------------------------------------------------------------------------- disk side


class Writers:
    """``jobs`` threads writing received chunks to temporary names, hashing as they land,
    then checking, fsyncing and renaming each shard (a shard stays on one thread)."""

    def __init__(self, shards: Sequence[Shard], dst: Path, me: int, jobs: int, tick: Progress,
                 counts: Counts, failed: Callable[[BaseException], None]) -> None:
        self.shards, self.dst, self.me, self.tick, self.counts = shards, dst, me, tick, counts
        self.failed = failed
        self.queues: list[queue.Queue[Any]] = [queue.Queue(maxsize=16) for _ in range(jobs)]
        self.landed = [0] * jobs  # bytes each thread has written (its own slot: no lock)
        self.threads = [threading.Thread(target=self._run, args=(q, k), daemon=True,
                                         name="fanout-writer")
                        for k, q in enumerate(self.queues)]
        for t in self.threads:
            t.start()

    def put(self, t: Transfer, data: Any, last: bool) -> None:
        self.queues[t.index % len(self.queues)].put((t, data, last))

    def close(self) -> None:
        for q in self.queues:
            q.put(None)
        for t in self.threads:
            t.join()

    def _run(self, q: queue.Queue[Any], k: int) -> None:
        open_files: dict[int, tuple[int, Any, int]] = {}
        try:
            while (job := q.get()) is not None:
                t, data, last = job
                fd, h, n = open_files.get(t.index) or (self._open(t), hashlib.sha256(), 0)
                open_files[t.index] = (fd, h, n + len(data))
                view = memoryview(data.numpy())
                h.update(view)
                try:
                    while len(view):
                        wrote = os.write(fd, view)
                        view = view[wrote:]
                        self.landed[k] += wrote
                except OSError as err:
                    raise write_error(err, self.shards[t.index].entry.name, self.dst,
                                      self.me) from err
                if last:
                    self._finish(t, *open_files.pop(t.index))
        except BaseException as e:  # handed to the supervisor, which raises it
            self.failed(e)
            for index, (fd, _, _) in open_files.items():  # a rerun redoes these
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name(self.dst / self.shards[index].entry.name))

    def _open(self, t: Transfer) -> int:
        e = self.shards[t.index].entry
        try:
            return open_tmp(self.dst / e.name)
        except OSError as err:
            raise write_error(err, e.name, self.dst, self.me) from err

    def _finish(self, t: Transfer, fd: int, h: Any, n: int) -> None:
        s = self.shards[t.index]
        e, final = s.entry, self.dst / s.entry.name
        try:
            got = h.hexdigest()
            if n != e.bytes or got != e.sha256:
                origin = f"node {t.sender}'s copy" if not t.from_server else \
                    f"the file server's {s.source}" + \
                    ("" if t.sender == self.me else f" (read by node {t.sender})")
                raise StageError(
                    f"node {self.me}: shard {e.name} from {origin} does not match its manifest "
                    f"{s.manifest} ({n} bytes, sha256 {got[:12]}... != {e.bytes} bytes, "
                    f"{e.sha256[:12]}...): it is corrupt; restore or reconvert it if it is the "
                    "file server's, else rerun (the sender re-checks its copy)")
            try:
                os.fsync(fd)
            except OSError as err:
                raise write_error(err, e.name, self.dst, self.me) from err
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp_name(final))
            raise
        os.close(fd)
        try:
            os.replace(tmp_name(final), final)
        except OSError as err:
            raise write_error(err, e.name, self.dst, self.me) from err
        self.counts.written += 1
        self.tick(e.bytes)


def read_ahead(origin: Source, shards: Sequence[Shard], mine: Sequence[Transfer], dst: Path,
               me: int, chunk: int, out: queue.Queue[Any], counts: Counts) -> None:
    """Read the shards this node sends, in sending order, as chunks (tensors) into ``out``:
    from the file server (``origin``) or this node's copy."""
    import torch

    for t in mine:
        s = shards[t.index]
        path = s.source if t.from_server else dst / s.entry.name
        fix = "restore or reconvert it, then rerun" if t.from_server else \
            "rerun: this node then re-checks its copy"
        try:
            with origin.open(s.entry.name) if t.from_server else \
                    open(path, "rb", buffering=0) as f:
                for size in chunks(s.entry.bytes, chunk):
                    buf = bytearray(size)
                    got = 0
                    while got < size and (k := f.readinto(memoryview(buf)[got:])):
                        got += k
                        if t.from_server:
                            counts.read += k
                    if got < size:
                        raise StageError(f"node {me}: {path} is shorter than its manifest "
                                         f"{s.manifest} says ({s.entry.bytes} bytes); {fix}")
                    out.put(torch.frombuffer(buf, dtype=torch.uint8) if size else
                            torch.empty(0, dtype=torch.uint8))
                if f.read(1):
                    raise StageError(f"node {me}: {path} is longer than its manifest "
                                     f"{s.manifest} says ({s.entry.bytes} bytes); {fix}")
        except FileNotFoundError as err:
            raise StageError(f"node {me}: {path} vanished (listed in {s.manifest}); {fix}") \
                from err
        except OSError as err:
            if isinstance(err, ImgprepError):
                raise
            advice = getattr(err, "advice", None) or "check the file server, then rerun to resume"
            raise StageError(f"node {me}: cannot read {path}: {err.strerror or err}; "
                             f"{advice}") from err


# ---------------------------------------------------------------------------- network side


class Receives:
    """This node's receives, posted ``IN_FLIGHT`` steps ahead of its walk (posting waits for
    nothing, and each link's receives are posted in the link's order), so that the next chunk
    is already on its way while this one is handled."""

    def __init__(self, group: Any, me: int,
                 steps: Sequence[tuple[Transfer, int, int, tuple[int, ...]]]) -> None:
        self.group = group
        self.todo = collections.deque(
            (i, path[path.index(me) - 1], size) for i, (_, _, size, path) in enumerate(steps)
            if path.index(me) > 0)
        self.posted: dict[int, tuple[Any, Any]] = {}

    def take(self, step: int) -> tuple[Any, Any]:
        """Step ``step``'s (work, buffer), after posting the receives that come next."""
        import torch

        while self.todo and len(self.posted) < IN_FLIGHT:
            i, src, size = self.todo.popleft()
            buf = torch.empty(size, dtype=torch.uint8)
            self.posted[i] = (self.group.recv([buf], src, 0), buf)
        return self.posted.pop(step)


class Engine:
    """One node's walk through the transfers (see the module's step 3), on its own thread."""

    def __init__(self, origin: Source, shards: Sequence[Shard], transfers: Sequence[Transfer],
                 me: int, dst: Path, chunk: int, writers: Writers, counts: Counts,
                 failed: Callable[[BaseException], None]) -> None:
        self.origin, self.shards, self.transfers, self.me = origin, shards, transfers, me
        self.dst = dst
        self.chunk, self.writers, self.counts, self.failed = chunk, writers, counts, failed
        self.reads: queue.Queue[Any] = queue.Queue(maxsize=IN_FLIGHT)
        self.waiting_on: int | None = None  # the peer whose message the walk waits for
        self.doing = "starting"  # what the walk waits for otherwise (for a stall's message)

    def progress(self) -> tuple[int, ...]:
        """Byte counters that move while this node gets anything done."""
        c = self.counts
        return c.read, c.received, c.sent, *self.writers.landed

    def run(self, group: Any) -> None:
        mine = [t for t in self.transfers if t.sender == self.me]
        reader = threading.Thread(target=self._read, args=(mine,), daemon=True,
                                  name="fanout-reader")
        reader.start()
        sizes = [s.entry.bytes for s in self.shards]
        steps = [(t, c, size, (t.sender, *t.chain))
                 for t, c, size in walk(self.transfers, sizes, self.chunk)
                 if self.me in (t.sender, *t.chain)]
        recvs = Receives(group, self.me, steps)
        sends: collections.deque[Any] = collections.deque()
        for i, (t, c, size, path) in enumerate(steps):
            pos = path.index(self.me)
            name = self.shards[t.index].entry.name
            last = c == len(chunks(self.shards[t.index].entry.bytes, self.chunk)) - 1
            if pos == 0:  # a file server that is no folder is named by its URL
                server = "the file server" if self.origin.folder else self.shards[t.index].source
                self.doing = f"reading shard {name} from {server if t.from_server else self.dst}"
                data = self.reads.get()
                if isinstance(data, BaseException):
                    raise data
                if t.from_server:
                    self.doing = f"writing shard {name} to {self.dst}"
                    self.writers.put(t, data, last)
            else:
                work, data = recvs.take(i)
                self.waiting_on = path[pos - 1]
                work.wait()
                self.waiting_on = None
                self.counts.received += size
                self.doing = f"writing shard {name} to {self.dst}"
                self.writers.put(t, data, last)
            if pos + 1 < len(path):
                sends.append((group.send([data], path[pos + 1], 0), data, path[pos + 1]))
                self.counts.sent += size
                while len(sends) > IN_FLIGHT:
                    self._sent(sends.popleft())
        while sends:
            self._sent(sends.popleft())
        reader.join()
        self.doing = f"writing the last shards to {self.dst}"

    def _sent(self, send: tuple[Any, Any, int]) -> None:
        """Wait until a send's receiver has taken it (that peer's stall, if any)."""
        self.waiting_on = send[2]
        send[0].wait()
        self.waiting_on = None

    def _read(self, mine: Sequence[Transfer]) -> None:
        try:
            read_ahead(self.origin, self.shards, mine, self.dst, self.me, self.chunk,
                       self.reads, self.counts)
        except BaseException as e:  # handed to the engine and the supervisor
            self.failed(e)
            self.reads.put(e)


def open_group(store: Any, rv: Rendezvous, me: int, n: int, timeout: float) -> Any:
    """The copiers' own Gloo group, on this host's interface towards the meeting point (it
    never touches the default process group, which may be the trainer's)."""
    import torch.distributed as dist

    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    opts._timeout = timedelta(seconds=timeout)
    ifname = os.environ.get("GLOO_SOCKET_IFNAME")
    device = dist.ProcessGroupGloo.create_device(interface=ifname) if ifname else \
        dist.ProcessGroupGloo.create_device(hostname=local_address_towards(rv.addr, rv.port))
    opts._devices = [device]
    return dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), me, n, opts)


@dataclass(frozen=True)
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
    """Run the engine on its own thread; this thread watches the others and the clock."""
    counts, failures, box = Counts(), list[BaseException](), list[Any]()
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


def fan_out(job: FanoutJob, rv: Rendezvous, tick: Progress) -> Counts:
    """Meet the other copiers at ``rv`` and move shards until every node holds every one.
    Returns this node's counts; raises StageError naming the node that failed or died."""
    store, hosting = open_store(rv, job.me, job.timeout)
    watch = Watch(store, job.me, job.n, min(HEARTBEAT, job.timeout / 2), str(rv))
    watch.start()
    try:
        have = _exchange(job, watch)
        t0 = time.monotonic()
        transfers = plan_transfers(have, [s.owner for s in job.shards])
        counts, group = _move(job, rv, watch, transfers, tick) if transfers else (Counts(), None)
        _leave(job, watch, hosting)
        counts.seconds = time.monotonic() - t0
        del group  # the links close once every node has all it needs
        return counts
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
        while hosting and int(watch.store.add("left", 0)) < watch.n \
                and time.monotonic() < until:
            time.sleep(POLL)
