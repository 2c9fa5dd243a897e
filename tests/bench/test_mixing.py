"""The batch-level augmentation benchmark (``bench.mixing``), run tiny: every case measured
against the plain normalisation, its table and its JSON line."""

from __future__ import annotations

import json

import pytest

from bench.mixing import CASES, main


def test_a_tiny_run_prints_each_case_and_one_json_line(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    assert main(["--batch", "2", "--rounds", "1", "--batches", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    res = json.loads(lines[-1])
    assert res["benchmark"] == "mixing" and res["size"] == 224 and res["threads"] == 1
    rows = res["results"]
    assert [r["case"] for r in rows] == list(CASES) and {r["batch"] for r in rows} == {2}
    assert rows[0]["ratio"] == 1.0 and all(r["ms"] > 0 and r["ratio"] > 0 for r in rows)
    assert len(lines) == 2 + len(rows) + 2  # title, header, a row a case, busy, the JSON


def test_nonsense_sizes_are_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--batch", "1"])
