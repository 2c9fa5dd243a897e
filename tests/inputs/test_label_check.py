"""``imgprep convert`` checks ground truth against the published ILSVRC2012 validation labels,
reads label files saved with a byte-order mark, and separates validation images found in a
train folder with commands that work.

Every refusal is one ``imgprep: error:`` line (exit 3) naming the file and the fix, and
leaves the output folder as it was.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

from imgprep.inputs.devkit import devkit_wnids
from imgprep.inputs.synsets import imagenet_classes, imagenet_val_labels
from imgprep.shards.manifest import read_manifest
from loaders.labellist import read_label_list
from tests.support import devkit_archive, jpeg, one_line_error, write_tar
from tests.support.cli import invoke, jpeg_tree, ok, snapshot

CLASSES = imagenet_classes()
PUBLISHED = imagenet_val_labels()
SMALL = ("--size", "16", "-j", "1", "-q", "--json")
WNIDS = ("n01440764", "n01443537")




def _val(k: int) -> str:
    return f"ILSVRC2012_val_{k:08d}"




def labels_of(out: Path, split: str = "val") -> dict[str, int]:
    """{key: class index} of every sample in the split's shards."""
    found = {}
    for entry in read_manifest(out, split).shards:
        with tarfile.open(out / entry.name) as tf:
            for m in tf:
                f = tf.extractfile(m) if m.name.endswith(".cls") else None
                if f is not None:
                    found[m.name[:-4]] = int(f.read())
    return found


def subset(n: int = 1300, seed: int = 0) -> list[tuple[int, int]]:
    """``n`` validation images (number, published label), none of class 0 or 999: a 1-based
    copy has labels 1..999 with no 0 and no 1000, as a published 1,300-image subset has."""
    pool = np.flatnonzero((PUBLISHED != 0) & (PUBLISHED != 999)) + 1
    picks = np.sort(np.random.default_rng(seed).choice(pool, n, replace=False))
    return [(int(k), int(PUBLISHED[k - 1])) for k in picks]


def name_labels(path: Path, rows: list[tuple[int, int]], shift: int = 0) -> Path:
    path.write_text("".join(f"{_val(k)} {c + shift}\n" for k, c in rows))
    return path


def val_folder(root: Path, numbers: list[int]) -> Path:
    return jpeg_tree(root, {f"{_val(k)}.JPEG": k for k in numbers})


# ---------------------------------------------------------------------------- published labels


def test_a_one_based_subset_is_refused_naming_the_shift_and_label_offset(tmp_path: Path) -> None:
    """1,300 images of ~725 classes, labels 1..999 and no 0: refused naming the shift and
    --label-offset 1; with it, converted silently with the published labels."""
    rows = subset()
    assert 700 <= len({c for _, c in rows}) <= 750
    gt = name_labels(tmp_path / "tf_val_labels.txt", rows, shift=1)
    src = val_folder(tmp_path / "val", [k for k, _ in rows[:6]])
    out = tmp_path / "out"
    one_line_error(invoke("convert", src, "-o", out, "--labels", gt, *SMALL), 3, gt,
                   "labelled 1 above the published ILSVRC2012 validation labels",
                   "pass --label-offset 1")
    assert not out.exists()
    r = invoke("convert", src, "-o", out, "--labels", gt, "--label-offset", "1", *SMALL)
    s = ok(r)
    assert r.stderr == ""
    assert s["label_check"] == "canonical"
    assert s["label_check_names"] == {"canonical": 1300, "other": 0, "differing": 0}
    assert labels_of(out) == {_val(k): c for k, c in rows[:6]}


def test_wrong_labels_are_refused_and_trust_labels_converts_them(tmp_path: Path) -> None:
    rows = subset(50, seed=3)
    wrong = (2, 30, 41)
    bad = [(k, (c + 10) % 1000 if i in wrong else c) for i, (k, c) in enumerate(rows)]
    gt = name_labels(tmp_path / "val.txt", bad)
    src = val_folder(tmp_path / "val", [k for k, _ in rows])
    out = tmp_path / "out"
    (out / "keep").mkdir(parents=True)
    (out / "keep" / "note.txt").write_text("mine")
    before = snapshot(out)
    msg = one_line_error(invoke("convert", src, "-o", out, "--labels", gt, *SMALL), 3,
                         f"{gt}: 3 of 50 ILSVRC2012_val_* names are labelled otherwise",
                         *(f"{gt}:{i + 1}: {_val(rows[i][0])}" for i in wrong), "--trust-labels")
    assert "…" not in msg
    assert snapshot(out) == before
    s = ok(invoke("convert", src, "-o", out, "--labels", gt, "--trust-labels", *SMALL))
    assert s["label_check"] == "trusted"
    assert s["label_check_names"] == {"canonical": 0, "other": 50, "differing": 3}
    assert labels_of(out) == {_val(k): c for k, c in bad}
    human = invoke("convert", src, "-o", out, "--labels", gt, "--trust-labels", "-j", "1",
                   "--size", "16")
    assert human.exit_code == 0, human.output
    assert "--trust-labels: 3 ILSVRC2012_val_* names" in human.stdout


