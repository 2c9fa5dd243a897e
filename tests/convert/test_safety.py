"""Safe on real dataset layouts: splits are never merged, a finished split is never replaced
silently, ground truth that is wrong in a plausible way is refused, unknown classes are bad
images, a failed run leaves nothing new behind, and the manifest's node section is typed.

Hostile-input style: every refusal is one ``imgprep: error:`` line naming the file and the
fix; nothing is lost or overwritten; nothing is written outside ``--out``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from imgprep.convert.options import ConvertOptions
from imgprep.convert.run import convert
from imgprep.convert.tasks import make_plan
from imgprep.errors import LabelError, ManifestError, SourceFormatError
from imgprep.inputs.groundtruth import load_ground_truth
from imgprep.inputs.splitnames import split_of_name
from imgprep.inputs.synsets import imagenet_classes, imagenet_val_labels, parse_class_table
from imgprep.job.world import World
from imgprep.shards.manifest import NodeSection, read_manifest
from imgprep.stage.options import StageOptions
from imgprep.stage.run import stage_to_node
from tests.support import REPO, one_line_error, published_label, published_val_txt
from tests.support.cli import invoke, jpeg_tree, ok, snapshot

WNIDS = ("n01440764", "n01443537", "n01484850")
CLASSES = imagenet_classes()
# The first two published validation images of each class of WNIDS.
VAL_OF = {w: [int(n) + 1 for n in np.flatnonzero(imagenet_val_labels() == CLASSES.index(w))[:2]]
          for w in WNIDS}





def outside(before: dict[str, bytes], after: dict[str, bytes], out: str) -> list[str]:
    """Paths that changed outside the folder ``out`` (relative names)."""
    keys = set(before) | set(after)
    return sorted(k for k in keys if not k.startswith(out + "/") and before.get(k) != after.get(k))



def train_files(prefix: str = "", n: int = 3) -> dict[str, int]:
    return {f"{prefix}{w}/{w}_{i}.JPEG": 10 * k + i for k, w in enumerate(WNIDS)
            for i in range(n)}


def val_tree_files(prefix: str, names: str = "ILSVRC2012_val_{:08d}") -> dict[str, int]:
    """A val split laid out as a class tree (as valprep.sh leaves it): two images a class,
    validation names those of two of its published validation images."""
    published = names.startswith("ILSVRC2012_val_")
    return {f"{prefix}{w}/{names.format(n)}.JPEG": 100 + 10 * k + i
            for k, w in enumerate(WNIDS)
            for i, n in enumerate(VAL_OF[w] if published else (k * 2 + 1, k * 2 + 2))}


def keys_of(out: Path, split: str) -> dict[str, str]:
    """{key: class index} of every sample in the split's shards."""
    found = {}
    for entry in read_manifest(out, split).shards:
        with tarfile.open(out / entry.name) as tf:
            for m in tf:
                if m.name.endswith(".cls"):
                    f = tf.extractfile(m)
                    assert f is not None
                    found[m.name[:-4]] = f.read().decode()
    return found


SMALL = ("--size", "16", "-j", "1", "-q", "--json")


# ---------------------------------------------------------------------------- 1. never merge


@pytest.mark.parametrize("val_name", ["val", "validation", "Validation", "VAL",
                                      "ILSVRC2012_img_val"])
def test_a_root_with_train_and_val_converts_each_into_its_own_manifest(
        tmp_path: Path, val_name: str) -> None:
    root = jpeg_tree(tmp_path / "imagenet",
                     {**train_files("train/"), **val_tree_files(f"{val_name}/")})
    before = snapshot(tmp_path)
    s = ok(invoke("convert", root, "-o", tmp_path / "out", *SMALL))
    assert s["complete"] and [p["split"] for p in s["splits"]] == ["train", "val"]
    train, val = keys_of(tmp_path / "out", "train"), keys_of(tmp_path / "out", "val")
    assert len(train) == 9 and not any(k.startswith("ILSVRC2012_val_") for k in train)
    assert len(val) == 6 and all(k.startswith("ILSVRC2012_val_") for k in val)
    assert {k: CLASSES.wnids[int(c)] for k, c in val.items()} == {
        Path(rel).stem: rel.split("/")[1] for rel in val_tree_files(f"{val_name}/")}
    assert outside(before, snapshot(tmp_path), "out") == []


