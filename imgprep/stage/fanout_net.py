"""Fan-out's network side: one node's walk through the transfers over the copiers' Gloo group.

Every node walks the same (round, chunk, sender) order (imgprep.stage.schedule.walk), keeping
the steps it takes part in: it sends what it reads or receives to the next node of the
shard's chain, posting sends and receives ``IN_FLIGHT`` steps ahead without waiting, and waits
only on the receive at hand. The protocol and why the walk cannot deadlock:
imgprep.stage.fanout.
"""

from __future__ import annotations

import collections
import os
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from imgprep.job.rendezvous import Rendezvous, local_address_towards
from imgprep.stage.fanout_disk import Writers, read_ahead
from imgprep.stage.remote import Source
from imgprep.stage.schedule import Counts, Shard, Transfer, chunks, walk

NET_CHUNK = 4 << 20  # bytes a message carries: small enough to pipeline, large enough to stream
IN_FLIGHT = 8  # sends (and receives) a node keeps posted ahead


@dataclass(frozen=True, kw_only=True)
class Step:
    """One chunk of one transfer that this node takes part in: ``path`` is the sender then
    the chain, ``pos`` this node's place on it, ``last`` whether it is the shard's last chunk."""

    transfer: Transfer
    size: int
    path: tuple[int, ...]
    pos: int
    last: bool

    @property
    def previous(self) -> int:
        """The node this step's chunk comes from (this node is not the sender)."""
        return self.path[self.pos - 1]

    @property
    def next(self) -> int | None:
        """The node this step's chunk goes to, if any."""
        return self.path[self.pos + 1] if self.pos + 1 < len(self.path) else None


def my_steps(transfers: Sequence[Transfer], shards: Sequence[Shard], me: int,
             chunk: int) -> list[Step]:
    """The steps of the common walk that node ``me`` takes part in, in walking order."""
    sizes = [s.entry.bytes for s in shards]
    steps = []
    for t, c, size in walk(transfers, sizes, chunk):
        path = (t.sender, *t.chain)
        if me in path:
            last = c == len(chunks(sizes[t.index], chunk)) - 1
            steps.append(Step(transfer=t, size=size, path=path, pos=path.index(me), last=last))
    return steps


class Receives:
    """This node's receives, posted ``IN_FLIGHT`` steps ahead of its walk (posting waits for
    nothing, and each link's receives are posted in the link's order), so that the next chunk
    is already on its way while this one is handled."""

    def __init__(self, group: Any, steps: Sequence[Step]) -> None:
        self.group = group
        self.todo = collections.deque((i, s) for i, s in enumerate(steps) if s.pos > 0)
        self.posted: dict[int, tuple[Any, Any]] = {}

    def take(self, step: int) -> tuple[Any, Any]:
        """Step ``step``'s (work, buffer), after posting the receives that come next."""
        import torch

        while self.todo and len(self.posted) < IN_FLIGHT:
            i, s = self.todo.popleft()
            buf = torch.empty(s.size, dtype=torch.uint8)
            self.posted[i] = (self.group.recv([buf], s.previous, 0), buf)
        return self.posted.pop(step)


class Engine:
    """One node's walk through the transfers (see imgprep.stage.fanout, step 3), on its own
    thread; ``waiting_on`` and ``doing`` say what it waits for, for a stall's message."""

    def __init__(self, origin: Source, shards: Sequence[Shard], transfers: Sequence[Transfer],
                 me: int, dst: Path, chunk: int, writers: Writers, counts: Counts,
                 failed: Callable[[BaseException], None]) -> None:
        self.origin = origin
        self.shards = shards
        self.transfers = transfers
        self.me = me
        self.dst = dst
        self.chunk = chunk
        self.writers = writers
        self.counts = counts
        self.failed = failed
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
        steps = my_steps(self.transfers, self.shards, self.me, self.chunk)
        recvs = Receives(group, steps)
        sends: collections.deque[tuple[Any, Any, int]] = collections.deque()
        for i, step in enumerate(steps):
            data = self._own(step) if step.pos == 0 else self._receive(step, recvs.take(i))
            if (to := step.next) is not None:
                sends.append((group.send([data], to, 0), data, to))
                self.counts.sent += step.size
                while len(sends) > IN_FLIGHT:
                    self._sent(sends.popleft())
        while sends:
            self._sent(sends.popleft())
        reader.join()
        self.doing = f"writing the last shards to {self.dst}"

    def _own(self, step: Step) -> Any:
        """A chunk this node sends: read ahead from the file server (then also written
        here) or from its own copy."""
        t = step.transfer
        s = self.shards[t.index]
        if t.from_server:  # a file server that is no folder is named by its URL
            where = "the file server" if self.origin.folder else s.source
        else:
            where = str(self.dst)
        self.doing = f"reading shard {s.entry.name} from {where}"
        data = self.reads.get()
        if isinstance(data, BaseException):
            raise data
        if t.from_server:
            self.doing = f"writing shard {s.entry.name} to {self.dst}"
            self.writers.put(t, data, step.last)
        return data

    def _receive(self, step: Step, posted: tuple[Any, Any]) -> Any:
        """A chunk from the previous node of the chain, handed to the writers."""
        work, data = posted
        self.waiting_on = step.previous
        work.wait()
        self.waiting_on = None
        self.counts.received += step.size
        self.doing = f"writing shard {self.shards[step.transfer.index].entry.name} to {self.dst}"
        self.writers.put(step.transfer, data, step.last)
        return data

    def _sent(self, send: tuple[Any, Any, int]) -> None:
        """Wait until a send (work, buffer, peer) has been taken by its peer (that peer's
        stall, if any); the buffer is held until then."""
        work, _, peer = send
        self.waiting_on = peer
        work.wait()
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
    if ifname:
        device = dist.ProcessGroupGloo.create_device(interface=ifname)
    else:
        host = local_address_towards(rv.addr, rv.port)
        device = dist.ProcessGroupGloo.create_device(hostname=host)
    opts._devices = [device]
    return dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), me, n, opts)