def test_trust_labels_with_nothing_to_trust_is_refused(tmp_path: Path) -> None:
    """A val folder labelled from the published table has no labels to take as given."""
    src = val_folder(tmp_path / "val", [1, 2])
    one_line_error(invoke("convert", src, "-o", tmp_path / "out", "--trust-labels", *SMALL), 3,
                   "--trust-labels", "its labels are the published ones", "drop --trust-labels")
    assert not (tmp_path / "out").exists()


def test_agreement_is_silent(tmp_path: Path) -> None:
    rows = subset(30, seed=4)
    gt = tmp_path / "LOC_val_solution.csv"
    gt.write_text("ImageId,PredictionString\n" + "".join(
        f"{_val(k)},{CLASSES.wnids[c]} 1 2 3 4\n" for k, c in rows))
    src = val_folder(tmp_path / "val", [k for k, _ in rows[:5]])
    r = invoke("convert", src, "-o", tmp_path / "out", "--labels", gt, "-j", "1", "--size", "16")
    assert r.exit_code == 0 and r.stderr.count("warning") == 0, r.output
    assert "label" not in r.stdout.lower()
    s = ok(invoke("convert", src, "-o", tmp_path / "out", "--labels", gt, *SMALL))
    assert (s["label_check"], s["label_check_names"]["canonical"]) == ("canonical", 30)
    assert labels_of(tmp_path / "out") == {_val(k): c for k, c in rows[:5]}
    train = jpeg_tree(tmp_path / "train", {f"{w}/{w}_1.JPEG": i for i, w in enumerate(WNIDS)})
    assert ok(invoke("convert", train, "-o", tmp_path / "out", *SMALL))["label_check"] == "none"


@pytest.mark.realdata
@pytest.mark.parametrize("files", [
    ["ILSVRC2012_validation_ground_truth.txt", "map_clsloc.txt"],
    ["LOC_val_solution.csv"],
    ["caffe_val.txt"],
], ids=["devkit", "kaggle", "caffe"])
def test_the_real_ground_truth_files_pass_the_check(real_data: Path, tmp_path: Path,
                                                    files: list[str]) -> None:
    labels = [a for f in files for a in ("--labels", real_data / "meta" / f)]
    s = ok(invoke("convert", real_data / "originals" / "val", "-o", tmp_path, *labels, *SMALL))
    assert s["label_check"] == "canonical"
    assert s["label_check_names"] == {"canonical": 50_000, "other": 0, "differing": 0}
    assert set(labels_of(tmp_path).values()) == {CLASSES.index("n04584207")}


@pytest.mark.realdata
@pytest.mark.parametrize("form", ["ground truth alone", "archive"])
def test_the_devkit_ground_truth_needs_no_map(real_data: Path, tmp_path: Path,
                                             form: str) -> None:
    """The 2012 devkit's ground truth alone, and the devkit archive, as --labels."""
    gt = real_data / "meta" / "ILSVRC2012_validation_ground_truth.txt"
    if form == "archive":
        gt = devkit_archive(tmp_path / "ILSVRC2012_devkit_t12.tar.gz", gt.read_bytes())
    s = ok(invoke("convert", real_data / "originals" / "val", "-o", tmp_path / "out",
                  "--labels", gt, *SMALL))
    assert (s["label_source"], s["label_check"]) == ("ground-truth", "canonical")
    assert s["label_check_names"]["canonical"] == 50_000
    assert set(labels_of(tmp_path / "out").values()) == {CLASSES.index("n04584207")}


def test_a_map_clsloc_that_is_not_the_devkits_is_refused(tmp_path: Path) -> None:
    devkit = {w: i for i, w in enumerate(devkit_wnids(), 1)}
    gt = tmp_path / "ILSVRC2012_validation_ground_truth.txt"
    gt.write_text("".join(f"{devkit[CLASSES.wnids[int(c)]]}\n" for c in PUBLISHED[:20]))
    mp = tmp_path / "map_clsloc.txt"
    mp.write_text("".join(f"{w} {i + 1} c\n" for i, w in enumerate(CLASSES.wnids)))  # sorted
    src = val_folder(tmp_path / "val", [1, 2, 3])
    one_line_error(invoke("convert", src, "-o", tmp_path / "out", "--labels", gt, "--labels", mp,
                          *SMALL), 3, f"{mp}:1: devkit ID 1 is {CLASSES.wnids[0]} here",
                   "drop it")
    assert ok(invoke("convert", src, "-o", tmp_path / "out", "--labels", gt, *SMALL))