@pytest.mark.parametrize(("name", "split"), [
    ("val", "val"), ("VAL", "val"), ("Validation", "val"), ("valid", "val"),
    ("ILSVRC2012_img_val", "val"), ("ILSVRC2012_img_val.tar", "val"), ("train", "train"),
    ("Training", "train"), ("ILSVRC2012_img_train.TAR", "train"), ("val2", None),
    ("images", None), ("n01440764", None)])
def test_split_names(name: str, split: str | None) -> None:
    assert split_of_name(name) == split


def test_a_val_folder_is_the_val_split_whatever_its_file_names(tmp_path: Path) -> None:
    """A class tree in a folder named validation/ (any case) is val, not train, also when
    its files are not named ILSVRC2012_val_*."""
    src = jpeg_tree(tmp_path / "Validation", val_tree_files("", names="img_{:03d}"))
    s = ok(invoke("convert", src, "-o", tmp_path / "out", *SMALL))
    assert s["split"] == "val" and s["samples"] == 6
    assert not (tmp_path / "out" / "train.json").exists()


def test_validation_images_never_enter_an_inferred_train_split(tmp_path: Path) -> None:
    """A class tree where val images were merged into the train folders is refused (naming
    the first one and --split); --split train puts them there on purpose."""
    files = {**train_files(), **val_tree_files("")}
    src = jpeg_tree(tmp_path / "merged", files)
    out = tmp_path / "out"
    first = min(Path(f).name for f in files if "ILSVRC2012_val_" in f)
    msg = one_line_error(invoke("convert", src, "-o", out, *SMALL), 3, src,
                         "6 validation images", first, "--split train")
    assert "--split val" in msg
    assert not out.exists()
    s = ok(invoke("convert", src, "-o", out, "--split", "train", *SMALL))
    assert s["split"] == "train" and s["samples"] == 15


def test_validation_images_in_a_train_folder_of_a_root_are_refused(tmp_path: Path) -> None:
    root = jpeg_tree(tmp_path / "imagenet", {**train_files("train/"), **val_tree_files("train/"),
                                        **val_tree_files("val/")})
    one_line_error(invoke("convert", root, "-o", tmp_path / "out", *SMALL), 3,
                   f"{root}/train", "6 validation images", "--split train")
    assert not (tmp_path / "out").exists()


def test_a_val_tree_never_replaces_the_train_split(tmp_path: Path) -> None:
    """Converting a val class tree (files not named ILSVRC2012_val_*) into the folder that
    holds train adds val.json and leaves every train file as it was."""
    out = tmp_path / "out"
    ok(invoke("convert", jpeg_tree(tmp_path / "train", train_files()), "-o", out, *SMALL))
    before = snapshot(out)
    val = jpeg_tree(tmp_path / "val", val_tree_files("", names="img_{:03d}"))
    s = ok(invoke("convert", val, "-o", out, *SMALL))
    assert s["split"] == "val"
    after = snapshot(out)
    assert {k: v for k, v in after.items() if k in before} == before
    assert len(keys_of(out, "train")) == 9 and len(keys_of(out, "val")) == 6


def test_two_folders_for_one_split_are_refused(tmp_path: Path) -> None:
    root = jpeg_tree(tmp_path / "imagenet",
                     {**val_tree_files("val/"), **val_tree_files("validation/")})
    one_line_error(invoke("convert", root, "-o", tmp_path / "out", *SMALL), 3, "val and validation")
    assert not (tmp_path / "out").exists()


def test_class_folders_beside_a_split_folder_are_refused(tmp_path: Path) -> None:
    """Train class folders at the root with a val/ beside them: refused, not half converted
    and not merged."""
    root = jpeg_tree(tmp_path / "imagenet", {**train_files(), **val_tree_files("val/")})
    one_line_error(invoke("convert", root, "-o", tmp_path / "out", *SMALL), 3, root,
                   f"class folders ({', '.join(WNIDS)})", "val", f"{root}/train")
    assert not (tmp_path / "out").exists()


