"""Tests for imgprep.inputs.groundtruth (every validation ground-truth form, the check against the
published validation labels, label resolution) and what imgprep.inputs.synsets ships: the ILSVRC2012
class table and the published validation labels.

The fake sample and most files here label ILSVRC2012_val_* names with made-up classes, which
the published labels refuse: they are read with ``trust=True`` (``--trust-labels``)."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from imgprep.errors import LabelError, SourceFormatError
from imgprep.inputs import synsets
from imgprep.inputs.devkit import devkit_wnids
from imgprep.inputs.groundtruth import (
    GroundTruth,
    LabelCheck,
    detect_form,
    load_ground_truth,
    read_ground_truth,
)
from imgprep.inputs.synsets import (
    imagenet_classes,
    imagenet_val_labels,
    load_class_table,
    parse_class_table,
    val_number,
)
from tests.support import jpeg

CLASSES = imagenet_classes()
GT = "ILSVRC2012_validation_ground_truth.txt"
DEVKIT = devkit_wnids()
DEVKIT_ID = {w: i for i, w in enumerate(DEVKIT, 1)}


def tar_names(path: Path) -> list[str]:
    with tarfile.open(path) as tf:
        return tf.getnames()


def _val(i: int) -> str:
    return f"ILSVRC2012_val_{i:08d}"


def _write(path: Path, text: str) -> Path:
    path.write_text(text, "utf-8")
    return path


# --- class table ---------------------------------------------------------------------------------


def test_imagenet_classes_table() -> None:
    assert len(CLASSES) == 1000
    assert list(CLASSES.wnids) == sorted(CLASSES.wnids)
    assert len(set(CLASSES.wnids)) == 1000
    assert CLASSES.wnids[0] == "n01440764" and CLASSES.index("n01440764") == 0
    assert CLASSES.wnids[999] == "n15075141" and CLASSES.index("n15075141") == 999
    assert CLASSES.names[0].startswith("tench")
    assert CLASSES.index("n99999999") is None


def test_imagenet_classes_match_real_synset_words(real_data: Path) -> None:
    rows = (real_data / "meta" / "synset_words.txt").read_text("utf-8").splitlines()
    assert list(CLASSES.wnids) == [r.split(" ", 1)[0] for r in rows]
    assert list(CLASSES.names) == [r.split(" ", 1)[1] for r in rows]


# --- detect_form ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("lines", "form"), [
    (["ImageId,PredictionString", f"{_val(1)},n01751748 1 2 3 4"], "kaggle"),
    (["ImageId, PredictionString", f"{_val(1)},n01751748"], "kaggle"),
    (["490", "361", "171", ""], "devkit"),
    (["n01751748", "n09193705", ""], "wnids"),
    (["n02119789 1 kit_fox", "n02100735 2 English_setter"], "map_clsloc"),
    ([f"{_val(1)}.JPEG 65", f"{_val(2)}.JPEG 970"], "caffe"),
    ([f"{_val(1)}.JPEG -1"], "caffe"),
    ([], "unknown"),
    (["", "   "], "unknown"),
    (["hello world, this is prose"], "unknown"),
    (["490", "n01751748"], "unknown"),
    (["<html><body>404</body></html>"], "unknown"),
])
def test_detect_form(lines: list[str], form: str) -> None:
    assert detect_form(lines) == form


# --- load_ground_truth: every form on the fake sample -------------------------------------------


def _sample_truth(sample: Path) -> dict[str, str]:
    """The expected mapping, from Caffe's val.txt read independently of imgprep."""
    out = {}
    for line in (sample / "val.txt").read_text().splitlines():
        name, idx = line.split()
        out[name.rsplit(".", 1)[0]] = CLASSES.wnids[int(idx)]
    return out


