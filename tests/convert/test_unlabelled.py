"""The test split has no labels: a folder holding it beside train and val converts the two
and skips it with a note; ``--split test`` converts it as an unlabelled split, whose manifest
says so and whose shards (read back with plain ``tarfile``) and list hold no label at all."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from imgprep.shards.manifest import read_manifest
from tests.support import one_line_error
from tests.support.cli import invoke, jpeg_tree, ok

SMALL = ("--size", "16", "-j", "1", "-q", "--json")
WNIDS = ("n01440764", "n01443537")
TEST = [f"ILSVRC2012_test_{i:08d}" for i in (1, 2, 3)]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """train/ (two classes), val/ (two published validation images) and test/."""
    return jpeg_tree(tmp_path / "imagenet", {
        **{f"train/{w}/{w}_{i}.JPEG": 10 * k + i for k, w in enumerate(WNIDS) for i in (1, 2)},
        **{f"val/ILSVRC2012_val_{n:08d}.JPEG": n for n in (1, 2)},
        **{f"test/{k}.JPEG": 50 + i for i, k in enumerate(TEST)}})


def members(out: Path, split: str) -> dict[str, dict[str, bytes]]:
    """{key: {extension: bytes}} of every sample of the split's shards, read with tarfile."""
    found: dict[str, dict[str, bytes]] = {}
    for entry in read_manifest(out, split).shards:
        with tarfile.open(out / entry.name) as tf:
            for m in tf:
                f = tf.extractfile(m)
                assert f is not None
                key, _, ext = m.name.partition(".")
                found.setdefault(key, {})[ext] = f.read()
    return found


def test_a_root_skips_its_test_split_with_a_note(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = invoke("convert", root, "-o", out, *SMALL)
    s = ok(r)
    assert [p["split"] for p in s["splits"]] == ["train", "val"]
    assert [p["label_source"] for p in s["splits"]] == ["input", "published"]
    assert f"not converted: {root / 'test'}: images without labels; --split test converts them " \
        "as an unlabelled split" in r.stderr
    assert not (out / "test.json").exists() and not list(out.glob("test-*"))


@pytest.mark.parametrize("where", ["test", "named"])
def test_a_test_split_alone_is_refused_without_split_test(root: Path, tmp_path: Path,
                                                          where: str) -> None:
    """Named test/, or any folder of ILSVRC2012_test_* images: --split test, or nothing."""
    src = root / "test"
    if where == "named":
        src = src.rename(tmp_path / "downloads")
    one_line_error(invoke("convert", src, "-o", tmp_path / "out", *SMALL), 3, src,
                   "the ILSVRC2012 test split", "no labels", "--split test")
    assert not (tmp_path / "out").exists()


def test_a_root_of_the_test_split_alone_is_refused(tmp_path: Path) -> None:
    src = jpeg_tree(tmp_path / "imagenet", {f"test/{k}.JPEG": 1 for k in TEST})
    one_line_error(invoke("convert", src, "-o", tmp_path / "out", *SMALL), 3,
                   "holds only the test split", "--split test")


def test_split_test_converts_it_unlabelled(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    human = invoke("convert", root, "-o", out, "--split", "test", "-j", "1", "--size", "16")
    assert human.exit_code == 0, human.output
    assert "labels: none (the test split is converted unlabelled: no .cls" in human.stdout
    m = read_manifest(out, "test")
    assert (m.split, m.labelled, m.total_samples) == ("test", False, 3)
    assert json.loads((out / "test.json").read_text())["labelled"] is False
    found = members(out, "test")
    assert sorted(found) == TEST
    for fields in found.values():
        assert sorted(fields) == ["jpg", "json"]  # no .cls, so no label, -1 included
        meta = json.loads(fields["json"])
        assert "label" not in meta and "wnid" not in meta and meta["source"].endswith(".JPEG")
    s = ok(invoke("convert", root, "-o", out, "--split", "test", *SMALL))
    assert (s["label_source"], s["tasks_resumed"]) == ("none", s["tasks"])
    assert invoke("verify", out, "--split", "test").exit_code == 0
    assert invoke("preview", out, "--split", "test", "-o", tmp_path / "sheet.png",
                  "-q").exit_code == 0


def test_split_test_as_a_list_writes_paths_without_labels(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    s = ok(invoke("convert", root / "test", "-o", out, "--split", "test", "--format", "list",
                  *SMALL))
    assert s["samples"] == 3
    lines = (out / "test.txt").read_text().splitlines()
    assert lines == [f"test/{k}.jpg" for k in TEST]
    assert all((out / line).is_file() for line in lines)
    assert read_manifest(out, "test").labelled is False
    assert invoke("verify", out, "--split", "test").exit_code == 0


def test_label_options_with_split_test_are_refused(root: Path, tmp_path: Path) -> None:
    gt = tmp_path / "val.txt"
    gt.write_text("ILSVRC2012_test_00000001.JPEG 3\n")
    for extra in (["--labels", gt], ["--trust-labels"]):
        one_line_error(invoke("convert", root / "test", "-o", tmp_path / "out", "--split",
                              "test", *extra, *SMALL), 3, "--split test", f"drop {extra[0]}")


def test_the_dry_run_names_each_splits_label_source(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    rep = ok(invoke("convert", root, "-o", out, "--dry-run", "--json"))
    splits = {s["split"]: s for s in rep["splits"]}
    assert [splits[s]["label_source"] for s in ("train", "val")] == ["input", "published"]
    assert splits["val"]["labels"] == "the published ILSVRC2012 validation labels"
    assert any(k.startswith(f"{root / 'test'}: images without labels") for k in rep["skipped"])
    rep = ok(invoke("convert", root, "-o", out, "--split", "test", "--format", "list",
                    "--dry-run", "--json"))
    (test,) = rep["splits"]
    assert (test["split"], test["label_source"], test["images"]) == ("test", "none", 3)
    assert test["labels"].startswith("none") and "test/<key>.jpg" in test["writes"]
    assert not out.exists()