def test_split_root_other_folders_are_named_and_split_option_picks_one(tmp_path: Path) -> None:
    root = jpeg_tree(tmp_path / "imagenet", {**train_files("train/"), **val_tree_files("val/"),
                                        "extras/x_1.JPEG": 7})
    r = invoke("convert", root, "-o", tmp_path / "out", "--split", "val", *SMALL)
    s = ok(r)
    assert s["split"] == "val" and not (tmp_path / "out" / "train.json").exists()
    assert "not converted" in r.stderr and str(root / "extras") in r.stderr


def test_the_library_refuses_a_root_naming_both_splits(tmp_path: Path) -> None:
    root = jpeg_tree(tmp_path / "imagenet", {**train_files("train/"), **val_tree_files("val/")})
    with pytest.raises(SourceFormatError, match=r"imagenet/train and .*imagenet/val"):
        convert(ConvertOptions(input=root, out=tmp_path / "out"))


# ---------------------------------------------------------------------------- 2. overwrite


def test_other_options_for_a_finished_split_are_refused_until_overwrite(tmp_path: Path) -> None:
    src = jpeg_tree(tmp_path / "train", train_files())
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    ok(invoke("convert", src, "-o", out, *SMALL))
    before = snapshot(tmp_path)
    one_line_error(invoke("convert", src, "-o", out, *SMALL, "--size", "24"), 3, out,
                   "train.json", "--size: 16 there, 24 now", "--overwrite")
    assert snapshot(tmp_path) == before  # nothing lost or changed
    again = ok(invoke("convert", src, "-o", out, *SMALL))  # the same command: complete
    assert again["tasks_resumed"] == again["tasks"]
    r = invoke("convert", src, "-o", out, "--size", "16", "-j", "1")
    assert r.exit_code == 0 and "already complete: nothing converted" in r.stdout
    r = invoke("convert", src, "-o", out, *SMALL, "--size", "24", "--overwrite")
    ok(r)
    assert "--overwrite: removed the finished train split" in r.stderr
    assert "holds no train split until this run finishes" in r.stderr
    ok(invoke("convert", src, "-o", fresh, *SMALL, "--size", "24"))
    assert snapshot(out) == snapshot(fresh)


def test_another_input_for_a_finished_split_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    ok(invoke("convert", jpeg_tree(tmp_path / "a" / "train", train_files()), "-o", out, *SMALL))
    before = snapshot(out)
    other = jpeg_tree(tmp_path / "b" / "train", train_files(n=2))
    one_line_error(invoke("convert", other, "-o", out, *SMALL), 3, "input:", "9 images",
                   "6 images", "--overwrite")
    assert snapshot(out) == before


@pytest.mark.parametrize(("first", "second"), [("shards", "list"), ("list", "shards")])
def test_another_format_is_refused_and_overwrite_leaves_none_of_the_old(
        tmp_path: Path, first: str, second: str) -> None:
    src = jpeg_tree(tmp_path / "train", train_files())
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    ok(invoke("convert", src, "-o", out, "--format", first, *SMALL))
    before = snapshot(out)
    one_line_error(invoke("convert", src, "-o", out, "--format", second, *SMALL), 3,
                   f"--format: the folder holds {first}, this run writes {second}")
    assert snapshot(out) == before
    ok(invoke("convert", src, "-o", out, "--format", second, "--overwrite", *SMALL))
    ok(invoke("convert", src, "-o", fresh, "--format", second, *SMALL))
    visible = {k for k in snapshot(out) if not k.startswith(".imgprep/")}
    assert visible == {k for k in snapshot(fresh) if not k.startswith(".imgprep/")}


def test_an_unfinished_other_format_leaves_nothing_beside_the_new_one(tmp_path: Path) -> None:
    """A list run that failed (no manifest) left images; a shards run removes them."""
    src = jpeg_tree(tmp_path / "train", train_files())
    (src / WNIDS[0] / f"{WNIDS[0]}_bad.JPEG").write_bytes(b"not a jpeg")
    out = tmp_path / "out"
    assert invoke("convert", src, "-o", out, "--format", "list", *SMALL).exit_code == 1
    assert list((out / "train").rglob("*.jpg"))
    ok(invoke("convert", src, "-o", out, "--max-errors", "1", *SMALL))
    assert not (out / "train").exists() and not (out / "classes.txt").exists()
    assert read_manifest(out, "train").format == "shards"


