"""Running one step of the rehearsal: its child processes under a sampler, within a deadline.

A step is one or more commands started at once (four stage-to-node processes are one step).
While they run, a thread samples ``/proc`` every ``SAMPLE_EVERY_S`` for the step's processes
and all their descendants: the summed ``VmRSS`` of the tree (its peak is the step's "peak
RSS": a page shared by forked workers counts once per process, as ``ps`` shows it), the
largest single process's ``VmRSS``, and the open file descriptors (entries of
``/proc/<pid>/fd``) summed over the tree and of the largest holder. A process that lives
less than one interval may be missed; the kernel's own high-water mark of the largest reaped
child (``getrusage(RUSAGE_CHILDREN).ru_maxrss``, for the whole run so far) is kept beside it.
CPU time is that of the reaped children (``RUSAGE_CHILDREN``), so it covers every process of
the step. Children start in their own session and are killed with it at the deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import REPO, TreePeaks, machine_busy_s
from imgprep.procs import die_with_parent

SAMPLE_EVERY_S = 0.1
MB = 1e6
KB = 1024


@dataclass
class Deadline:
    """The run's time limit: each step gets what is left."""

    seconds: float
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)


@dataclass
class Proc:
    """One finished child: exit code (-9: killed at the deadline), its stdout's JSON lines,
    the tail of its stderr."""

    rc: int
    lines: list[dict[str, Any]]
    err: str

    @property
    def last(self) -> dict[str, Any]:
        return self.lines[-1] if self.lines else {}


def json_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def _start(cmd: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    parent = os.getpid()
    return subprocess.Popen(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, cwd=REPO,
                            preexec_fn=lambda: die_with_parent(parent))


def _finish(p: subprocess.Popen[str], deadline: Deadline) -> Proc:
    try:
        out, err = p.communicate(timeout=max(1.0, deadline.left()))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # the session this child leads: its own tree
        out, err = p.communicate()
        err += "\nkilled: the rehearsal's --timeout ran out"
    return Proc(p.returncode, json_lines(out), err.strip()[-800:])


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_step(name: str, images: int, jobs: Sequence[tuple[Sequence[str], dict[str, str]]],
             deadline: Deadline) -> tuple[dict[str, Any], list[Proc]]:
    """Run ``jobs`` (command, environment) at once and wait for all; returns the step's
    measures (``images`` is what its per-image cost divides by) and each process's result."""
    busy, cpu, t0 = machine_busy_s(), children_cpu_s(), time.perf_counter()
    procs = [_start(cmd, env) for cmd, env in jobs]
    with (TreePeaks([p.pid for p in procs], SAMPLE_EVERY_S) as tree,
          ThreadPoolExecutor(len(procs)) as pool):
        done = list(pool.map(lambda p: _finish(p, deadline), procs))  # no pipe fills up
    wall = time.perf_counter() - t0
    cpu_s = children_cpu_s() - cpu
    foreign = max(0.0, machine_busy_s() - busy - cpu_s) / wall if wall > 0 else 0.0
    step = {"step": name, "images": images, "seconds": wall, "cpu_s": cpu_s,
            "rate": images / wall if wall > 0 else 0.0,
            "us_per_image": wall / images * 1e6 if images else 0.0,
            "cpu_us_per_image": cpu_s / images * 1e6 if images else 0.0,
            "cores_busy": cpu_s / wall if wall > 0 else 0.0, "foreign_cores": foreign,
            "peak_rss_mb": tree.rss_kb * KB / MB, "peak_proc_rss_mb": tree.proc_rss_kb * KB / MB,
            "children_maxrss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            * KB / MB, "peak_fds": tree.fds, "peak_proc_fds": tree.proc_fds,
            "processes": tree.procs, "exit_codes": [d.rc for d in done],
            "timed_out": any(d.rc == -signal.SIGKILL for d in done) and deadline.left() <= 1}
    return step, done


def retime(step: dict[str, Any], seconds: float, cpu_s: float | None = None) -> None:
    """Time ``step`` by ``seconds`` measured inside its process (the work without the
    interpreter's start-up), keeping the process's own in ``process_s``."""
    step["process_s"], step["seconds"] = step["seconds"], seconds
    if cpu_s is not None:
        step["process_cpu_s"], step["cpu_s"] = step["cpu_s"], cpu_s
    n = step["images"]
    step["rate"] = n / seconds if seconds > 0 else 0.0
    step["us_per_image"] = seconds / n * 1e6 if n else 0.0
    step["cpu_us_per_image"] = step["cpu_s"] / n * 1e6 if n else 0.0
    step["cores_busy"] = step["cpu_s"] / seconds if seconds > 0 else 0.0


def disk_bytes(root: Path) -> int:
    """Bytes allocated under ``root`` (``st_blocks``; hard links once), 0 when absent."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for base, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(base, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total
