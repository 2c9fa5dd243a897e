"""Converting ImageNet as users downloaded it: each form from the path a user would give,
every label read back with plain ``tarfile`` equal to the published one, the Kaggle zip, its
extracted tree and the image-net.org tars giving the same samples, worker-count determinism
and resume after kill -9 for the zip, ``--dry-run`` writing nothing, and the refusals."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from imgprep.inputs.fakes import SampleSpec, make_fake
from imgprep.inputs.synsets import imagenet_classes
from imgprep.inputs.ziplist import _cached
from tests.cli.test_cli import kill_and_rerun, tree_bytes
from tests.support import jpeg, one_line_error, published_label
from tests.support.cli import invoke, ok

SPEC = SampleSpec(classes=4, per_class=3, val=8, test=3, seed=11)
ZIP = "imagenet-object-localization-challenge.zip"
CLASSES = imagenet_classes()
FAST = ("--size", "64", "-q", "--json", "--shards", "2")
Samples = dict[str, tuple[bytes, int]]


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The image-net.org tars, the Kaggle zip and the tree that zip extracts to."""
    root = tmp_path_factory.mktemp("forms")
    for form in ("ilsvrc", "kaggle-zip"):
        make_fake(form, root / form, SPEC)
    with zipfile.ZipFile(root / "kaggle-zip" / ZIP) as zf:
        zf.extractall(root / "kaggle")
    return {form: root / form for form in ("ilsvrc", "kaggle", "kaggle-zip")}


def inputs(fakes: dict[str, Path]) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """The path a user gives for each form, and the options it needs."""
    return {
        "ilsvrc": (fakes["ilsvrc"], ("--labels", str(fakes["ilsvrc"] / "LOC_val_solution.csv"))),
        "kaggle": (fakes["kaggle"], ()),
        "kaggle-cls-loc": (fakes["kaggle"] / "ILSVRC" / "Data" / "CLS-LOC", ()),
        "kaggle-zip": (fakes["kaggle-zip"] / ZIP, ()),
    }


