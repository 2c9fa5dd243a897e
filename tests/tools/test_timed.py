"""The budget of each part of ``make test`` (tools/timed.py): the part's wall time against its
budget, a loud line when it runs over without failing for it, the command's own exit status,
the summary of every part; and the Makefile's budgets, which keep to 12 minutes in all."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from tests.support import REPO
from tools.timed import clock, summary, verdict

TIMED = REPO / "tools" / "timed.py"


def timed(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TIMED), *map(str, args)], capture_output=True,
                          text=True, timeout=60)


def test_a_part_within_its_budget_says_its_time_and_passes_its_output_on(tmp_path: Path) -> None:
    log = tmp_path / "times.tsv"
    done = timed("--log", log, "lint", "90", "--", sys.executable, "-c", "print('checked')")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("make test: lint (budget 1m30s): ") and lines[1] == "checked"
    assert lines[2] == "make test: lint: 0m00s of its 1m30s budget" and len(lines) == 3
    part, seconds, budget, status, start = log.read_text().strip().split("\t")
    assert (part, budget, status) == ("lint", "90", "0") and float(seconds) < 30
    assert abs(float(start) - time.time()) < 60


def test_a_part_over_its_budget_says_so_loudly_and_does_not_fail_for_it() -> None:
    done = timed("pytest", "0", "--", sys.executable, "-c", "import time; time.sleep(1.6)")
    assert done.returncode == 0, done.stderr
    loud = done.stdout.splitlines()[-1]
    assert re.fullmatch(r"make test: OVER BUDGET: pytest took 0m0[2-9]s, 0m0[2-9]s over its "
                        r"0m00s \(load average .*; the budgets: BUDGET_\* in the Makefile\)",
                        loud), loud


def test_a_failing_part_keeps_its_exit_status(tmp_path: Path) -> None:
    log = tmp_path / "times.tsv"
    done = timed("--log", log, "wheel-check", "90", "--", sys.executable, "-c",
                 "raise SystemExit(3)")
    assert done.returncode == 3
    assert done.stdout.splitlines()[-1].endswith("budget, failed (exit 3)")
    assert log.read_text().split("\t")[3] == "3"


def test_the_lines_and_the_summary() -> None:
    assert clock(0.4) == "0m00s" and clock(65) == "1m05s" and clock(725.6) == "12m06s"
    assert verdict("lint", 90.4, 90, 0) == ["make test: lint: 1m30s of its 1m30s budget"]
    assert len(verdict("lint", 91, 90, 0)) == 2 and "1m31s, 0m01s over its 1m30s" in verdict(
        "lint", 91, 90, 0)[1]


def test_the_summary_adds_the_parts_up(tmp_path: Path) -> None:
    log = tmp_path / "times.tsv"
    log.write_text("lint\t70.2\t90\t0\npytest\t450.0\t420\t0\npytest-serial\t60\t120\t1\n")
    lines = summary(log)
    assert lines[1:] == ["  lint             1m10s of 1m30s",
                         "  pytest           7m30s of 7m00s  OVER by 0m30s",
                         "  pytest-serial    1m00s of 2m00s  failed (exit 1)",
                         "  all              9m40s of 10m30s"]
    done = timed("--summary", log)
    assert done.returncode == 0 and done.stdout.splitlines()[1:] == lines[1:]


def test_parts_side_by_side_count_once_in_the_total(tmp_path: Path) -> None:
    """Lint and the wheel check run at once: the total is the wall time from the first
    part's start to the last one's end."""
    log = tmp_path / "times.tsv"
    log.write_text("lint\t50.0\t90\t0\t1000.0\nwheel-check\t80.0\t90\t0\t1000.5\n"
                   "pytest\t400.0\t420\t0\t1081.0\n")
    assert summary(log)[1:] == ["  lint           0m50s of 1m30s",
                                "  wheel-check    1m20s of 1m30s",
                                "  pytest         6m40s of 7m00s",
                                "  all            8m01s of 10m00s"]


def test_the_makefiles_budgets_keep_to_twelve_minutes() -> None:
    """Every part ``make test`` times has a budget, and they add up to at most 12 minutes on
    a quiet 2-core machine."""
    makefile = (REPO / "Makefile").read_text()
    budgets = {k: int(v) for k, v in re.findall(r"^(BUDGET_\w+) := (\d+)$", makefile, re.M)}
    used = set(re.findall(r"\$\(TIMED\) [\w-]+ \$\((BUDGET_\w+)\)", makefile))
    assert used == set(budgets) and len(used) == 4, (used, budgets)
    assert sum(budgets.values()) <= 12 * 60, budgets