def test_a_run_never_touches_another_splits_files(tmp_path: Path) -> None:
    """Temporary files of a val run writing into the same folder right now stay."""
    out = tmp_path / "out"
    out.mkdir()
    planted = {".tmp-val-000000.tar": b"val in progress", ".tmp-val.json": b"{}",
               "val-000000.tar": b"a val shard"}
    for name, data in planted.items():
        (out / name).write_bytes(data)
    ok(invoke("convert", jpeg_tree(tmp_path / "train", train_files()), "-o", out, *SMALL))
    assert {n: (out / n).read_bytes() for n in planted} == planted


# ---------------------------------------------------------------------------- 3. labels


def _val_name(i: int, published: bool) -> str:
    """The file name of validation image ``i``: a published validation name, or another one
    (which the published labels do not cover)."""
    return f"ILSVRC2012_val_{i:08d}.JPEG" if published else f"photo_{i:08d}.JPEG"


def _val_flat(root: Path, n: int, published: bool = True) -> Path:
    return jpeg_tree(root, {_val_name(i, published): i for i in range(1, n + 1)})


@pytest.mark.parametrize("published", [True, False], ids=["published-names", "other-names"])
def test_a_one_based_label_file_is_refused_and_label_offset_shifts_it(tmp_path: Path,
                                                                      published: bool) -> None:
    """Published names: every label one above the published one names --label-offset 1.
    Other names: the label 1000 names the line, says 1-based and names --label-offset 1."""
    src = _val_flat(tmp_path / "val", 4, published)
    zero = {i: published_label(i) for i in range(1, 5)} if published else \
        {1: 0, 2: 999, 3: 5, 4: 1}
    (tmp_path / "zero.txt").write_text("".join(f"{_val_name(k, published)} {v}\n"
                                               for k, v in zero.items()))
    one = tmp_path / "one.txt"
    one.write_text("".join(f"{_val_name(k, published)} {v + 1}\n" for k, v in zero.items()))
    out = tmp_path / "out"
    why = (f"{one}: every ILSVRC2012_val_* name in it is labelled 1 above", "line 1",
           f"is {zero[1] + 1} in the file; published {zero[1]}", "counts classes from 1") \
        if published else (f"{one}:2", "class index 1000", "1-based")
    one_line_error(invoke("convert", src, "-o", out, "--labels", one, *SMALL), 3,
                   *why, "--label-offset 1")
    assert not out.exists()
    ok(invoke("convert", src, "-o", out, "--labels", one, "--label-offset", "1", *SMALL))
    ok(invoke("convert", src, "-o", tmp_path / "ref", "--labels", tmp_path / "zero.txt", *SMALL))
    assert keys_of(out, "val") == keys_of(tmp_path / "ref", "val")


# The shape rules judge names the published labels do not cover, and every name under
# --trust-labels (trust=True): both are tested.
SHAPE_CASES = pytest.mark.parametrize(("published", "trust"), [(False, False), (True, True)],
                                      ids=["other-names", "published-names-trusted"])


@SHAPE_CASES
def test_a_large_set_without_label_zero_is_refused_as_one_based(tmp_path: Path, published: bool,
                                                                 trust: bool) -> None:
    """No label reaches the class count, but 10 per class and never a 0: 1-based."""
    table = parse_class_table("n01440764 a\nn01443537 b\n", "classes.txt")
    gt = tmp_path / "gt.txt"
    gt.write_text("".join(f"{_val_name(i, published)} 1\n" for i in range(1, 21)))
    with pytest.raises(LabelError, match=rf"{gt}: no image has label 0.*--label-offset 1"):
        load_ground_truth([gt], table, trust=trust)
    gt.write_text("".join(f"{_val_name(i, published)} 1\n" for i in range(1, 20)))
    assert len(load_ground_truth([gt], table, trust=trust)) == 19  # too few to tell: accepted