@pytest.mark.parametrize("files", [
    [GT, "map_clsloc.txt"],
    ["map_clsloc.txt", GT],
    ["LOC_val_solution.csv"],
    ["val.txt"],
], ids=["devkit+map", "map+devkit", "kaggle", "caffe"])
def test_load_each_form_from_sample(sample: Path, files: list[str]) -> None:
    """Every form gives the 20 images of the val tar their published classes; the devkit form,
    one line per image up to the last one named, gives the images before them theirs too."""
    expected = _sample_truth(sample)
    names = sorted(m.rsplit(".", 1)[0] for m in tar_names(sample / "ILSVRC2012_img_val.tar"))
    assert sorted(expected) == names and len(names) == 20
    got = load_ground_truth([sample / f for f in files], CLASSES)
    assert {k: got[k] for k in expected} == expected
    published = imagenet_val_labels()
    assert all(CLASSES.index(w) == published[int(k[-8:]) - 1] for k, w in got.items())
    if files != [GT, "map_clsloc.txt"] and files != ["map_clsloc.txt", GT]:
        assert got == expected


def test_the_devkit_ground_truth_alone_reads_with_the_devkit_map(sample: Path,
                                                                 tmp_path: Path) -> None:
    shutil.copy(sample / GT, tmp_path / GT)  # no map_clsloc.txt beside it
    got = read_ground_truth([tmp_path / GT], CLASSES)
    expected = _sample_truth(sample)
    assert {k: got.labels[k] for k in expected} == expected
    assert got.check.mode == "canonical"


def test_devkit_ids_are_not_class_indices(tmp_path: Path) -> None:
    gt = _write(tmp_path / GT, "2\n1\n2\n")
    assert DEVKIT[:2] == ("n02119789", "n02100735")  # map_clsloc.txt's first two lines
    assert load_ground_truth([gt], CLASSES, trust=True) == {
        _val(1): DEVKIT[1], _val(2): DEVKIT[0], _val(3): DEVKIT[1]}


def test_an_id_outside_the_devkit_is_refused(tmp_path: Path) -> None:
    gt = _write(tmp_path / GT, "1\n1001\n")
    with pytest.raises(LabelError, match=rf"{GT}:2: devkit ID 1001 is outside the ILSVRC2012"):
        load_ground_truth([gt], CLASSES)


def test_a_map_clsloc_that_disagrees_with_the_devkit_is_refused(tmp_path: Path) -> None:
    gt = _write(tmp_path / GT, "1\n2\n")
    mp = _write(tmp_path / "map_clsloc.txt", "n02119789 1 kit_fox\nn01443537 2 goldfish\n")
    with pytest.raises(LabelError, match=r"map_clsloc.txt:2: devkit ID 2 is n01443537 here, but "
                                         r"n02100735 in the ILSVRC2012 devkit.*drop it"):
        load_ground_truth([gt, mp], CLASSES)
    _write(tmp_path / "map_clsloc.txt", "n02119789 1 kit_fox\nn02100735 2 English_setter\n")
    assert load_ground_truth([gt, mp], CLASSES, trust=True) == {
        _val(1): DEVKIT[0], _val(2): DEVKIT[1]}


def test_map_alone_is_refused(tmp_path: Path) -> None:
    mp = _write(tmp_path / "map_clsloc.txt", "n02119789 1 kit_fox\n")
    with pytest.raises(LabelError, match="ground truth"):
        load_ground_truth([mp], CLASSES)


def test_wnid_per_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "val_wnids.txt", "n01751748\nn09193705\n\nn01440764\n")
    assert load_ground_truth([path], CLASSES, trust=True) == {
        _val(1): "n01751748", _val(2): "n09193705", _val(3): "n01440764"}


def test_kaggle_with_boxes_and_unsorted_rows(tmp_path: Path) -> None:
    path = _write(tmp_path / "LOC_val_solution.csv", (
        "ImageId,PredictionString\n"
        f"{_val(3)},n01440764 10 20 30 40 n01440764 1 2 3 4\n"
        f"{_val(1)},n15075141 1 2 3 4\n"))
    assert load_ground_truth([path], CLASSES, trust=True) == {
        _val(1): "n15075141", _val(3): "n01440764"}


