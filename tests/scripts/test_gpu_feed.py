"""The kit's feed checks (``harness.gpukit.feed``), in their quick CPU form as users run them
(``scripts/gpu_check.py --only feed``): the profile beside the loader's load, then the
trainer fed as before, pinned, and by the hardware-decode backend, each over the synthetic
ceiling; on a GPU they are the study of the training step's feed (docs/gpu_check.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.checks import clean_env
from harness.gpukit.feed import FEDS, cpus_of
from harness.gpukit.run import ASKED_FOR, CHECKS, parse_args
from tests.support import REPO

KIT = REPO / "scripts" / "gpu_check.py"
TIMEOUT_S = 600  # the quick CPU form: 5 trainer runs, about a minute on the shared machine


def start_record(log: Path, key: str) -> dict[str, Any]:
    """The trainer's ``{key: ...}`` record of one run (``loader``, ``cpus``)."""
    return next(r[key] for r in map(json.loads, log.read_text().splitlines()) if key in r)


def leftovers(marker: str) -> list[int]:
    """Processes whose command line names ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(pid))
    return found


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_the_feed_check_profiles_then_feeds_the_trainer_four_ways(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    done = subprocess.run([sys.executable, str(KIT), "--device", "cpu", "--quick", "--only",
                           "feed", "--out", str(out), "--work", str(work)],
                          capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO,
                          env=clean_env(PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((out / "gpu_check.json").read_text())
    assert set(record["checks"]) == {"feed"} and not record["failed"]
    feed = record["checks"]["feed"]
    measures = [r["measure"] for r in feed["rows"]]
    assert sum(m.startswith("profile:") for m in measures) == 3
    n = len(os.sched_getaffinity(0))
    for key, (what, _) in FEDS.items():
        assert f"{n} CPUs, {what}: fed / synthetic" in measures
        assert feed["runs"][key]["intervals"] >= 1
    assert feed["runs"]["synthetic_beside_loader"]["images_per_s"] > 0
    logs = {k: work / f"train-feed-{k}-{n}cpus.jsonl" for k in FEDS}
    pinned = {k: start_record(log, "cpus") for k, log in logs.items()}
    assert [pinned[k]["pin_cpus"] for k in "abcd"] == [False, True, False, True]  # auto: CUDA
    assert [pinned[k]["worker_nice"] for k in "abcd"] == [0, 10, 0, 10]
    assert [pinned[k]["sizing"] for k in "abcd"] == [False, False, False, True]
    assert start_record(logs["c"], "loader")["backend"] == "nvimgcodec"
    assert not leftovers(str(work))  # the burn and its workers ended with their run


def test_the_feed_checks_run_only_when_named() -> None:
    assert set(ASKED_FOR) <= set(CHECKS)
    assert not set(ASKED_FOR) & set(parse_args([]).only)
    assert parse_args(["--only", "feed_half,feed"]).only == ["feed", "feed_half"]


def test_half_the_cpus_are_the_first_half() -> None:
    mine = sorted(os.sched_getaffinity(0))
    assert cpus_of(False) == mine and cpus_of(True) == mine[:max(1, len(mine) // 2)]
