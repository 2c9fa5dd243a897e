"""Fan-out's disk side: reading the shards a node sends, and landing those it receives.

A node sends what it owns from the file server and what it holds from its own ``dst``; a
read-ahead thread reads them, in sending order, as chunks. Received chunks go to ``jobs``
writer threads (a shard stays on one thread), which write each shard to its temporary name,
hash it as it lands, check it against the manifest's size and sha256, fsync and rename it:
nothing partial or bad under a final name. The protocol: imgprep.stage.fanout.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgprep.errors import ImgprepError, StageError
from imgprep.fsutil import tmp_name
from imgprep.stage.localdisk import open_tmp, write_error
from imgprep.stage.pool import Progress
from imgprep.stage.remote import Source
from imgprep.stage.schedule import Counts, Shard, Transfer, chunks


@dataclass
class _Landing:
    """A shard being written: its temporary file, the hash and size of what landed so far."""

    fd: int
    sha256: Any = field(default_factory=hashlib.sha256)
    size: int = 0


class Writers:
    """``jobs`` threads writing received chunks to temporary names, hashing as they land,
    then checking, fsyncing and renaming each shard (a shard stays on one thread)."""

    def __init__(self, shards: Sequence[Shard], dst: Path, me: int, jobs: int, tick: Progress,
                 counts: Counts, failed: Callable[[BaseException], None]) -> None:
        self.shards = shards
        self.dst = dst
        self.me = me
        self.tick = tick
        self.counts = counts
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
        landing: dict[int, _Landing] = {}
        try:
            while (job := q.get()) is not None:
                t, data, last = job
                if t.index not in landing:
                    landing[t.index] = _Landing(self._open(t))
                self._write(landing[t.index], t, data, k)
                if last:
                    self._finish(t, landing.pop(t.index))
        except BaseException as e:  # handed to the supervisor, which raises it
            self.failed(e)
            for index, file in landing.items():  # a rerun redoes these
                os.close(file.fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name(self.dst / self.shards[index].entry.name))

    def _open(self, t: Transfer) -> int:
        e = self.shards[t.index].entry
        try:
            return open_tmp(self.dst / e.name)
        except OSError as err:
            raise write_error(err, e.name, self.dst, self.me) from err

    def _write(self, file: _Landing, t: Transfer, data: Any, k: int) -> None:
        """Write one chunk (a tensor), hashing it; thread ``k`` counts what it wrote."""
        view = memoryview(data.numpy())
        file.size += len(view)
        file.sha256.update(view)
        try:
            while len(view):
                wrote = os.write(file.fd, view)
                view = view[wrote:]
                self.landed[k] += wrote
        except OSError as err:
            raise write_error(err, self.shards[t.index].entry.name, self.dst, self.me) from err

    def _finish(self, t: Transfer, file: _Landing) -> None:
        s = self.shards[t.index]
        e = s.entry
        final = self.dst / e.name
        try:
            got = file.sha256.hexdigest()
            if file.size != e.bytes or got != e.sha256:
                raise StageError(
                    f"node {self.me}: shard {e.name} from {self._origin(t, s)} does not match "
                    f"its manifest {s.manifest} ({file.size} bytes, sha256 {got[:12]}... != "
                    f"{e.bytes} bytes, {e.sha256[:12]}...): it is corrupt; restore or "
                    "reconvert it if it is the file server's, else rerun (the sender "
                    "re-checks its copy)")
            try:
                os.fsync(file.fd)
            except OSError as err:
                raise write_error(err, e.name, self.dst, self.me) from err
        except BaseException:
            os.close(file.fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp_name(final))
            raise
        os.close(file.fd)
        try:
            os.replace(tmp_name(final), final)
        except OSError as err:
            raise write_error(err, e.name, self.dst, self.me) from err
        self.counts.written += 1
        self.tick(e.bytes)

    def _origin(self, t: Transfer, s: Shard) -> str:
        """Where a received shard came from, for messages."""
        if not t.from_server:
            return f"node {t.sender}'s copy"
        if t.sender == self.me:
            return f"the file server's {s.source}"
        return f"the file server's {s.source} (read by node {t.sender})"


def read_ahead(origin: Source, shards: Sequence[Shard], mine: Sequence[Transfer], dst: Path,
               me: int, chunk: int, out: queue.Queue[Any], counts: Counts) -> None:
    """Read the shards this node sends, in sending order, as chunks (tensors) into ``out``:
    from the file server (``origin``) or this node's copy."""
    for t in mine:
        s = shards[t.index]
        path = s.source if t.from_server else dst / s.entry.name
        if t.from_server:
            fix = "restore or reconvert it, then rerun"
        else:
            fix = "rerun: this node then re-checks its copy"
        try:
            if t.from_server:
                opened = origin.open(s.entry.name)
            else:
                opened = open(path, "rb", buffering=0)
            with opened as f:
                _read_chunks(f, s, t.from_server, chunk, out, counts, str(path), me, fix)
        except FileNotFoundError as err:
            raise StageError(f"node {me}: {path} vanished (listed in {s.manifest}); "
                             f"{fix}") from err
        except OSError as err:
            if isinstance(err, ImgprepError):
                raise
            advice = getattr(err, "advice", None) or "check the file server, then rerun to resume"
            raise StageError(f"node {me}: cannot read {path}: {err.strerror or err}; "
                             f"{advice}") from err


def _read_chunks(f: Any, s: Shard, from_server: bool, chunk: int, out: queue.Queue[Any],
                 counts: Counts, path: str, me: int, fix: str) -> None:
    """Read one open shard into ``out`` chunk by chunk; it must have the manifest's size."""
    import torch

    for size in chunks(s.entry.bytes, chunk):
        buf = bytearray(size)
        got = 0
        while got < size and (k := f.readinto(memoryview(buf)[got:])):
            got += k
            if from_server:
                counts.read += k
        if got < size:
            raise StageError(f"node {me}: {path} is shorter than its manifest "
                             f"{s.manifest} says ({s.entry.bytes} bytes); {fix}")
        if size:
            out.put(torch.frombuffer(buf, dtype=torch.uint8))
        else:
            out.put(torch.empty(0, dtype=torch.uint8))
    if f.read(1):
        raise StageError(f"node {me}: {path} is longer than its manifest "
                         f"{s.manifest} says ({s.entry.bytes} bytes); {fix}")
