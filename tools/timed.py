"""Run one part of ``make test`` and say its wall time against its budget.

    python3 tools/timed.py --log FILE PART BUDGET_S -- COMMAND ...
    python3 tools/timed.py --summary FILE

The budgets are the Makefile's (``BUDGET_*`` beside the ``test`` target), in seconds on a
quiet 2-core machine. A part that runs over says so loudly, in one line naming the part, by
how much, and the load average, but does not fail for it: the budget is a signal, as the
benchmarks' targets are where they are not judged. The exit status is the command's (128 +
the signal where one ended it), so a failing part still fails ``make test``. ``--log``
appends the part's line to FILE (tab-separated: part, seconds, budget, status, start as Unix
time); ``--summary`` prints every part of FILE and the total against the budgets' sum. Parts
may run side by side (lint and the wheel check do): the total is the wall time from the first
part's start to the last one's end.

Standard library only: it runs with the system's Python.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

PREFIX = "make test:"


def clock(seconds: float) -> str:
    """``seconds`` as ``4m05s``."""
    m, s = divmod(round(seconds), 60)
    return f"{m}m{s:02d}s"


def over(seconds: float, budget: float) -> bool:
    """Over the budget by a whole second or more (as the lines show the times)."""
    return round(seconds) > round(budget)


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def verdict(part: str, seconds: float, budget: float, status: int) -> list[str]:
    """The lines said when ``part`` ends: its time against its budget, then, when it ran over,
    the loud one."""
    failed = f", failed (exit {status})" if status else ""
    lines = [f"{PREFIX} {part}: {clock(seconds)} of its {clock(budget)} budget{failed}"]
    if over(seconds, budget):
        lines.append(f"{PREFIX} OVER BUDGET: {part} took {clock(seconds)}, "
                     f"{clock(seconds - budget)} over its {clock(budget)} (load average "
                     f"{load()}; the budgets: BUDGET_* in the Makefile)")
    return lines


def run(part: str, budget: float, command: Sequence[str], log: Path | None) -> int:
    print(f"{PREFIX} {part} (budget {clock(budget)}): {shlex.join(command)}", flush=True)
    start, started = time.monotonic(), time.time()
    child = subprocess.Popen(command)
    while True:
        try:
            status = child.wait()
            break
        except KeyboardInterrupt:  # the terminal's ^C reaches the child too: wait for it
            continue
    seconds = time.monotonic() - start
    status = 128 - status if status < 0 else status
    for line in verdict(part, seconds, budget, status):
        print(line, flush=True)
    if log is not None:
        with open(log, "a") as f:
            f.write(f"{part}\t{seconds:.1f}\t{budget:g}\t{status}\t{started:.1f}\n")
    return status


def summary(log: Path) -> list[str]:
    """Each logged part against its budget, then the total (the wall time the parts span, or
    their sum where a line has no start) against the budgets' sum."""
    rows = [line.split("\t") for line in log.read_text().splitlines() if line.strip()]
    width = max([len(r[0]) for r in rows] + [len("all")])
    out = [f"{PREFIX} wall time against the budgets (BUDGET_* in the Makefile: a quiet "
           "2-core machine)"]
    total = allowed = 0.0
    for part, seconds, budget, status, *_ in rows:
        s, b = float(seconds), float(budget)
        total, allowed = total + s, allowed + b
        note = f"  OVER by {clock(s - b)}" if over(s, b) else ""
        note += f"  failed (exit {status})" if status != "0" else ""
        out.append(f"  {part:<{width}}  {clock(s):>7} of {clock(b)}{note}")
    if all(len(r) == 5 for r in rows):
        total = max(float(r[4]) + float(r[1]) for r in rows) - min(float(r[4]) for r in rows)
    note = f"  OVER by {clock(total - allowed)}" if over(total, allowed) else ""
    out.append(f"  {'all':<{width}}  {clock(total):>7} of {clock(allowed)}{note}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", type=Path, default=None, help="append the part's line to FILE")
    ap.add_argument("--summary", type=Path, default=None, metavar="FILE",
                    help="print the parts logged in FILE and their total")
    ap.add_argument("part", nargs="?")
    ap.add_argument("budget", nargs="?", type=float, help="seconds")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = ap.parse_args(argv)
    if args.summary is not None:
        for line in summary(args.summary):
            print(line)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.part is None or args.budget is None or not command:
        ap.error("give PART BUDGET_S -- COMMAND, or --summary FILE")
    return run(args.part, args.budget, command, args.log)


if __name__ == "__main__":
    sys.exit(main())