def test_caffe_uses_sorted_index_and_strips_paths(tmp_path: Path) -> None:
    path = _write(tmp_path / "val.txt", f"val/{_val(1)}.JPEG 0\n{_val(2)}.JPEG 999\n")
    assert load_ground_truth([path], CLASSES, trust=True) == {
        _val(1): "n01440764", _val(2): "n15075141"}


@pytest.mark.parametrize("text", [
    "some prose that is not ground truth\n",
    "a,b,c\n1,2,3\n",
    "",
])
def test_unknown_format_names_the_file(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path / "mystery_labels.txt", text)
    with pytest.raises(LabelError, match="mystery_labels.txt"):
        load_ground_truth([path], CLASSES)


def test_binary_file_is_a_label_error(tmp_path: Path) -> None:
    path = tmp_path / "labels.bin"
    path.write_bytes(jpeg((16, 16)))
    with pytest.raises(LabelError, match="labels.bin"):
        load_ground_truth([path], CLASSES)


@pytest.mark.parametrize(("name", "text"), [
    ("wnids.txt", "n01440764\nn00000001\n"),
    ("LOC_val_solution.csv", f"ImageId,PredictionString\n{_val(1)},n00000001 1 2 3 4\n"),
])
def test_wnid_not_in_class_table(tmp_path: Path, name: str, text: str) -> None:
    with pytest.raises(LabelError, match="n00000001"):
        load_ground_truth([_write(tmp_path / name, text)], CLASSES)


def test_wnid_not_in_a_custom_class_table(tmp_path: Path) -> None:
    small = parse_class_table("n01440764 tench\nn01443537 goldfish\n", "small.txt")
    path = _write(tmp_path / "wnids.txt", "n01440764\nn15075141\n")
    with pytest.raises(LabelError, match="n15075141"):
        load_ground_truth([path], small)


@pytest.mark.parametrize(("name", "text"), [
    ("val.txt", f"{_val(1)}.JPEG 1\n{_val(1)}.JPEG 2\n"),
    ("LOC_val_solution.csv",
     f"ImageId,PredictionString\n{_val(1)},n01440764\n{_val(1)},n01443537\n"),
])
def test_conflicting_duplicates_in_one_file(tmp_path: Path, name: str, text: str) -> None:
    with pytest.raises(LabelError, match=_val(1)):
        load_ground_truth([_write(tmp_path / name, text)], CLASSES)


def test_consistent_duplicates_are_accepted(tmp_path: Path) -> None:
    path = _write(tmp_path / "val.txt", f"{_val(1)}.JPEG 1\n{_val(1)}.JPEG 1\n")
    assert load_ground_truth([path], CLASSES, trust=True) == {_val(1): CLASSES.wnids[1]}


def test_conflicting_files(tmp_path: Path) -> None:
    a = _write(tmp_path / "val.txt", f"{_val(1)}.JPEG 0\n")
    b = _write(tmp_path / "wnids.txt", "n01443537\n")
    with pytest.raises(LabelError, match=rf"wnids.txt:1: {_val(1)} labelled both"):
        load_ground_truth([a, b], CLASSES, trust=True)


def test_map_listing_an_id_twice(tmp_path: Path) -> None:
    gt = _write(tmp_path / GT, "1\n")
    mp = _write(tmp_path / "map_clsloc.txt", "n02119789 1 kit_fox\nn02119789 1 kit_fox\n")
    with pytest.raises(LabelError, match="listed twice"):
        load_ground_truth([gt, mp], CLASSES)


@pytest.mark.parametrize("index", [1000, 5000, -1])
def test_caffe_index_out_of_range(tmp_path: Path, index: int) -> None:
    path = _write(tmp_path / "val.txt", f"{_val(1)}.JPEG 3\n{_val(2)}.JPEG {index}\n")
    with pytest.raises(LabelError, match=rf"val.txt:2: class index {index}"):
        load_ground_truth([path], CLASSES)


# --- byte-order marks ----------------------------------------------------------------------------