@SHAPE_CASES
def test_labels_exactly_one_to_k_are_one_based_unless_label_offset_says(
        tmp_path: Path, published: bool, trust: bool) -> None:
    gt = tmp_path / "gt.txt"
    gt.write_text("".join(f"{_val_name(i, published)} {i}\n" for i in range(1, 11)))
    with pytest.raises(LabelError, match=rf"{gt}: its labels are exactly 1..10.*"
                                         "--label-offset 1.*--label-offset 0"):
        load_ground_truth([gt], CLASSES, trust=trust)
    as_is = load_ground_truth([gt], CLASSES, label_offset=0, trust=trust)
    shifted = load_ground_truth([gt], CLASSES, label_offset=1, trust=trust)
    key = [_val_name(i, published).removesuffix(".JPEG") for i in (1, 10)]
    assert [CLASSES.index(as_is[k]) for k in key] == [1, 10]
    assert [CLASSES.index(shifted[k]) for k in key] == [0, 9]
    gt.write_text("".join(f"{_val_name(i, published)} {i}\n" for i in range(1, 10)))
    assert len(load_ground_truth([gt], CLASSES, trust=trust)) == 9  # nine classes: too few


@pytest.mark.parametrize("sep", [",", ", ", " ,", " ", "\t"])
def test_name_label_with_or_without_a_space_after_the_comma(tmp_path: Path, sep: str) -> None:
    gt = tmp_path / "gt.txt"
    gt.write_text(published_val_txt((1, 2), sep=sep))
    assert load_ground_truth([gt], CLASSES) == {
        f"ILSVRC2012_val_{i:08d}": CLASSES.wnids[published_label(i)] for i in (1, 2)}


@pytest.mark.parametrize(("text", "line"), [("a.JPEG,0\nb.JPEG,-1\n", 2),
                                             ("a.JPEG, 0\nb.JPEG, 1\nc.JPEG, 1000\n", 3)])
def test_a_label_outside_the_classes_names_file_and_line(tmp_path: Path, text: str,
                                                         line: int) -> None:
    gt = tmp_path / "gt.csv"
    gt.write_text(text)
    with pytest.raises(LabelError, match=rf"{gt}:{line}: class index"):
        load_ground_truth([gt], CLASSES)


def test_label_offset_for_a_wnid_file_is_refused(sample: Path, tmp_path: Path) -> None:
    one_line_error(invoke("convert", sample / "ILSVRC2012_img_val.tar", "-o", tmp_path / "o",
                          "--labels", sample / "LOC_val_solution.csv", "--label-offset", "1"),
                   3, "LOC_val_solution.csv is kaggle", "drop --label-offset")


# ---------------------------------------------------------------------------- 4. unknown wnids


def test_unknown_wnids_in_a_flat_folder_are_logged_errors(tmp_path: Path) -> None:
    src = jpeg_tree(tmp_path / "flat", {"n01440764_1.JPEG": 1, "n01443537_2.JPEG": 2,
                                   "n99999999_1.JPEG": 3, "n99999999_2.JPEG": 4,
                                   "n88888888_1.JPEG": 5})
    out = tmp_path / "out"
    r = invoke("convert", src, "-o", out, "--size", "16", "-j", "1")
    assert r.exit_code == 1, r.output
    assert "3 images are named with wnids outside the class table" in r.stdout
    assert "n88888888: 1, n99999999: 2" in r.stdout and "--classes" in r.stdout
    log = [json.loads(line) for line in (out / "train-errors.jsonl").read_text().splitlines()]
    assert sorted(e["key"] for e in log) == ["n88888888_1", "n99999999_1", "n99999999_2"]
    assert all("not in the class table" in e["reason"] and e["source"].startswith(str(src))
               for e in log)
    s = ok(invoke("convert", src, "-o", out, "--max-errors", "3", *SMALL))
    assert s["unknown_wnids"] == {"n88888888": 1, "n99999999": 2}
    assert s["errors"] == 3 and sorted(keys_of(out, "train")) == ["n01440764_1", "n01443537_2"]


# ---------------------------------------------------------------------------- 5. failed runs


