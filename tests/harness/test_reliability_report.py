"""The reliability report (``python -m harness.reliability.report``): the tables and the JSON
line it prints, and its exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.reliability import Trial
from harness.reliability import report as reliability_report


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_reduced_run_prints_tables_and_json(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    rc = reliability_report.main(["--quick", "--only", "stage-changed", "--work",
                                  str(tmp_path), "--markdown"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "| part | fault | trials | survived |" in out
    assert "| stage-to-node | source shard changed after the manifest | 1 | 1 |" in out
    got = last_json(out)
    assert got["ok"] is True and got["quick"] is True and got["trials"] == 1
    assert got["faults"] == [{"part": "stage-to-node", "trials": 1, "survived": 1,
                              "fault": "source shard changed after the manifest"}]
    assert list(tmp_path.iterdir()) == []  # the scratch folder is removed


def test_a_failed_trial_fails_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    def broken(work: Path, trials: int, seed: int) -> list[Trial]:
        return [Trial("convert", "SIGKILL", k % 2 == 0, f"trial {k}") for k in range(trials)]

    monkeypatch.setitem(reliability_report.fault_kinds.FAULTS, "convert", broken)
    rc = reliability_report.main(["--only", "convert", "--trials", "3", "--work",
                                  str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "failed:\n  convert: SIGKILL: trial 1" in out
    assert last_json(out)["faults"] == [{"part": "convert", "fault": "SIGKILL", "trials": 3,
                                         "survived": 2}]


def test_unknown_part_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        reliability_report.main(["--only", "convert,teleport"])
    assert e.value.code == 2
    assert "unknown parts ['teleport']" in capsys.readouterr().err
