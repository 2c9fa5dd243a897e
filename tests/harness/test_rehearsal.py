"""The full-size rehearsal (``python -m harness.rehearsal.run``), run at its smallest size.

The per-class counts have the real set's shape and sum exactly at every size; the 1.3x rule
of ``--compare`` flags a step whose per-image cost grows with the image count. The slow case
runs the whole script at 5,000 images (the fewest that give every one of the 4 partition
nodes a train shard) and checks its JSON record: every step ran and held, the counts are
exact, the rebuilt index is identical, the staged nodes are byte-identical to the source, the
pad epoch saw every sample once, the work folder is gone, and the cached input it leaves is
ILSVRC2012's layout.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.rehearsal.dataset import (
    FULL_TRAIN,
    FULL_VAL,
    GROUND_TRUTH,
    TRAIN_TAR,
    VAL_FLOOR,
    VAL_TAR,
    class_counts,
    full_counts,
    val_count,
)
from harness.rehearsal.report import compare
from imgprep import imagenet_classes
from tests.support import rehearse, steps_by_name

SMALL = 5000
STEPS = ["convert train", "convert val", "verify", "index", "stage fan-out 4 nodes",
         "stage partition 4 nodes", "loader plan 16x8 ranks", "loader epoch slice",
         "train tiny net"]


def test_full_counts_have_the_real_sets_shape() -> None:
    c = full_counts()
    assert len(c) == 1000 and c.sum() == FULL_TRAIN == 1_281_167
    assert c.min() == 732 and c.max() == 1300
    assert (c == 1300).sum() == 896  # most classes full, as in ILSVRC2012
    assert (class_counts(FULL_TRAIN) == c).all()
    assert val_count(FULL_TRAIN) == FULL_VAL


@pytest.mark.parametrize("images", [SMALL, 20_000, 100_000, 1_000_000])
def test_scaled_counts_sum_exactly_and_keep_every_class(images: int) -> None:
    c = class_counts(images)
    assert c.sum() == images and len(c) == 1000 and c.min() >= 1
    assert np.abs(c - full_counts() * images / FULL_TRAIN).max() < 1  # within one image
    assert VAL_FLOOR <= val_count(images) <= FULL_VAL


def _record(images: int, costs: dict[str, float]) -> dict[str, Any]:
    steps = [{"step": k, "images": images, "seconds": v * images / 1e6, "rate": 1e6 / v,
              "us_per_image": v, "cpu_us_per_image": v, "cores_busy": 1.0,
              "peak_rss_mb": 100.0, "peak_fds": 10, "disk_bytes": 0, "ok": True}
             for k, v in costs.items()]
    return {"images": images, "ok": True, "steps": steps}


def test_compare_flags_a_step_costing_more_than_13x_per_image_at_the_larger_size() -> None:
    small = _record(100_000, {"convert train": 100.0, "index": 10.0, "verify": 50.0})
    full = _record(FULL_TRAIN, {"convert train": 125.0, "index": 14.0, "verify": 40.0})
    assert compare(full, small)["flagged"] == ["index"]
    assert compare(small, full)["flagged"] == ["index"]  # either way round
    assert compare(full, small)["cpu_flagged"] == ["index"]


def test_a_saved_record_is_tabled_and_compared_without_running_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.rehearsal import run

    (tmp_path / "full.json").write_text(json.dumps(
        _record(FULL_TRAIN, {"convert train": 125.0, "index": 14.0})))
    (tmp_path / "small.json").write_text(json.dumps(
        _record(100_000, {"convert train": 100.0, "index": 10.0})))
    assert run.main(["--record", str(tmp_path / "full.json"), "--compare",
                     str(tmp_path / "small.json"), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "| convert train | 1,281,167 |" in out
    assert "| index | 14.0 | 10.0 | 1.40 | 1.40 | wall > 1.3x CPU > 1.3x |" in out
    assert json.loads(out.splitlines()[-1])["compare"]["flagged"] == ["index"]
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("rehearsal")
    return rehearse(out, SMALL), out


@pytest.mark.slow
def test_every_step_runs_and_every_check_holds(rehearsal: tuple[dict[str, Any], Path]) -> None:
    record, _ = rehearsal
    steps = steps_by_name(record)
    assert list(steps) == STEPS and record["ok"] and not record["timed_out"]
    for s in record["steps"]:
        assert s["ok"] and s["seconds"] > 0 and s["peak_rss_mb"] > 0 and s["peak_fds"] > 0, s
    val = val_count(SMALL)
    assert steps["convert train"]["check"]["samples"] == SMALL
    assert steps["convert val"]["check"]["samples"] == val
    assert steps["verify"]["check"]["samples"] == SMALL + val
    assert steps["index"]["check"]["index_identical"]


@pytest.mark.slow
def test_staged_nodes_are_byte_identical_and_the_pad_epoch_sees_every_sample_once(
        rehearsal: tuple[dict[str, Any], Path]) -> None:
    steps = steps_by_name(rehearsal[0])
    for name in ("stage fan-out 4 nodes", "stage partition 4 nodes"):
        check = steps[name]["check"]
        assert check["identical"] and check["nodes"] == 4, check
        assert check["roles"] == ["copier"] * 4
    plan = steps["loader plan 16x8 ranks"]["check"]
    assert plan["every_sample_once"] and plan["ranks"] == 128 and plan["samples"] == SMALL
    epoch = steps["loader epoch slice"]["check"]
    assert epoch["whole_epoch"] and epoch["every_sample_once"] and epoch["labels_match_plan"]
    assert epoch["samples"] == SMALL


@pytest.mark.slow
def test_work_is_removed_and_the_cached_input_is_ilsvrc2012s_layout(
        rehearsal: tuple[dict[str, Any], Path]) -> None:
    record, out = rehearsal
    assert record["disk"]["work_left_bytes"] == 0 and record["disk"]["work_peak_bytes"] > 0
    assert not list(out.glob("work-*"))
    inp = out / f"input-{SMALL}"
    table, counts = imagenet_classes(), class_counts(SMALL)
    with tarfile.open(inp / TRAIN_TAR) as outer:
        inner = outer.getmembers()
        assert [m.name for m in inner] == [f"{w}.tar" for w in table.wnids]
        for k in (0, 10, 999):
            f = outer.extractfile(inner[k])
            assert f is not None
            with tarfile.open(fileobj=f) as tf:
                names = tf.getnames()
            assert names == [f"{table.wnids[k]}_{j + 1}.JPEG" for j in range(counts[k])]
    with tarfile.open(inp / VAL_TAR) as tf:
        names = tf.getnames()
    val = val_count(SMALL)
    assert names == [f"ILSVRC2012_val_{n:08d}.JPEG" for n in range(1, val + 1)]
    assert len((inp / GROUND_TRUTH).read_text().splitlines()) == val
