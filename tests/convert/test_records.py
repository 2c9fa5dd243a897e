"""Task records (``imgprep.convert.records``): a finished task's record is trusted only for the
same plan (fingerprint, task number and name) and only while the files it names still verify
(sha256, or sizes alone when collecting other ranks' fresh work); anything else is redone."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from imgprep.convert.options import ConvertOptions
from imgprep.convert.records import load_done, write_record
from imgprep.convert.tasks import Plan, make_plan
from imgprep.fsutil import sha256_file


def plan_for(sample: Path, out: Path, fmt: str = "shards", **opts: object) -> Plan:
    return make_plan(ConvertOptions(input=sample / "ILSVRC2012_img_train.tar", out=out,
                                    format=fmt, **opts))


@pytest.fixture
def shards(converted: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the sample's train split as 3 shards, records included."""
    return Path(shutil.copytree(converted["shards"], tmp_path / "shards"))


@pytest.fixture
def label_list(converted: dict[str, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(converted["list"], tmp_path / "list"))


def test_every_record_of_the_same_plan_is_trusted(sample: Path, shards: Path) -> None:
    plan = plan_for(sample, shards, num_shards=3)
    assert len(plan.tasks) == 3
    for task in plan.tasks:
        res = load_done(plan, task)
        assert res is not None and res.resumed
        assert (res.index, res.name, res.fingerprint) == (task.index, task.name, plan.fingerprint)
        assert (res.bytes, res.sha256) == ((shards / task.name).stat().st_size,
                                           sha256_file(shards / task.name))
        assert res.samples == len(task.items)


@pytest.mark.parametrize("other", [{"num_shards": 3, "seed": 1}, {"num_shards": 4},
                                   {"num_shards": 3, "meta": False}])
def test_a_record_of_another_plan_is_not_trusted(sample: Path, shards: Path,
                                                 other: dict[str, object]) -> None:
    plan = plan_for(sample, shards, **other)
    assert plan.fingerprint != plan_for(sample, shards, num_shards=3).fingerprint
    assert [load_done(plan, t) for t in plan.tasks] == [None] * len(plan.tasks)


def test_a_record_under_another_tasks_name_is_not_trusted(sample: Path, shards: Path) -> None:
    plan = plan_for(sample, shards, num_shards=3)
    first, second = plan.tasks[:2]
    shutil.copy(plan.record_path(first), plan.record_path(second))
    assert load_done(plan, second) is None
    assert load_done(plan, first) is not None


def test_an_unreadable_record_is_not_trusted_and_a_rewritten_one_is(sample: Path,
                                                                    shards: Path) -> None:
    plan = plan_for(sample, shards, num_shards=3)
    task = plan.tasks[1]
    res = load_done(plan, task)
    assert res is not None
    for junk in ("", "{", "[1, 2]", json.dumps({"fingerprint": plan.fingerprint})):
        plan.record_path(task).write_text(junk)
        assert load_done(plan, task) is None, junk
    write_record(plan, replace(res, resumed=False))
    again = load_done(plan, task)
    assert again is not None and replace(again, resumed=False) == replace(res, resumed=False)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_shard_voids_its_record_alone(sample: Path, shards: Path) -> None:
    plan = plan_for(sample, shards, num_shards=3)
    damaged = plan.tasks[1]
    _flip(shards / damaged.name)
    assert [load_done(plan, t) is not None for t in plan.tasks] == [True, False, True]
    # sizes only (another rank's fresh work): the same size passes, a short file does not
    assert load_done(plan, damaged, checksum=False) is not None
    (shards / damaged.name).write_bytes((shards / damaged.name).read_bytes()[:-1])
    assert load_done(plan, damaged, checksum=False) is None
    (shards / damaged.name).unlink()
    assert load_done(plan, damaged, checksum=False) is None


def test_a_label_list_chunk_is_trusted_while_each_image_verifies(sample: Path,
                                                                 label_list: Path) -> None:
    plan = plan_for(sample, label_list, fmt="list")
    (task,) = plan.tasks  # 48 images: one chunk
    res = load_done(plan, task)
    assert res is not None and len(res.files) == 48
    rel = res.files[5][0]
    _flip(label_list / rel)
    assert load_done(plan, task) is None
    assert load_done(plan, task, checksum=False) is not None  # same size
    (label_list / rel).write_bytes(b"short")
    assert load_done(plan, task, checksum=False) is None
    (label_list / rel).unlink()
    assert load_done(plan, task, checksum=False) is None


def test_a_train_label_list_chunk_needs_its_mean_image(sample: Path, label_list: Path) -> None:
    plan = plan_for(sample, label_list, fmt="list")
    (task,) = plan.tasks
    assert plan.wants_mean_image and load_done(plan, task) is not None
    plan.mean_path(task).unlink()
    assert load_done(plan, task) is None