def _published_map(tmp_path: Path) -> Path:
    """The devkit's map_clsloc.txt, in sorted-wnid order (IDs need not be sorted)."""
    return _write(tmp_path / "map_clsloc.txt", "".join(
        f"{w} {DEVKIT_ID[w]} c{i}\n" for i, w in enumerate(CLASSES.wnids)))


def _bom_files(tmp_path: Path, form: str) -> list[Path]:
    """The published labels of the first three validation images in ``form``, each file
    saved with a UTF-8 byte-order mark (as Excel saves a CSV)."""
    first = [(_val(k), int(imagenet_val_labels()[k - 1])) for k in (1, 2, 3)]
    text = {
        "kaggle": "ImageId,PredictionString\n" + "".join(
            f"{k},{CLASSES.wnids[c]} 1 2 3 4\n" for k, c in first),
        "caffe": "".join(f"{k}.JPEG {c}\n" for k, c in first),
        "wnids": "".join(f"{CLASSES.wnids[c]}\n" for _, c in first),
        "devkit": "".join(f"{DEVKIT_ID[CLASSES.wnids[c]]}\n" for _, c in first),
    }[form]
    path = tmp_path / f"{form}.txt"
    path.write_text(text, "utf-8-sig")
    if form != "devkit":
        return [path]
    mp = _published_map(tmp_path)
    mp.write_text(mp.read_text("utf-8"), "utf-8-sig")
    return [path, mp]


@pytest.mark.parametrize("form", ["kaggle", "caffe", "wnids", "devkit"])
def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path: Path, form: str) -> None:
    paths = _bom_files(tmp_path, form)
    assert paths[0].read_bytes().startswith(b"\xef\xbb\xbf")
    truth = read_ground_truth(paths, CLASSES)
    assert truth.labels == {_val(k): CLASSES.wnids[imagenet_val_labels()[k - 1]]
                            for k in (1, 2, 3)}
    assert truth.check == LabelCheck("canonical", 3, 0)


def test_a_class_file_with_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "classes.txt"
    path.write_text("n01443537 goldfish\nn01440764 tench\n", "utf-8-sig")
    table = load_class_table(path)
    assert table.wnids == ("n01440764", "n01443537")
    assert table.names == ("tench", "goldfish")


def test_a_class_file_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "classes.txt"
    path.write_bytes(b"n01440764 tench\xff\n")
    with pytest.raises(SourceFormatError, match=r"classes.txt is not UTF-8"):
        load_class_table(path)


# --- the published validation labels ------------------------------------------------------------

PUBLISHED = imagenet_val_labels()


def test_the_published_val_labels() -> None:
    assert PUBLISHED.shape == (50_000,) and PUBLISHED.dtype.kind == "u"
    assert np.bincount(PUBLISHED, minlength=1000).tolist() == [50] * 1000
    assert PUBLISHED[:3].tolist() == [65, 970, 230]  # Caffe val.txt's first three lines
    assert {CLASSES.wnids[PUBLISHED[k - 1]] for k in (2155, 15846)} == {"n04584207"}
    assert not PUBLISHED.flags.writeable
    assert imagenet_val_labels() is PUBLISHED  # read and checked once


@pytest.mark.parametrize(("key", "number"), [
    (_val(1), 1), (_val(50_000), 50_000), (_val(0), None), (_val(50_001), None),
    ("ILSVRC2012_val_0000001", None), ("ILSVRC2012_test_00000001", None),
    ("n01440764_10026", None), (f"{_val(1)}.JPEG", None),
])
def test_val_number(key: str, number: int | None) -> None:
    assert val_number(key) == number


def test_a_damaged_val_labels_file_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    imagenet_val_labels.cache_clear()
    monkeypatch.setattr(synsets, "VAL_LABELS_SHA256", "0" * 64)
    try:
        with pytest.raises(LabelError, match=r"imgprep/inputs/data/ilsvrc2012_val_labels.bin has "
                                             r"sha256 f5350687.*not 0{64}.*reinstall imgprep"):
            imagenet_val_labels()
    finally:
        imagenet_val_labels.cache_clear()