def samples(out: Path, split: str) -> Samples:
    """{key: (jpg, label)} of every shard of ``split``, read with plain tarfile."""
    got: dict[str, dict[str, bytes]] = {}
    for shard in sorted(out.glob(f"{split}-*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf:
                f = tf.extractfile(m)
                assert f is not None
                key, _, ext = m.name.partition(".")
                got.setdefault(key, {})[ext] = f.read()
    return {k: (v["jpg"], int(v["cls"])) for k, v in got.items()}


def published(key: str) -> int:
    """The published label of a fake set's image, from its name alone."""
    if key.startswith("ILSVRC2012_val_"):
        return published_label(int(key.rsplit("_", 1)[1]))
    label = CLASSES.index(key.partition("_")[0])
    assert label is not None
    return label


@pytest.fixture(scope="module")
def converted(fakes: dict[str, Path],
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each form converted once (2 workers): its summary and its samples per split."""
    out = {}
    for name, (path, extra) in inputs(fakes).items():
        dest = tmp_path_factory.mktemp(f"out-{name}")
        s = ok(invoke("convert", path, "-o", dest, "-j", "2", *FAST, *extra))
        out[name] = {"summary": s, "out": dest,
                     "train": samples(dest, "train"), "val": samples(dest, "val")}
    return out


@pytest.mark.parametrize("name", ["ilsvrc", "kaggle", "kaggle-cls-loc", "kaggle-zip"])
def test_each_form_converts_with_every_label_the_published_one(
        converted: dict[str, dict[str, Any]], name: str) -> None:
    run = converted[name]
    assert [s["split"] for s in run["summary"]["splits"]] == ["train", "val"]
    assert all(s["complete"] and s["errors"] == 0 for s in run["summary"]["splits"])
    assert len(run["train"]) == SPEC.classes * SPEC.per_class and len(run["val"]) == SPEC.val
    for split in ("train", "val"):
        assert {k: c for k, (_, c) in run[split].items()} == \
            {k: published(k) for k in run[split]}, (name, split)
    assert not (run["out"] / "test.json").exists()


def test_zip_tree_and_tars_give_identical_samples_per_key(
        converted: dict[str, dict[str, Any]]) -> None:
    for split in ("train", "val"):
        reference = converted["ilsvrc"][split]
        for name in ("kaggle", "kaggle-cls-loc", "kaggle-zip"):
            assert converted[name][split] == reference, (name, split)


def test_the_kaggle_forms_say_what_they_skip(fakes: dict[str, Path], tmp_path: Path) -> None:
    r = invoke("convert", fakes["kaggle-zip"] / ZIP, "-o", tmp_path / "o", "-j", "1", *FAST)
    ok(r)
    lines = [ln for ln in r.stderr.splitlines() if "not converted" in ln]
    assert lines == [
        "imgprep: warning: not converted: ILSVRC/Data/CLS-LOC/test: 3 images without labels; "
        "--split test converts them as an unlabelled split",
        "imgprep: warning: not converted: ILSVRC/Annotations: 14 files: bounding boxes (XML), "
        "not images",
        "imgprep: warning: not converted: ILSVRC/ImageSets: 3 files: image lists, not images",
        "imgprep: warning: not converted: LOC_train_solution.csv, LOC_sample_submission.csv: "
        "bounding boxes and a sample submission, not labels"]


def test_the_zip_gives_the_same_bytes_for_one_and_two_workers(
        fakes: dict[str, Path], converted: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    ok(invoke("convert", fakes["kaggle-zip"] / ZIP, "-o", tmp_path / "w1", "-j", 1, *FAST))
    assert tree_bytes(tmp_path / "w1") == tree_bytes(converted["kaggle-zip"]["out"])  # -j 2


def test_one_split_of_the_zip_with_split_option(fakes: dict[str, Path], tmp_path: Path) -> None:
    s = ok(invoke("convert", fakes["kaggle-zip"] / ZIP, "-o", tmp_path, "--split", "val",
                  "-j", "1", *FAST))
    assert s["split"] == "val" and s["samples"] == SPEC.val and s["input_kind"] == "zip"
    assert s["label_check"] == "canonical"
    assert not (tmp_path / "train.json").exists()


def test_make_sample_writes_each_form_and_names_the_command(tmp_path: Path) -> None:
    s = ok(invoke("make-sample", tmp_path / "k", "--form", "kaggle-zip", "--classes", "2",
                  "--per-class", "2", "--val", "2", "--test", "1", "--json"))
    assert s["inputs"] == [str(tmp_path / "k" / ZIP)] and s["test_images"] == 1
    assert set(s) == {"form", "out", "classes", "train_images", "val_images", "test_images",
                      "quirks", "bad", "inputs"}  # no archives named: the image-net.org form's
    human = invoke("make-sample", tmp_path / "t", "--form", "kaggle", "--classes", "2",
                   "--per-class", "2", "--val", "2")
    assert human.exit_code == 0 and f"imgprep convert {tmp_path / 't'} -o OUT" in human.stdout
    r = invoke("make-sample", tmp_path / "x", "--form", "nope")
    assert r.exit_code == 2 and "not one of kaggle-zip, kaggle, hf-parquet" in r.output


def test_a_named_form_that_does_not_fit_is_refused(fakes: dict[str, Path],
                                                   tmp_path: Path) -> None:
    r = invoke("convert", fakes["kaggle-zip"] / ZIP, "-o", tmp_path / "out", "--form", "kaggle")
    one_line_error(r, 3, ZIP, "is not in the kaggle form")
    s = ok(invoke("convert", fakes["kaggle-zip"] / ZIP, "-o", tmp_path / "out", "--form",
                  "kaggle-zip", "--dry-run", "--json"))
    assert s["form"] == "kaggle-zip"


# ---------------------------------------------------------------------------- dry run


@pytest.mark.parametrize("name", ["ilsvrc", "kaggle", "kaggle-cls-loc", "kaggle-zip"])
def test_dry_run_reports_the_form_and_writes_nothing(fakes: dict[str, Path], tmp_path: Path,
                                                     name: str) -> None:
    path, extra = inputs(fakes)[name]
    before = tree_bytes(path if path.is_dir() else path.parent)
    out = tmp_path / "out"
    rep = ok(invoke("convert", path, "-o", out, "--dry-run", "--json", "--shards", "2", *extra))
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert tree_bytes(path if path.is_dir() else path.parent) == before
    assert rep["dry_run"] and rep["form"] == {"kaggle-cls-loc": "kaggle"}.get(name, name)
    splits = {s["split"]: s for s in rep["splits"]}
    assert list(splits) == ["train", "val"]
    assert splits["train"]["images"] == 12 and splits["val"]["images"] == 8
    assert splits["train"]["tasks"] == 2 and splits["val"]["label_check"] == "canonical"
    assert splits["train"]["writes"].startswith("2 shards train-000000.tar … train-000001.tar")
    assert splits["val"]["output"] == "new" and splits["val"]["spool_bytes"] == 0
    if name != "ilsvrc":
        assert "LOC_val_solution.csv" in splits["val"]["labels"]
        assert any(s.endswith("test: 3 images without labels; --split test converts them as "
                              "an unlabelled split") for s in rep["skipped"])
    human = invoke("convert", path, "-o", out, "--dry-run", *extra)
    assert human.exit_code == 0 and human.stdout.rstrip().endswith("dry run: nothing was written")
    assert not out.exists()


def test_dry_run_says_when_a_finished_split_would_be_reported_complete(
        converted: dict[str, dict[str, Any]], fakes: dict[str, Path]) -> None:
    out = converted["kaggle-zip"]["out"]
    before = tree_bytes(out)
    rep = ok(invoke("convert", fakes["kaggle-zip"] / ZIP, "-o", out, "--dry-run", "--json",
                    *FAST))
    assert [s["output"] for s in rep["splits"]] == [
        f"{out} holds this {s} conversion already: reported complete" for s in ("train", "val")]
    assert tree_bytes(out) == before


def test_dry_run_refuses_what_the_run_refuses(fakes: dict[str, Path], tmp_path: Path) -> None:
    tree = tmp_path / "kaggle"
    shutil.copytree(fakes["kaggle"], tree)
    csv = tree / "LOC_val_solution.csv"
    lines = csv.read_text().splitlines()
    key, _, rest = lines[1].partition(",")
    other = next(w for w in CLASSES.wnids if w != rest.split()[0])
    csv.write_text("\n".join([lines[0], f"{key},{other} 1 2 3 4", *lines[2:]]) + "\n")
    for extra in (("--dry-run",), ()):
        r = invoke("convert", tree, "-o", tmp_path / "out", *extra)
        assert r.exit_code == 3, r.output
        *warnings, error = r.stderr.strip().splitlines()
        assert all(w.startswith("imgprep: warning: not converted: ") for w in warnings)
        assert error.startswith("imgprep: error: ")
        for name in ("LOC_val_solution.csv", "1 of 8 ILSVRC2012_val_* names", key,
                     "--trust-labels"):
            assert name in error
    assert not (tmp_path / "out").exists()


def test_a_label_refusal_names_every_differing_line_in_text_and_json(
        fakes: dict[str, Path], tmp_path: Path) -> None:
    tree = tmp_path / "kaggle"
    shutil.copytree(fakes["kaggle"], tree)
    csv = tree / "LOC_val_solution.csv"
    header, *rows = csv.read_text().splitlines()
    changed = []
    for i in range(5):  # five of the eight lines get another class
        key, _, rest = rows[i].partition(",")
        other = next(w for w in CLASSES.wnids if w != rest.split()[0])
        rows[i] = f"{key},{other} 1 2 3 4"
        changed.append(f"{csv}:{i + 2}: {key} is {other}")
    csv.write_text("\n".join([header, *rows]) + "\n")
    for extra in (("--dry-run",), ("--dry-run", "--json"), (), ("--json",)):
        r = invoke("convert", tree, "-o", tmp_path / "out", *extra)
        assert r.exit_code == 3 and r.stdout == "", r.output
        *warnings, error = r.stderr.strip().splitlines()  # what is not converted, then why
        assert all(w.startswith("imgprep: warning: not converted: ") for w in warnings)
        assert error.startswith("imgprep: error: ") and "more" not in error
        for name in ("5 of 8 ILSVRC2012_val_* names", *changed):
            assert name in error, (name, error)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------- refusals


def test_a_truncated_zip_is_refused_in_one_line(fakes: dict[str, Path], tmp_path: Path) -> None:
    cut = tmp_path / ZIP
    data = (fakes["kaggle-zip"] / ZIP).read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    _cached.cache_clear()
    for extra in (("--dry-run",), ()):
        r = invoke("convert", cut, "-o", tmp_path / "out", *extra)
        line = one_line_error(r, 3, cut, "the download stopped early", "zip -FF")
        assert "check the download" not in line
    assert not (tmp_path / "out").exists()


def test_a_zstd_tar_is_refused_with_the_command_that_reads_it(tmp_path: Path) -> None:
    src = tmp_path / "ILSVRC2012_img_train.tar.zst"
    src.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(100))
    r = invoke("convert", src, "-o", tmp_path / "out")
    one_line_error(r, 3, src, "zstd-compressed", f"zstd -d {src} -o {tmp_path}/"
                   "ILSVRC2012_img_train.tar")


def _hostile_zip(fakes: dict[str, Path], path: Path) -> Path:
    """The fake Kaggle zip plus a symlink image and an absolute name under train/, and one
    image whose stored bytes are damaged."""
    shutil.copy(fakes["kaggle-zip"] / ZIP, path)
    with zipfile.ZipFile(path, "a") as zf:
        link = zipfile.ZipInfo("ILSVRC/Data/CLS-LOC/train/n01440764/n01440764_1.JPEG")
        link.create_system, link.external_attr = 3, 0o120777 << 16
        zf.writestr(link, "/etc/passwd")
        zf.writestr("/ILSVRC/Data/CLS-LOC/train/n01440764/n01440764_2.JPEG", b"x")
        zf.writestr(zipfile.ZipInfo("ILSVRC/Data/CLS-LOC/train/n01440764/n01440764_3.JPEG"),
                    b"\xff\xd8" + bytes(500), compress_type=zipfile.ZIP_STORED)
    raw = bytearray(path.read_bytes())
    at = raw.rfind(b"\xff\xd8" + bytes(500)) + 100
    raw[at] = 1
    path.write_bytes(bytes(raw))
    _cached.cache_clear()
    return path


def test_hostile_and_damaged_zip_members_are_logged_by_name(fakes: dict[str, Path],
                                                            tmp_path: Path) -> None:
    src = _hostile_zip(fakes, tmp_path / ZIP)
    out = tmp_path / "out"
    r = invoke("convert", src, "-o", out, "--split", "train", "-j", "1", *FAST)
    assert r.exit_code == 1, r.output
    log = [json.loads(ln) for ln in (out / "train-errors.jsonl").read_text().splitlines()]
    by_source = {e["source"]: e["reason"] for e in log}
    base = f"{src}/ILSVRC/Data/CLS-LOC/train/n01440764"
    assert "is a symlink; refused" in by_source[f"{base}/n01440764_1.JPEG"]
    assert "CRC-32 mismatch" in by_source[f"{base}/n01440764_3.JPEG"]
    assert any("absolute name" in r for r in by_source.values())
    assert not (out / "train.json").exists()
    s = ok(invoke("convert", src, "-o", out, "--split", "train", "-j", "1", "--max-errors", "3",
                  *FAST))
    assert s["samples"] == SPEC.classes * SPEC.per_class and s["errors"] == 3


def test_the_command_that_moves_val_images_out_of_train_leaves_other_files(
        tmp_path: Path) -> None:
    """Validation images in a train tree beside files named like them (Kaggle's XML boxes):
    the move command the refusal gives moves the images only."""
    root = tmp_path / "train"
    w = CLASSES.wnids[0]
    files = {f"{w}/{w}_1.JPEG": jpeg((30, 30)), f"{w}/ILSVRC2012_val_00000003.JPEG": jpeg((30, 30)),
             f"{w}/ILSVRC2012_val_00000003.xml": b"<annotation/>"}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    r = invoke("convert", root, "-o", tmp_path / "out", "-q")
    move = re.search(r"\(cd .+?\\;\)", one_line_error(r, 3, "1 validation images"))
    assert move is not None
    subprocess.run(["sh", "-c", move.group(0)], cwd=tmp_path, check=True, timeout=60)
    assert sorted(p.name for p in root.rglob("*") if p.is_file()) == [
        "ILSVRC2012_val_00000003.xml", f"{w}_1.JPEG"]
    assert [p.name for p in (tmp_path / "train-val-images").rglob("*.JPEG")] == [
        "ILSVRC2012_val_00000003.JPEG"]


# ---------------------------------------------------------------------------- kill -9


def _pooled_zip(path: Path, classes: int, per_class: int) -> Path:
    """Kaggle's zip of ``classes`` x ``per_class`` train images cycled from a few small
    JPEGs, every third stored and the rest deflated (as the real zip holds them)."""
    pool = [jpeg((96, 72), seed=i) for i in range(8)]
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w") as zf:
        for c, wnid in enumerate(CLASSES.wnids[::100][:classes]):
            for j in range(per_class):
                zf.writestr(f"ILSVRC/Data/CLS-LOC/train/{wnid}/{wnid}_{j}.JPEG",
                            pool[(c * 3 + j) % len(pool)], compress_type=(
                                zipfile.ZIP_STORED if j % 3 == 2 else zipfile.ZIP_DEFLATED))
    return path


@pytest.mark.slow
def test_a_killed_zip_conversion_resumes_to_the_same_bytes(tmp_path: Path) -> None:
    """Killed once its first task is recorded, the same command finishes to the bytes of a
    run never killed."""
    src = _pooled_zip(tmp_path / "src" / ZIP, classes=10, per_class=30)
    args = ("-j", "2", "-q", "--json", "--shard-size", "10", "--size", "32")
    ok(invoke("convert", src, "-o", tmp_path / "ref", *args))
    out = tmp_path / "out"
    kill, s = kill_and_rerun(("convert", src, "-o", out, *args), out, tmp_path / "ref")
    assert s["complete"] and s["tasks"] == 30, kill
    assert s["tasks_resumed"] >= kill.records_before and s["tasks_resumed"] > 0, kill