# ---------------------------------------------------------------------------- no --labels


def test_a_val_folder_without_labels_gets_the_published_labels_and_says_so(
        tmp_path: Path) -> None:
    rows = subset(6, seed=7)
    src = val_folder(tmp_path / "val", [k for k, _ in rows])
    out = tmp_path / "out"
    human = invoke("convert", src, "-o", out, "-j", "1", "--size", "16")
    assert human.exit_code == 0, human.output
    assert "labels: the published ILSVRC2012 validation labels" in human.stdout
    s = ok(invoke("convert", src, "-o", out, *SMALL))
    assert (s["split"], s["label_source"], s["label_check"]) == ("val", "published", "published")
    assert labels_of(out) == {_val(k): c for k, c in rows}


def test_the_fake_val_tar_converts_without_labels(sample: Path, tmp_path: Path) -> None:
    s = ok(invoke("convert", sample / "ILSVRC2012_img_val.tar", "-o", tmp_path, *SMALL))
    assert (s["split"], s["samples"], s["label_source"]) == ("val", 20, "published")
    want = {line.split()[0][:-5]: int(line.split()[1])
            for line in (sample / "val.txt").read_text().splitlines()}
    assert labels_of(tmp_path) == want


@pytest.mark.realdata
def test_the_real_val_originals_convert_without_labels(real_data: Path, tmp_path: Path) -> None:
    s = ok(invoke("convert", real_data / "originals" / "val", "-o", tmp_path, *SMALL))
    assert s["label_source"] == "published"
    assert labels_of(tmp_path) == {_val(2155): CLASSES.index("n04584207"),
                                   _val(15846): CLASSES.index("n04584207")}


def test_class_folders_shifted_by_one_are_refused_and_trust_labels_converts_them(
        tmp_path: Path) -> None:
    """A val tree in class folders, each image one class above its published one."""
    rows = subset(12, seed=8)
    src = jpeg_tree(tmp_path / "val", {f"{CLASSES.wnids[c + 1]}/{_val(k)}.JPEG": k
                                       for k, c in rows})
    out = tmp_path / "out"
    msg = one_line_error(invoke("convert", src, "-o", out, *SMALL), 3,
                         f"{src}: every one of its 12 ILSVRC2012_val_* images is labelled 1 "
                         "above the published", "it counts classes from 1",
                         f"({CLASSES.wnids[rows[0][1] + 1]}/{_val(rows[0][0])}.JPEG is",
                         "--trust-labels")
    assert msg.count(".JPEG is ") == 12 and "more" not in msg
    assert not out.exists()
    s = ok(invoke("convert", src, "-o", out, "--trust-labels", *SMALL))
    assert (s["label_source"], s["label_check"]) == ("input", "trusted")
    assert s["label_check_names"]["differing"] == 12
    assert labels_of(out) == {_val(k): c + 1 for k, c in rows}
    human = invoke("convert", src, "-o", out, "--trust-labels", "-j", "1", "--size", "16")
    assert "--trust-labels: 12 images carry labels other than the published" in human.stdout


# ---------------------------------------------------------------------------- byte-order marks


def test_a_kaggle_csv_with_a_byte_order_mark_converts(tmp_path: Path) -> None:
    rows = subset(4, seed=5)
    gt = tmp_path / "LOC_val_solution.csv"
    gt.write_text("ImageId,PredictionString\n" + "".join(
        f"{_val(k)},{CLASSES.wnids[c]}\n" for k, c in rows), "utf-8-sig")
    assert gt.read_bytes().startswith(b"\xef\xbb\xbfImageId")
    src = val_folder(tmp_path / "val", [k for k, _ in rows])
    ok(invoke("convert", src, "-o", tmp_path / "out", "--labels", gt, *SMALL))
    assert labels_of(tmp_path / "out") == {_val(k): c for k, c in rows}


def test_a_label_list_with_a_byte_order_mark_reads(tmp_path: Path) -> None:
    lst = tmp_path / "train.txt"
    lst.write_text("train/a.jpg 3\ntrain/b.jpg 0\n", "utf-8-sig")
    entries = read_label_list(lst)
    assert entries.paths == ("train/a.jpg", "train/b.jpg")
    assert entries.labels.tolist() == [3, 0]