def test_the_published_val_labels_are_the_real_ground_truth(real_data: Path) -> None:
    """The packaged file is Caffe's val.txt, read here on its own."""
    rows = (real_data / "meta" / "caffe_val.txt").read_text("utf-8").split()
    assert [int(c) for c in rows[1::2]] == PUBLISHED.tolist()
    assert rows[0::2] == [f"{_val(k)}.JPEG" for k in range(1, 50_001)]


def _subset(n: int = 1300, seed: int = 0) -> list[tuple[int, int]]:
    """``n`` validation images (number, published label) drawn from the published table, none
    of class 0 or 999: a 1-based copy has labels 1..999, without 0 and without 1000."""
    pool = np.flatnonzero((PUBLISHED != 0) & (PUBLISHED != 999)) + 1
    picks = np.sort(np.random.default_rng(seed).choice(pool, n, replace=False))
    return [(int(k), int(PUBLISHED[k - 1])) for k in picks]


def _name_labels(path: Path, rows: list[tuple[int, int]], shift: int = 0) -> Path:
    return _write(path, "".join(f"{_val(k)}.JPEG {c + shift}\n" for k, c in rows))


def test_a_one_based_subset_is_refused_naming_the_offset(tmp_path: Path) -> None:
    """1,300 images of ~725 classes, labels 1..999 with no 0: no shape rule can tell it is
    1-based; the published labels can."""
    rows = _subset()
    assert 700 <= len({c for _, c in rows}) <= 750
    gt = _name_labels(tmp_path / "tf_val.txt", rows, shift=1)
    with pytest.raises(LabelError, match=rf"^{gt}: every ILSVRC2012_val_\* name in it is labelled "
                                         r"1 above the published .* TensorFlow.*; pass "
                                         r"--label-offset 1$"):
        load_ground_truth([gt], CLASSES)
    shifted = read_ground_truth([gt], CLASSES, label_offset=1)
    assert shifted.check == LabelCheck("canonical", 1300, 0)
    assert shifted.labels == {_val(k): CLASSES.wnids[c] for k, c in rows}


@pytest.mark.parametrize(("shift", "offset", "fix", "advice"), [
    (0, 1, 0, "1 below .* after --label-offset 1 .*; pass --label-offset 0 instead of "
              "--label-offset 1$"),
    (2, 1, 2, "1 above .* after --label-offset 1 .*; pass --label-offset 2 instead of "
              "--label-offset 1$"),
    (-1, None, -1, "1 below .*; pass --label-offset -1$"),
    (1, 0, 1, "1 above .*; pass --label-offset 1 instead of --label-offset 0$"),
])
def test_a_shifted_file_names_the_label_offset_that_fixes_it(
        tmp_path: Path, shift: int, offset: int | None, fix: int, advice: str) -> None:
    rows = _subset(40, seed=1)
    gt = _name_labels(tmp_path / "val.txt", rows, shift)
    with pytest.raises(LabelError, match=advice):
        load_ground_truth([gt], CLASSES, label_offset=offset)
    assert load_ground_truth([gt], CLASSES, label_offset=fix) == {
        _val(k): CLASSES.wnids[c] for k, c in rows}


def test_many_wrong_labels_are_refused_naming_the_first_twenty_and_how_many_more(
        tmp_path: Path) -> None:
    rows = _subset(200, seed=3)
    bad = [(k, (c + 1) % 1000 if i % 8 == 0 else c) for i, (k, c) in enumerate(rows)]
    gt = _name_labels(tmp_path / "val.txt", bad)
    with pytest.raises(LabelError) as e:
        load_ground_truth([gt], CLASSES)
    msg = str(e.value)
    named = [i for i in range(200) if f"{gt}:{i + 1}: " in msg]
    assert msg.startswith(f"{gt}: 25 of 200 ILSVRC2012_val_* names are labelled otherwise")
    assert named == list(range(0, 160, 8)) and "; and 5 more); fix the file" in msg


