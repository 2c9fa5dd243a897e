"""The full-size rehearsal at ImageNet-21k's shape (``--shape in21k``), run at its smallest size.

Its 19,167 class sizes have winter21's total and a heavy tail, and sum exactly at every size
with one image a class at least; its records are tabled against 13,153,500 images and
compared with an ILSVRC-shape record step by step. The slow case runs the whole script at
20,000 images (one a class, and enough train shards for the 4 partition nodes) and checks its
JSON record: every step ran and held, the one convert wrote both splits with the expected
counts and the class table of every wnid present, the rebuilt index is identical, the staged
nodes are byte-identical, the pad epoch saw every sample once, the work folder is gone, and
the cached input is one tar of sorted class tars.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.rehearsal import in21k
from harness.rehearsal.report import compare, compare_table, table
from imgprep import imagenet_classes
from tests.support import rehearse, steps_by_name

SMALL = in21k.MIN_IMAGES
STEPS = [in21k.CONVERT_STEP, "verify", "index", "stage fan-out 4 nodes",
         "stage partition 4 nodes", "loader plan 16x8 ranks", "loader epoch slice",
         "train tiny net"]


def test_full_counts_have_a_heavy_tail_and_winter21s_total() -> None:
    c = in21k.full_counts()
    assert len(c) == in21k.SYNSETS == 19_167 and c.sum() == in21k.FULL_IMAGES == 13_153_500
    assert c.min() == 1 and 1000 <= c.max() <= 1600
    assert 650 <= np.median(c) <= 750
    assert (c < 50).sum() > 1000  # many classes of a few dozen images
    assert (c >= 1000).sum() > 3000  # and a head of a thousand and more
    assert (in21k.class_counts(in21k.FULL_IMAGES) == c).all()
    assert in21k.held_out(c) == int(np.minimum(10, c // 2).sum())


def test_synsets_are_sorted_wnids_holding_ilsvrc2012s() -> None:
    w = in21k.synsets()
    assert len(w) == len(set(w)) == in21k.SYNSETS and w == sorted(w)
    assert set(imagenet_classes().wnids) <= set(w)
    assert all(len(x) == 9 and x[0] == "n" and x[1:].isdigit() for x in w)


@pytest.mark.parametrize("images", [SMALL, 100_000, 300_000, 5_000_000])
def test_scaled_counts_sum_exactly_and_keep_an_image_in_every_class(images: int) -> None:
    c = in21k.class_counts(images)
    assert c.sum() == images and len(c) == in21k.SYNSETS and c.min() >= 1
    full = in21k.full_counts()
    share = (full - 1) * (images - in21k.SYNSETS) / (in21k.FULL_IMAGES - in21k.SYNSETS)
    assert np.abs(c - 1 - share).max() < 1  # within one image of its share


def test_fewer_images_than_classes_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 20000"):
        in21k.class_counts(in21k.SYNSETS)


def _record(images: int, costs: dict[str, float], **extra: Any) -> dict[str, Any]:
    steps = [{"step": k, "images": images, "seconds": v * images / 1e6, "rate": 1e6 / v,
              "us_per_image": v, "cpu_us_per_image": v, "cores_busy": 1.0,
              "peak_rss_mb": 100.0, "peak_fds": 10, "disk_bytes": 0, "ok": True}
             for k, v in costs.items()]
    return {**extra, "images": images, "ok": True, "steps": steps}


def test_an_in21k_record_compares_with_an_ilsvrc_one_and_projects_to_1315m_images() -> None:
    ilsvrc = _record(100_000, {"convert train": 100.0, "convert val": 90.0, "index": 10.0})
    wide = _record(100_000, {in21k.CONVERT_STEP: 140.0, "index": 11.0}, shape="in21k")
    c = compare(wide, ilsvrc)
    assert [s["step"] for s in c["steps"]] == [in21k.CONVERT_STEP, "index"]
    assert c["steps"][0]["other_step"] == "convert train" and c["flagged"] == [in21k.CONVERT_STEP]
    text = compare_table(c)
    assert "100,000 images (in21k shape) (this run) against 100,000 images (ilsvrc shape)" in text
    assert f"| {in21k.CONVERT_STEP} / convert train | 140.0 | 100.0 | 1.40 |" in text
    assert [s["step"] for s in compare(ilsvrc, wide)["steps"]] == ["convert train", "index"]
    out = table(wide)
    assert "13,153,500 in the archive" in out
    # 140 µs an image over the whole archive, on this machine
    assert f"| {in21k.CONVERT_STEP} | {140e-6 * in21k.FULL_IMAGES:,.0f} |" in out


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("rehearsal-in21k")
    return rehearse(out, SMALL, "--shape", "in21k"), out


@pytest.mark.slow
def test_every_step_runs_and_the_one_convert_writes_both_splits(
        rehearsal: tuple[dict[str, Any], Path]) -> None:
    record, _ = rehearsal
    steps = steps_by_name(record)
    assert list(steps) == STEPS and record["ok"] and not record["timed_out"]
    assert record["shape"] == "in21k" and record["holdout_per_class"] == 10
    for s in record["steps"]:
        assert s["ok"] and s["seconds"] > 0 and s["peak_rss_mb"] > 0 and s["peak_fds"] > 0, s
    val = in21k.held_out(in21k.class_counts(SMALL))
    assert record["val"] == val > 0 and record["train"] == SMALL - val
    check = steps[in21k.CONVERT_STEP]["check"]
    assert check["samples"] == {"val": val, "train": SMALL - val} and check["complete"]
    assert check["classes"] == in21k.SYNSETS and check["same_classes"]
    assert check["holdout_images"] == {"val": val, "train": val}
    assert steps["verify"]["check"]["samples"] == SMALL
    assert steps["index"]["check"]["index_identical"]


@pytest.mark.slow
def test_staged_nodes_are_byte_identical_and_the_pad_epoch_sees_every_train_sample_once(
        rehearsal: tuple[dict[str, Any], Path]) -> None:
    record = rehearsal[0]
    steps = steps_by_name(record)
    for name in ("stage fan-out 4 nodes", "stage partition 4 nodes"):
        check = steps[name]["check"]
        assert check["identical"] and check["nodes"] == 4, check
    plan = steps["loader plan 16x8 ranks"]["check"]
    assert plan["every_sample_once"] and plan["samples"] == record["train"]
    epoch = steps["loader epoch slice"]["check"]
    assert epoch["whole_epoch"] and epoch["every_sample_once"] and epoch["labels_match_plan"]


@pytest.mark.slow
def test_work_is_removed_and_the_cached_input_is_one_tar_of_sorted_class_tars(
        rehearsal: tuple[dict[str, Any], Path]) -> None:
    record, out = rehearsal
    assert record["disk"]["work_left_bytes"] == 0 and not list(out.glob("work-*"))
    wnids, counts = in21k.synsets(), in21k.class_counts(SMALL)
    with tarfile.open(out / f"input-in21k-{SMALL}" / in21k.ARCHIVE) as outer:
        inner = outer.getmembers()
        assert [m.name for m in inner] == [f"{w}.tar" for w in wnids]
        for k in (0, int(np.argmax(counts)), len(wnids) - 1):
            f = outer.extractfile(inner[k])
            assert f is not None
            with tarfile.open(fileobj=f) as tf:
                assert tf.getnames() == [f"{wnids[k]}_{j + 1}.JPEG" for j in range(counts[k])]