# ---------------------------------------------------------------------------- merged splits


STEPS = re.compile(r"1\) move these (\d+) files out of (.+?)(?: \(class folders kept\))?: "
                   r"(\(cd .+?\\;\)) 2\) (imgprep convert .+?) converts .+?; 3\) (?:.*?: )?"
                   r"(imgprep convert .+? --split val.*?)(?: converts the moved ones)?\. "
                   r"Else pass --split train")


def run_steps(msg: str, cwd: Path) -> tuple[int, list[list[str]]]:
    """Run the message's shell command (step 1); return the count it names and its two
    convert commands' arguments (steps 2 and 3)."""
    m = STEPS.search(msg)
    assert m is not None, msg
    subprocess.run(["sh", "-c", m.group(3)], cwd=cwd, check=True)
    return int(m.group(1)), [shlex.split(m.group(i))[2:] for i in (4, 5)]


def test_a_root_whose_train_holds_val_images_gets_commands_that_work(tmp_path: Path) -> None:
    """train/ holds validation images in its class folders, beside val/: the message says
    which and how many, with the command that moves them out (class folders kept), then
    the converts that work."""
    root = tmp_path / "imagenet"
    # validation images in the class folders of their published classes (0 and 1)
    stray = {f"train/{w}/{_val(k)}.JPEG": k for k, w in zip((293, 236, 2138), WNIDS * 2,
                                                            strict=False)}
    jpeg_tree(root, {**{f"train/{w}/{w}_{i}.JPEG": 10 * j + i for j, w in enumerate(WNIDS)
                   for i in range(2)}, **stray,
                **{f"val/{w}/{_val(k)}.JPEG": k for k, w in ((3014, WNIDS[0]), (262, WNIDS[1]))}})
    out = tmp_path / "out"
    msg = one_line_error(invoke("convert", root, "-o", out, *SMALL), 3, f"{root}/train",
                         "3 validation images", "find", "--split train")
    assert not out.exists()
    count, (again, moved) = run_steps(msg, tmp_path)
    assert count == 3
    assert not list((root / "train").rglob("ILSVRC2012_val_*"))
    dest = tmp_path / "imagenet-val-images"
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.JPEG")) == \
        sorted(r.removeprefix("train/") for r in stray)
    s = ok(invoke(*["convert", *again, *SMALL]))
    assert [x["split"] for x in s["splits"]] == ["train", "val"]
    assert sorted(labels_of(out, "train")) == sorted(f"{w}_{i}" for w in WNIDS for i in range(2))
    assert labels_of(out, "val") == {_val(262): 1, _val(3014): 0}
    ok(invoke(*["convert", *moved, *SMALL]))
    other = Path(moved[moved.index("-o") + 1])
    assert labels_of(other) == {_val(k): CLASSES.index(r.split("/")[1]) for r, k in stray.items()}


def test_a_train_folder_with_loose_val_images_gets_commands_that_work(tmp_path: Path) -> None:
    """Val images loose in a train tree given on its own: moved out, then the train images and
    the moved ones (labelled from the published table) convert into one folder."""
    src = jpeg_tree(tmp_path / "mine", {**{f"{w}/{w}_1.JPEG": i for i, w in enumerate(WNIDS)},
                                   f"{_val(7)}.JPEG": 7, f"{_val(8)}.JPEG": 8})
    out = tmp_path / "out"
    msg = one_line_error(invoke("convert", src, "-o", out, *SMALL), 3, src,
                         "2 validation images", "--split val")
    assert "--labels" not in msg  # their names are published: their labels ship with imgprep
    count, (again, moved) = run_steps(msg, tmp_path)
    assert count == 2
    s = ok(invoke(*["convert", *again, *SMALL]))
    assert (s["split"], s["samples"]) == ("train", 2)
    assert ok(invoke(*["convert", *moved, *SMALL]))["label_source"] == "published"
    assert labels_of(out) == {_val(k): int(PUBLISHED[k - 1]) for k in (7, 8)}


def test_val_images_inside_a_train_tar_are_named_with_the_tar(tmp_path: Path) -> None:
    src = write_tar(tmp_path / "train.tar", [(f"{WNIDS[0]}_1.JPEG", jpeg((40, 32))),
                                             (f"{_val(5)}.JPEG", jpeg((40, 32), seed=5))])
    msg = one_line_error(invoke("convert", src, "-o", tmp_path / "out", *SMALL), 3,
                         "1 validation images", f"inside {src}", "rebuild", "--split train")
    assert "find" not in msg