def test_a_few_wrong_labels_are_refused_naming_count_and_lines(tmp_path: Path) -> None:
    rows = _subset(200, seed=2)
    wrong = (4, 57, 120, 150)
    bad = [(k, (c + 1) % 1000 if i in wrong else c) for i, (k, c) in enumerate(rows)]
    gt = _name_labels(tmp_path / "val.txt", bad)
    with pytest.raises(LabelError) as e:
        load_ground_truth([gt], CLASSES)
    msg = str(e.value)
    assert msg.startswith(f"{gt}: 4 of 200 ILSVRC2012_val_* names are labelled otherwise")
    for i in wrong:  # every differing line, so that one refusal is enough to fix the file
        k, c = rows[i]
        assert f"{gt}:{i + 1}: {_val(k)} is {CLASSES.wnids[(c + 1) % 1000]}" in msg
        assert f"published {CLASSES.wnids[c]} ({c})" in msg
    assert "more" not in msg and msg.endswith(
        "); fix the file, or pass --trust-labels to convert with these labels on purpose")
    trusted = read_ground_truth([gt], CLASSES, trust=True)
    assert trusted.check == LabelCheck("trusted", 0, 200, 4)
    assert trusted.labels == {_val(k): CLASSES.wnids[c] for k, c in bad}


def _forms(tmp_path: Path, rows: list[tuple[int, int]]) -> dict[str, list[Path]]:
    """The labels ``rows`` (numbers 1..n in order, for the positional forms) in every form."""
    kaggle = _write(tmp_path / "LOC_val_solution.csv", "ImageId,PredictionString\n" + "".join(
        f"{_val(k)},{CLASSES.wnids[c]} 1 2 3 4\n" for k, c in rows))
    wnids = _write(tmp_path / "wnids.txt", "".join(f"{CLASSES.wnids[c]}\n" for _, c in rows))
    devkit = _write(tmp_path / GT, "".join(f"{DEVKIT_ID[CLASSES.wnids[c]]}\n" for _, c in rows))
    return {"kaggle": [kaggle], "wnids": [wnids], "devkit": [devkit, _published_map(tmp_path)],
            "caffe": [_name_labels(tmp_path / "val.txt", rows)]}


@pytest.mark.parametrize("form", ["kaggle", "wnids", "devkit", "caffe"])
def test_every_form_is_checked_against_the_published_labels(tmp_path: Path, form: str) -> None:
    rows = [(k, int(PUBLISHED[k - 1])) for k in range(1, 31)]
    assert read_ground_truth(_forms(tmp_path, rows)[form], CLASSES).check == \
        LabelCheck("canonical", 30, 0)
    rows[6] = (7, (rows[6][1] + 500) % 1000)
    paths = _forms(tmp_path, rows)[form]
    line = 8 if form == "kaggle" else 7
    with pytest.raises(LabelError, match=rf"1 of 30 .* \({paths[0]}:{line}: {_val(7)} is"):
        load_ground_truth(paths, CLASSES)


def test_a_devkit_file_missing_a_line_is_refused(tmp_path: Path) -> None:
    """Positional: one line lost shifts every later label onto the wrong image."""
    rows = [(k, int(PUBLISHED[k - 1])) for k in range(1, 101)]
    paths = _forms(tmp_path, rows[:40] + rows[41:])["devkit"]
    with pytest.raises(LabelError, match=rf"of 99 .* \({paths[0]}:41: {_val(41)} is"):
        load_ground_truth(paths, CLASSES)


def test_a_correct_subset_that_looks_one_based_is_accepted(tmp_path: Path) -> None:
    """One image each of classes 1..12: labels exactly 1..12, which the shape rules call
    1-based; the published labels say they are right."""
    rows = [(int(np.flatnonzero(PUBLISHED == c)[0]) + 1, c) for c in range(1, 13)]
    gt = _name_labels(tmp_path / "val.txt", rows)
    assert read_ground_truth([gt], CLASSES).check == LabelCheck("canonical", 12, 0)


