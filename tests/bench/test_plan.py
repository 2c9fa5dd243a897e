"""The plan-cost benchmark (``bench.plan``), run tiny: its table, its JSON line, and plans
of both order versions over the same shares."""

from __future__ import annotations

import json

import pytest

from bench.plan import SHARD, main, shard_counts


def test_shards_are_cut_as_convert_cuts_them() -> None:
    assert shard_counts(2 * SHARD + 5) == [SHARD, SHARD, 5]
    assert shard_counts(3 * SHARD) == [SHARD] * 3


def test_a_tiny_run_prints_each_case_and_one_json_line(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    assert main(["--totals", "40000,80000", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    res = json.loads(lines[-1])
    assert res["benchmark"] == "plan" and res["world"] == "16x8"
    rows = res["results"]
    assert {(r["total"], r["version"]) for r in rows} == {
        (t, v) for t in (40000, 80000) for v in (1, 2)}
    for r in rows:
        assert r["share"] == (r["total"] // (128 * 256)) * 256  # drop: full steps only
        assert r["ms"] > 0 and r["us_per_sample"] > 0 and r["peak_kb"] > 0
    assert res["verdict"] in ("PASS", "SHORT") and res["v2_ratio_largest_over_smallest"] > 0
    assert len(lines) == 1 + len(rows) + 2  # header, a row a case, the figure, the JSON


def test_sizes_below_one_step_are_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--totals", "1000,80000"])