@pytest.mark.parametrize("why", ["no-labels", "val-in-train", "bad-truth"])
def test_a_failed_run_leaves_no_output_folder_it_created(tmp_path: Path, why: str) -> None:
    src = _val_flat(tmp_path / "in", 2, published=why != "no-labels")
    extra: list[object] = []
    if why == "val-in-train":
        jpeg_tree(src, {f"{WNIDS[0]}_1.JPEG": 9})
    if why == "bad-truth":
        (tmp_path / "gt.txt").write_text("ILSVRC2012_val_00000001.JPEG 4000\n")
        extra = ["--labels", tmp_path / "gt.txt"]
    before = snapshot(tmp_path)
    out = tmp_path / "new" / "deeper" / "out"
    r = invoke("convert", src, "-o", out, *extra, *SMALL)
    assert r.exit_code == 3, r.output
    assert not (tmp_path / "new").exists()
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------- 6. seams


def test_the_node_section_is_typed_with_one_spelling(sample: Path, tmp_path: Path) -> None:
    """Partitioned convert and stage-to-node write the same node keys; both read back as a
    NodeSection."""
    opts = ConvertOptions(input=sample / "ILSVRC2012_img_train.tar", out=tmp_path / "full",
                          num_shards=4)
    convert(opts)
    world = World(rank=0, world_size=2, local_rank=0, local_world_size=1, node_rank=0, num_nodes=2,
                  launcher="test")
    convert(ConvertOptions(input=opts.input, out=tmp_path / "part", num_shards=4, mode="partition"),
            World(rank=1, world_size=2, local_rank=0, local_world_size=1, node_rank=1, num_nodes=2,
                  launcher="test"))
    stage_to_node(StageOptions(src=tmp_path / "full", dst=tmp_path / "staged", mode="partition"),
                  world)
    written = [json.loads((tmp_path / d / "train.json").read_text())["node"]
               for d in ("part", "staged")]
    assert set(written[0]) == set(written[1]) == set(NodeSection.__dataclass_fields__)
    for d in ("part", "staged"):
        node = read_manifest(tmp_path / d, "train").node
        assert isinstance(node, NodeSection) and node.num_nodes == 2 and node.shards == 4
        assert node.total_samples == 48
    assert len(make_plan(opts).tasks) == 4


@pytest.mark.parametrize(("patch", "field"), [
    ({"num_nodes": None}, "num_nodes"), ({"node_rank": 5}, "node_rank 5"),
    ({"mode": "sideways"}, "mode"), ({"all_shards": [["x", 1]]}, "shards"),
    ({"total_samples": None}, "total_samples")])
def test_a_bad_node_section_is_a_manifest_error_naming_the_file(
        sample: Path, tmp_path: Path, patch: dict[str, Any], field: str) -> None:
    convert(ConvertOptions(input=sample / "ILSVRC2012_img_train.tar", out=tmp_path, num_shards=2,
                           mode="partition"), World(rank=0, world_size=2, local_rank=0,
                                                    local_world_size=1, node_rank=0, num_nodes=2,
                                                    launcher="test"))
    path = tmp_path / "train.json"
    doc = json.loads(path.read_text())
    for k, v in patch.items():
        if v is None:
            del doc["node"][k]
        else:
            doc["node"][k] = v
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match=rf"{path}: node.*{field}"):
        read_manifest(path)


@pytest.mark.slow
def test_the_trainer_without_a_val_split_warns_and_trains(sample: Path, tmp_path: Path) -> None:
    convert(ConvertOptions(input=sample / "ILSVRC2012_img_train.tar", out=tmp_path, num_shards=2))
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train_imagenet.py"), "--data", str(tmp_path),
         "--arch", "tiny", "--batch-size", "8", "--workers", "1", "--image-size", "32",
         "--steps", "2", "--log-every", "1", "--threads", "1"],
        capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    warning = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1
    assert "has no val split (no val.json)" in warning[0] and "imgprep convert" in warning[0]
    assert "did not finish" not in done.stderr


def test_tars_named_for_splits_convert_each(sample: Path, tmp_path: Path) -> None:
    """The download folder itself (ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar and the
    ground truth) converts both splits in one run."""
    root = tmp_path / "download"
    root.mkdir()
    for name in ("ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar"):
        shutil.copy(sample / name, root / name)
    s = ok(invoke("convert", root, "-o", tmp_path / "out", "--labels", sample / "val.txt",
                  *SMALL))
    assert [(p["split"], p["samples"]) for p in s["splits"]] == [("train", 48), ("val", 20)]