def test_other_names_keep_the_shape_rules(tmp_path: Path) -> None:
    gt = _write(tmp_path / "val.txt", "".join(f"img_{i}.JPEG {i}\n" for i in range(1, 11)))
    with pytest.raises(LabelError, match=r"its labels are exactly 1..10.*--label-offset 1"):
        load_ground_truth([gt], CLASSES)
    mixed = _write(tmp_path / "mixed.txt", f"{_val(1)}.JPEG 65\nimg_1.JPEG 7\nimg_2.JPEG 0\n")
    truth = read_ground_truth([mixed], CLASSES)
    assert truth.check == LabelCheck("canonical+heuristic", 1, 2)
    assert truth.labels == {_val(1): CLASSES.wnids[65], "img_1": CLASSES.wnids[7],
                            "img_2": CLASSES.wnids[0]}
    other = _write(tmp_path / "other.txt", "img_1.JPEG 7\n")
    assert read_ground_truth([other], CLASSES).check == LabelCheck("heuristic", 0, 1)


def test_a_published_class_outside_a_custom_table_is_a_difference(tmp_path: Path) -> None:
    small = parse_class_table("n01440764 tench\nn01443537 goldfish\n", "small.txt")
    rows = [(k, 0) for k in (1, 2, 3)]  # published 65, 970, 230: not in the table
    gt = _name_labels(tmp_path / "val.txt", rows)
    with pytest.raises(LabelError, match=r"3 of 3 .*published n01751748 \(not in the class table"):
        load_ground_truth([gt], small)
    assert len(load_ground_truth([gt], small, trust=True)) == 3


# --- real ground truth ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_read(real_data: Path) -> dict[str, GroundTruth]:
    meta = real_data / "meta"
    return {
        "devkit": read_ground_truth([meta / GT, meta / "map_clsloc.txt"], CLASSES),
        "devkit-alone": read_ground_truth([meta / GT], CLASSES),
        "kaggle": read_ground_truth([meta / "LOC_val_solution.csv"], CLASSES),
        "caffe": read_ground_truth([meta / "caffe_val.txt"], CLASSES),
    }


@pytest.fixture(scope="module")
def real_truths(real_read: dict[str, GroundTruth]) -> dict[str, dict[str, str]]:
    return {form: truth.labels for form, truth in real_read.items()}


def test_real_ground_truth_passes_the_published_label_check(
        real_read: dict[str, GroundTruth]) -> None:
    for form, truth in real_read.items():
        assert truth.check == LabelCheck("canonical", 50_000, 0), form


def test_real_forms_agree(real_truths: dict[str, dict[str, str]]) -> None:
    ref = real_truths["caffe"]
    assert sorted(ref) == [_val(i) for i in range(1, 50_001)]
    for form, truth in real_truths.items():
        assert truth == ref, form
    index = {w: i for i, w in enumerate(CLASSES.wnids)}
    counts = np.bincount([index[w] for w in ref.values()], minlength=1000)
    assert counts.min() == counts.max() == 50


@pytest.mark.parametrize("key", [_val(2155), _val(15846)])
def test_real_known_entries(real_truths: dict[str, dict[str, str]], key: str) -> None:
    for form, truth in real_truths.items():
        assert truth[key] == "n04584207", form


def test_real_first_caffe_line(real_data: Path, real_truths: dict[str, dict[str, str]]) -> None:
    first = (real_data / "meta" / "caffe_val.txt").read_text().splitlines()[0].split()
    assert real_truths["devkit"][_val(1)] == CLASSES.wnids[int(first[1])]


def test_quoted_csv_fields_are_read_as_the_csv_module_reads_them(tmp_path: Path) -> None:
    """Kaggle's CSV saved by a spreadsheet: every field quoted, the header too."""
    rows = _subset(3, seed=4)
    lines = ['"ImageId","PredictionString"'] + [
        f'"{_val(k)}","{CLASSES.wnids[c]} 1 2 3 4 {CLASSES.wnids[c]} 5 6 7 8"' for k, c in rows]
    gt = tmp_path / "LOC_val_solution.csv"
    gt.write_text("\n".join(lines) + "\n")
    assert load_ground_truth([gt], CLASSES) == {_val(k): CLASSES.wnids[c] for k, c in rows}
