"""What the benchmark scripts share: where the real images are, a CPU-noise probe, verdicts,
and the run harness (check the images, work in a scratch folder, print a table then one JSON
line). Imported by the scripts beside it; not part of the installed packages."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_IMAGES = REPO.parent / "shared" / "data" / "imagenet-sample" / "images"
TICK = os.sysconf("SC_CLK_TCK")


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
