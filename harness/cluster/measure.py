"""What the cluster benchmark measures inside the box, one function per kind of run.

- :class:`Loaders`: the same loader (``loaders.make_loader``, one per node, node k being
  rank k of n) on n folders at once, in the nodes' namespaces or outside any, started once;
  each measurement has them all read one whole epoch, starting at the same moment.
- :func:`stage`: ``imgprep stage-to-node`` on n nodes at once from their sshfs mounts, with
  the server's bytes counted at the server, and every node's files checked against the
  manifest's sha256.
- :func:`stage_s3`: the same from the S3 store on the file server (``s3://``), with the
  bytes the store sent counted on the server's link.
- :func:`p2p_rate`: a Gloo send/recv between nodes 0 and 1 (the node link's rate).
- :func:`train`: ``train_imagenet.py`` under torchrun across two node namespaces (c10d
  rendezvous on node 0, one process per node).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from harness.cluster.box import Box
from harness.cluster.netns import ClusterError
from harness.cluster.procs import REPO, Group, child_env, last_json, run_group
from harness.cluster.s3store import S3Store
from imgprep import Manifest, node_shards

PROBE = Path(__file__).resolve().parent / "probe.py"
TRAIN = REPO / "scripts" / "train_imagenet.py"
GLOO_ENV = {"GLOO_SOCKET_IFNAME": "eth0"}  # Gloo binds the node's own link, not a hostname


class Loaders:
    """One loader per node (node k = rank k of n), started once and kept waiting; each
    :meth:`rates` call has them all read one whole epoch, starting together."""

    def __init__(self, box: Box, dirs: Sequence[Path], in_nodes: bool,
                 timeout: float) -> None:
        self.n, self.timeout = len(dirs), timeout
        argvs = [(box.net(k) if in_nodes else []) + [
            sys.executable, str(PROBE), "loader", "--data", str(d), "--rank", str(k),
            "--world", str(self.n)] for k, d in enumerate(dirs)]
        self.group = Group(argvs, timeout, stdin=True)

    def ready(self) -> None:
        """Wait until every loader has taken its first batch."""
        for i in range(self.n):
            if self._line(i) != "ready":
                raise ClusterError(f"loader probe {i} ended before it was ready: "
                                   f"{self.group.stderr_tail(i)}")

    def _line(self, i: int) -> str:
        while (line := self.group.readline(i)) and not (line.startswith("{")
                                                         or line.strip() == "ready"):
            pass
        return line.strip()

    def rates(self) -> list[float]:
        """images/s of each node's loader, all counting at once."""
        self.group.deadline = time.monotonic() + self.timeout
        self.group.send("go\n")
        lines = [self._line(i) for i in range(self.n)]
        if not all(lines):
            raise ClusterError("a loader probe ended while measuring")
        return [float(json.loads(x)["images_per_s"]) for x in lines]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.group.send("exit\n")
        self.group.wait()


@contextlib.contextmanager
def loaders(box: Box, dirs: Sequence[Path], in_nodes: bool,
            timeout: float) -> Iterator[Loaders]:
    """:class:`Loaders`, ready, ended (by pid) however the block exits."""
    group = Loaders(box, dirs, in_nodes, timeout)
    try:
        group.ready()
        yield group
        group.close()
    finally:
        group.group.kill()


def stage_argv(box: Box, k: int, n: int, src: Path, dst: Path, mode: str, fanout: bool,
               port: int, timeout: float) -> list[str]:
    argv = box.net(k) + [sys.executable, "-m", "imgprep", "stage-to-node", "--src", str(src),
                         "--dst", str(dst), "--num-nodes", str(n), "--node-rank", str(k),
                         "--timeout", str(int(timeout)), "--json", "--quiet"]
    argv += ["--mode", "replicate" if fanout else mode]
    if fanout:
        argv += ["--fanout", "--rendezvous", f"{box.topo.node_ip(0)}:{port}"]
    return argv


class LinkTrace:
    """Bytes received on each node's link over time, sampled every ``every`` seconds from
    ``/proc/<pid>/net/dev`` of a process living in the node's namespace (no command run)."""

    def __init__(self, pids: Sequence[int], every: float = 0.05) -> None:
        self.pids, self.every = list(pids), every
        self.samples: list[list[tuple[float, int]]] = [[] for _ in self.pids]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            for pid, trace in zip(self.pids, self.samples, strict=True):
                with contextlib.suppress(OSError, StopIteration, ValueError):
                    with open(f"/proc/{pid}/net/dev") as f:
                        row = next(x for x in f if x.strip().startswith("eth0:"))
                    trace.append((t, int(row.split(":", 1)[1].split()[0])))
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def busy_seconds(self, k: int, lo: float = 0.02, hi: float = 0.98) -> float:
        """How long node ``k`` took to receive the middle ``hi - lo`` of its bytes."""
        trace = self.samples[k]
        if len(trace) < 2 or trace[-1][1] <= trace[0][1]:
            return 0.0
        base, total = trace[0][1], trace[-1][1] - trace[0][1]
        t_lo = next(t for t, b in trace if b - base >= lo * total)
        t_hi = next(t for t, b in trace if b - base >= hi * total)
        return max(t_hi - t_lo, self.every)


def peer_rate(received: int, busy_s: float, report: dict[str, Any]) -> float:
    """MB/s a node received from its peers: the middle 96 % of its bytes over the time the link
    trace saw them take, or, when the trace missed the transfer (over before two samples, or
    the node gone before it was read), over the fan-out time the node reported itself."""
    if not received:
        return 0.0
    if busy_s > 0:
        return 0.96 * received / busy_s / 1e6
    seconds = float(report.get("fanout_seconds") or 0.0)
    return received / seconds / 1e6 if seconds > 0 else 0.0


