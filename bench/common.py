"""What the benchmarks share: where the real images are, a CPU-noise probe, process-tree
peaks, an epoch timed end to end, verdicts, and the run harness (check the images, work in a
scratch folder, print a table then one JSON line). The harnesses (``harness/``) measure with
it too. Not part of the installed packages: the benchmarks run as modules from the repository
root (``python -m bench.convert``). Standard library only at the top: ``bench.ffcv_peer``
imports it in FFCV's own environment."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_IMAGES = REPO.parent / "shared" / "data" / "imagenet-sample" / "images"
TICK = os.sysconf("SC_CLK_TCK")
QUIET_FOREIGN_CORES = 0.2  # a pass is "quiet" when other processes used less CPU than this


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def machine_busy_s() -> float:
    """CPU seconds all processes on the machine have used since boot (steal included)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq…
    return (sum(v) - v[3] - v[4]) / TICK


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (from /proc; none once it has exited)."""
    kids: list[int] = []
    with contextlib.suppress(OSError):  # the process may exit while we look
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
    return kids


def descendants(root: int | None = None) -> set[int]:
    """Every live descendant of ``root`` (default: this process)."""
    pids: set[int] = set()
    todo = children(os.getpid() if root is None else root)
    while todo:
        pid = todo.pop()
        if pid not in pids:
            pids.add(pid)
            todo += children(pid)
    return pids


def proc_kb(pid: int, field: str, table: str = "status") -> int:
    """A kB field of ``/proc/<pid>/<table>`` (``VmRSS:`` in status, ``Pss:`` in smaps_rollup);
    0 once the process has exited or where the kernel does not report it."""
    try:
        with open(f"/proc/{pid}/{table}") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def open_fds(pid: int) -> int:
    """Open file descriptors of ``pid`` (0 once it has exited)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


class TreePeaks:
    """Peaks over the process trees under ``roots``, sampled from ``/proc`` on a thread every
    ``every_s`` while the ``with`` block runs: the summed ``VmRSS`` (kB; a page shared by
    forked workers counts once per process, as ``ps`` shows it), the largest single
    process's ``VmRSS``, the summed and largest open file descriptors, the process count and,
    with ``pss=True``, the summed ``Pss`` (shared pages split between their holders: what
    the tree really holds). A process that lives less than one interval may be missed."""

    def __init__(self, roots: Sequence[int], every_s: float = 0.1, pss: bool = False) -> None:
        self.roots, self.every_s, self.with_pss = list(roots), every_s, pss
        self.rss_kb = self.proc_rss_kb = self.pss_kb = 0
        self.fds = self.proc_fds = self.procs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        pids = set(self.roots)
        for root in self.roots:
            pids |= descendants(root)
        rss = [proc_kb(p, "VmRSS:") for p in pids]
        fds = [open_fds(p) for p in pids]
        self.rss_kb = max(self.rss_kb, sum(rss))
        self.proc_rss_kb = max(self.proc_rss_kb, max(rss, default=0))
        self.fds = max(self.fds, sum(fds))
        self.proc_fds = max(self.proc_fds, max(fds, default=0))
        self.procs = max(self.procs, sum(1 for r in rss if r))
        if self.with_pss:
            self.pss_kb = max(self.pss_kb, sum(proc_kb(p, "Pss:", "smaps_rollup") for p in pids))

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> TreePeaks:
        self._thread.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()


def paired_ratio(num: Sequence[tuple[float, float]], den: Sequence[tuple[float, float]]) -> float:
    """The median over rounds of one measure's rate over another's, ``(rate, foreign cores)``
    per round, each pair taken in the same round (a slow spell of a shared machine lasts
    seconds to minutes, so it weighs on both); rounds where another process disturbed either
    pass are set aside unless all were."""
    pairs = list(zip(num, den, strict=True))
    quiet = [a / b for (a, fa), (b, fb) in pairs
             if fa < QUIET_FOREIGN_CORES and fb < QUIET_FOREIGN_CORES]
    return statistics.median(quiet or [a / b for (a, _), (b, _) in pairs])


def timed_epoch(batches: Iterable[tuple[Any, ...]],
                problem: Callable[[Any], str | None]) -> dict[str, float]:
    """One epoch end to end, each batch ``(images, labels)`` with the batch size first:
    images/s, first-batch latency, and the rate after it. ``problem(images)`` looks at the
    first batch; what it says, if anything, stops the run."""
    n = first_n = 0
    first = last = 0.0
    t0 = time.perf_counter()
    for images, _labels in batches:
        now = time.perf_counter()
        if not n:
            first, first_n = now - t0, images.shape[0]
            if (what := problem(images)) is not None:
                raise SystemExit(f"unexpected batch: {what}")
        n += images.shape[0]
        last = now - t0
    total = time.perf_counter() - t0
    after = (n - first_n) / (last - first) if last > first else 0.0
    return {"rate": n / total, "images": n, "first_batch_s": first, "seconds": total,
            "rate_after_first_batch": after}


def verdict(value: float, target: float, below: bool = False) -> str:
    ok = value < target if below else value >= target
    return "PASS" if ok else "SHORT"


def run_main(name: str, images: Path, out: Path | None,
             run: Callable[[Path], dict[str, Any]],
             print_table: Callable[[dict[str, Any]], None]) -> int:
    """Check ``images``, run ``run(scratch)`` in a scratch folder (under ``out`` if given,
    removed afterwards), print the table, then the result as the last line of JSON."""
    if not images.is_dir() or not any(p.suffix.lower() in (".jpeg", ".jpg")
                                       for p in images.iterdir()):
        print(f"{name}: no JPEGs in {images}; it should hold the 1000 real ILSVRC2012 sample "
              "JPEGs (../shared/data/imagenet-sample/images beside the repository); pass "
              "--images DIR to use another folder", file=sys.stderr)
        return 2
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=out))
    try:
        res = run(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(res)
    print(json.dumps(res, sort_keys=True))
    return 0


def rchar() -> int:
    """Bytes this process has read through read-like system calls (kernel count)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def repeated_shards(images: Path, scratch: Path, min_bytes: float, min_shards: int,
                    base_shards: int) -> Path:
    """``scratch/src``: ``images`` converted to ``base_shards`` real shards, copied under new
    names (each its own file and inode: no shared page cache) until there are at least
    ``min_bytes`` and ``min_shards``, with a manifest (and no sample index: the caller builds
    one when it needs it)."""
    from dataclasses import replace

    from imgprep import ConvertOptions, ShardEntry, convert_splits, read_manifest
    from imgprep.shards.manifest import write_manifest

    tar = scratch / "images.tar"
    subprocess.run(["tar", "cf", str(tar), "-C", str(images), "."], check=True, timeout=300)
    base = scratch / "base"
    convert_splits(ConvertOptions(input=tar, out=base, num_shards=base_shards,
                                  workers=os.cpu_count() or 1))
    tar.unlink()
    m = read_manifest(base, "train")
    src = scratch / "src"
    src.mkdir()
    shards: list[ShardEntry] = []
    while sum(e.bytes for e in shards) < min_bytes or len(shards) < min_shards:
        for e in m.shards:
            name = f"train-{len(shards):06d}.tar"
            shutil.copyfile(base / e.name, src / name)
            shards.append(replace(e, name=name))
    write_manifest(src, replace(m, shards=shards, index=None,
                                total_samples=sum(e.samples for e in shards)))
    shutil.rmtree(base)
    return src
