"""The index benchmark's own logic: the synthetic set it indexes, kept and reused with
--keep, and the JSON line it ends with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.index import build_folder, main, reusable
from imgprep import read_manifest


def test_a_tiny_run_ends_with_its_figures_and_leaves_nothing_behind(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--shards", "3", "--samples", "20", "--repeat", "1", "--out",
                 str(tmp_path)]) == 0
    res = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (res["shards"], res["samples"], res["identical"]) == (3, 60, True)
    assert set(res["rates_samples_per_s"]) == {"index_1w", "index_2w"}
    assert res["index_2w_over_1w"] > 0 and res["verdict"] in ("PASS", "SHORT")
    assert list(tmp_path.iterdir()) == []


def test_keep_reuses_the_set_it_made(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--shards", "2", "--samples", "10", "--repeat", "1", "--dali", "--keep",
            "--out", str(tmp_path)]
    assert main(args) == 0
    folder = tmp_path / "index-2x10"
    made = (folder / "train-000000.tar").stat().st_mtime_ns
    assert main(args) == 0
    assert (folder / "train-000000.tar").stat().st_mtime_ns == made
    assert sorted(p.name for p in folder.glob("*.idx")) == ["train-000000.idx",
                                                           "train-000001.idx"]
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["dali"] is True


def test_a_set_of_another_size_or_with_a_shard_cut_is_not_reused(tmp_path: Path) -> None:
    build_folder(tmp_path / "s", 2, 5)
    assert read_manifest(tmp_path / "s", "train").total_samples == 10
    assert reusable(tmp_path / "s", 2, 5) and not reusable(tmp_path / "s", 2, 6)
    with open(tmp_path / "s" / "train-000001.tar", "r+b") as f:
        f.truncate(1024)
    assert not reusable(tmp_path / "s", 2, 5)
    assert not reusable(tmp_path / "none", 2, 5)
