"""The cluster in a box as one context manager: build on entry, tear down on every exit.

``with Box(topo, export, scratch) as box:`` takes a per-prefix lock (two runs with one prefix
never overlap), removes what an earlier, killed run with the same prefix left behind (sshfs
mounts under its scratch folders, processes in its namespaces, the namespaces, then the
scratch folders), builds the namespaces and links, and starts the file server. On exit —
normal, an exception, SIGINT, SIGTERM or SIGHUP (turned into SystemExit while the box is
open) — it unmounts every sshfs mount, stops sshd by its pid, ends whatever still runs in the
namespaces and deletes them.
``box.mounts(n)`` mounts the export on nodes 0..n-1 for one phase and counts the bytes the
server read for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from harness.cluster import netns
from harness.cluster.netns import ClusterError, Topology
from harness.cluster.procs import Started
from harness.cluster.sshfs import (
    FileServer,
    mount,
    mount_root,
    served_bytes,
    sshfs_mounts,
    start_server,
    stop_server,
    unmount,
)

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def clean_leftovers(prefix: str, keep: Path | None = None) -> list[str]:
    """Unmount, stop and delete what a killed run with ``prefix`` left (its mounts, the
    processes in its namespaces, the namespaces, then its scratch folders, ``keep`` aside);
    what was found."""
    found = sshfs_mounts(mount_root(prefix)) + netns.namespaces(prefix)
    for mp in sshfs_mounts(mount_root(prefix)):
        unmount(Path(mp))
    netns.remove(prefix)
    for old in glob.glob(mount_root(prefix) + "*"):
        if os.path.isdir(old) and Path(old) != keep and not sshfs_mounts(old):
            shutil.rmtree(old, ignore_errors=True)
            found.append(old)
    return found


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@dataclass
class Phase:
    """One phase's mounts: the mount points, and the bytes the server read while they lived
    (filled in when the phase ends)."""

    paths: list[Path]
    served: int = 0


class Box(Started):
    """Build the cluster on ``__enter__``; tear it down on ``__exit__``."""

    def __init__(self, topo: Topology, export: Path) -> None:
        self.topo = topo
        self.export = export
        self.scratch = Path(tempfile.mkdtemp(prefix=os.path.basename(mount_root(topo.prefix))))
        self.server: FileServer | None = None
        self.leftovers: list[str] = []
        self._lock_fd = -1
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Box:
        self._lock()  # before anything that close() would undo: the lock may be another run's
        self._old = {s: signal.signal(s, _raise_exit) for s in SIGNALS}
        return super().__enter__()

    def _start(self) -> None:
        self.leftovers = clean_leftovers(self.topo.prefix, self.scratch)
        netns.build(self.topo)
        self.server = start_server(self.topo, self.export, self.scratch / "keys",
                                   self.scratch / "sshd.log")

    def _lock(self) -> None:
        path = os.path.join(tempfile.gettempdir(), f"{self.topo.prefix}cluster.lock")
        self._lock_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            os.close(self._lock_fd)
            raise ClusterError(f"another cluster run holds {path}; wait for it to end or "
                               "use another --prefix") from e

    def close(self) -> None:
        """Tear everything down (idempotent); signals are held off meanwhile."""
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        try:
            for mp in sshfs_mounts(str(self.scratch)):
                unmount(Path(mp))
            if self.server is not None:
                stop_server(self.server)
            netns.remove(self.topo.prefix)
        finally:
            for signum, old in self._old.items():
                signal.signal(signum, old)
            self._old = {}
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
            if not sshfs_mounts(str(self.scratch)):  # never walk into a live mount
                shutil.rmtree(self.scratch, ignore_errors=True)

    def net(self, k: int) -> list[str]:
        """argv prefix running a command in node ``k``'s network namespace."""
        return netns.in_net(self.topo.node(k))

    @contextlib.contextmanager
    def mounts(self, n: int) -> Iterator[Phase]:
        """The export mounted on nodes 0..n-1 for one phase; counts the server's bytes."""
        if self.server is None:
            raise ClusterError("the box is not open")
        phase = Phase([self.scratch / f"mnt{k}" for k in range(n)])
        try:
            for k, mp in enumerate(phase.paths):
                mount(self.server, k, mp)
            before = served_bytes(self.topo)
            yield phase
            phase.served = served_bytes(self.topo) - before
        finally:
            for mp in phase.paths:
                if str(mp) in sshfs_mounts(str(mp)):
                    unmount(mp)
