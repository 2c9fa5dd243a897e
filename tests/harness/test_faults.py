"""The fault harness (harness/reliability/faults.py) in its reduced form: one random kill point
per convert set-up (of 120 images, the set the other kinds stage, made once; not the two
tests/cli covers) and one trial per other fault kind. ``harness.reliability.report`` runs the
same functions with 20 trials each (convert: every set-up, of 1,200 images; the others stage
480). IMGPREP_FAULT_TRIALS raises the count here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.reliability import Trial, faults

TRIALS = int(os.environ.get("IMGPREP_FAULT_TRIALS", "1"))
SEED = 2026
SMALL = faults.REDUCED_PER_CLASS  # images per class converted here: the set the stage kinds use

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One scratch folder for the module: the sources are made once and shared."""
    root = tmp_path_factory.mktemp("faults")
    faults.shard_source(root / "set", per_class=SMALL)  # made first: the other kinds stage it
    return root


def assert_survived(trials: list[Trial], expected: int) -> None:
    assert len(trials) == expected, trials
    failed = [f"{t.kind}: {t.detail}" for t in trials if not t.ok]
    assert not failed, "\n".join(failed)


# A single process with 2 workers, killed and rerun, is tests/cli/test_cli.py's
# test_kill_then_rerun_gives_identical_output (both formats: no orphans, identical bytes);
# the single-process set-ups here are the 1-worker ones.
KILLED_HERE = [c for c in faults.CONVERT_CASES if c.workers == 1 or c.ranks > 1]


@pytest.mark.parametrize("case", KILLED_HERE, ids=lambda c: f"{c.fmt}-{c.workers}w-{c.ranks}r")
def test_convert_survives_sigkill(work: Path, case: faults.ConvertCase) -> None:
    trials = faults.convert_kills(work / "convert", TRIALS, SEED, [case], SMALL)
    assert_survived(trials, TRIALS)
    assert {t.kind for t in trials} == {case.kind}


@pytest.mark.parametrize("name", [n for n in faults.FAULTS if n != "convert"])
def test_fault(work: Path, name: str) -> None:
    trials = faults.run_faults(work, TRIALS, SEED, [name])
    if name == "stage-enospc" and trials and "cannot mount" in trials[0].detail:
        pytest.skip(trials[0].detail)
    assert_survived(trials, TRIALS)


def test_a_broken_guarantee_is_reported(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness can fail: a rerun that leaves output unlike the reference is caught."""
    real = faults.digests
    calls = {"n": 0}

    def skewed(root: Path, skip: tuple[str, ...] = (".imgprep", ".imgprep-stage")
               ) -> dict[str, str]:
        calls["n"] += 1
        got = real(root, skip)
        return got if calls["n"] == 1 else {**got, "extra": "0"}

    monkeypatch.setattr(faults, "digests", skewed)
    trials = faults.convert_kills(work / "convert", 1, SEED, faults.CONVERT_CASES[:1], SMALL)
    assert [t.ok for t in trials] == [False]
    assert "differs from the uninterrupted run" in trials[0].detail