def stage(box: Box, n: int, dsts: Sequence[Path], mode: str, manifest: Manifest,
          port: int, timeout: float) -> dict[str, Any]:
    """Stage onto nodes 0..n-1 at once (``mode``: replicate, partition or fanout)."""
    fanout = mode == "fanout"
    with box.mounts(n) as phase:
        t0 = time.perf_counter()
        group = Group([stage_argv(box, k, n, phase.paths[k], dsts[k], mode, fanout, port,
                                  timeout) for k in range(n)], timeout, child_env(GLOO_ENV))
        trace = LinkTrace([p.pid for p in group.procs])
        try:
            outs = group.wait()
        finally:
            trace.stop()
        wall = time.perf_counter() - t0
    reports = [last_json(o) for o in outs]
    received = [int(r.get("bytes_received", 0)) for r in reports]
    peer = [peer_rate(rx, trace.busy_seconds(k), r) for k, (rx, r)
            in enumerate(zip(received, reports, strict=True))]
    return {"mode": mode, "nodes": n, "wall_s": round(wall, 2),
            "seconds": round(max(float(r["seconds"]) for r in reports), 2),
            "server_bytes": phase.served,
            "bytes_read": [int(r.get("bytes_read", 0)) for r in reports],
            "bytes_received": received,
            "fanout_seconds": [r.get("fanout_seconds") for r in reports],
            "peer_mb_per_s": [round(x, 1) for x in peer],
            "identical": shards_match(dsts, manifest, "partition" if mode == "partition"
                                      else "replicate")}


def shards_match(dsts: Sequence[Path], manifest: Manifest, mode: str) -> bool:
    """Whether every node holds exactly the shards it should, each with the manifest's
    sha256 (replicate and fan-out: all of them; partition: the node's share)."""
    shares = node_shards([s.samples for s in manifest.shards], len(dsts), mode, 0)
    for dst, share in zip(dsts, shares, strict=True):
        want = [manifest.shards[i] for i in share]
        have = sorted(p.name for p in dst.glob(f"{manifest.split}-*.tar"))
        if have != sorted(s.name for s in want):
            return False
        for s in want:
            with open(dst / s.name, "rb") as f:
                if hashlib.file_digest(f, "sha256").hexdigest() != s.sha256:
                    return False
    return True


def p2p_rate(box: Box, port: int, mb: int, timeout: float) -> float:
    """Gloo send/recv MB/s from node 0 to node 1 across their links (median of 5)."""
    argvs = [box.net(r) + [sys.executable, str(PROBE), "p2p", "--addr", box.topo.node_ip(0),
                           "--port", str(port), "--rank", str(r), "--mb", str(mb)]
             for r in (0, 1)]
    outs = run_group(argvs, timeout, child_env(GLOO_ENV))
    return float(last_json(outs[1])["mb_per_s"])


def train(box: Box, dirs: Sequence[Path], log: Path, steps: int, port: int,
          timeout: float) -> float:
    """Train the tiny net on two nodes for ``steps``; returns the wall seconds."""
    common = ["--arch", "tiny", "--image-size", "64", "--batch-size", "32", "--workers", "1",
              "--threads", "1", "--epochs", "1000", "--steps", str(steps), "--log-every",
              str(max(1, steps // 4)), "--no-validate", "--warmup-epochs", "0.1",
              "--timeout", "120", "--log-json", str(log)]
    argvs = [box.net(k) + [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{box.topo.node_ip(0)}:{port}",
        "--rdzv-id", "cluster", "--local-addr", box.topo.node_ip(k), str(TRAIN),
        "--data", str(dirs[k]), *common] for k in range(2)]
    t0 = time.perf_counter()
    run_group(argvs, timeout, child_env(GLOO_ENV))
    return time.perf_counter() - t0


def stage_s3(box: Box, store: S3Store, n: int, dsts: Sequence[Path], mode: str,
             manifest: Manifest, port: int, timeout: float) -> dict[str, Any]:
    """Stage from the S3 store onto nodes 0..n-1 at once (``mode``: replicate or fanout), with
    the bytes the store sent counted on the server's link."""
    fanout = mode == "fanout"
    argvs = [box.net(k) + [
        sys.executable, "-m", "imgprep", "stage-to-node", "--src", store.url, "--dst",
        str(dsts[k]), "--split", manifest.split, "--num-nodes", str(n), "--node-rank", str(k),
        "--mode", "replicate", "--timeout", str(int(timeout)), "--json", "--quiet"]
        + (["--fanout", "--rendezvous", f"{box.topo.node_ip(0)}:{port}"] if fanout else [])
        for k in range(n)]
    before = store.sent()
    t0 = time.perf_counter()
    outs = run_group(argvs, timeout, child_env({**GLOO_ENV, **store.env()}))
    wall = time.perf_counter() - t0
    sent = store.sent() - before
    reports = [last_json(o) for o in outs]
    return {"mode": mode, "nodes": n, "wall_s": round(wall, 2),
            "seconds": round(max(float(r["seconds"]) for r in reports), 2),
            "store_bytes": sent, "store_bytes_over_set": round(sent / manifest.total_bytes, 4),
            "bytes_read": [int(r.get("bytes_read", 0)) for r in reports],
            "bytes_received": [int(r.get("bytes_received", 0)) for r in reports],
            "nodes_identical": shards_match(dsts, manifest, "replicate")}
