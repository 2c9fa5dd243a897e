"""Tests for imgprep.groundtruth (every validation ground-truth form, label resolution) and the
ILSVRC2012 class table in imgprep.synsets."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import jpeg, tar_bytes, write_tar

from imgprep.errors import LabelError
from imgprep.groundtruth import detect_form, load_ground_truth, resolve_labels
from imgprep.sources import list_source
from imgprep.synsets import ClassTable, imagenet_classes, parse_class_table

CLASSES = imagenet_classes()
GT = "ILSVRC2012_validation_ground_truth.txt"


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
    expected = _sample_truth(sample)
    assert sorted(expected) == [_val(i) for i in range(1, 21)]
    assert load_ground_truth([sample / f for f in files], CLASSES) == expected


def test_devkit_finds_sibling_map(sample: Path) -> None:
    assert load_ground_truth([sample / GT], CLASSES) == _sample_truth(sample)


def test_devkit_ids_are_not_class_indices(tmp_path: Path) -> None:
    gt = _write(tmp_path / GT, "2\n1\n2\n")
    mp = _write(tmp_path / "map.txt", "n01443537 1 goldfish\nn15075141 2 toilet_tissue\n")
    assert load_ground_truth([gt, mp], CLASSES) == {
        _val(1): "n15075141", _val(2): "n01443537", _val(3): "n15075141"}


def test_devkit_without_map_is_refused(sample: Path, tmp_path: Path) -> None:
    shutil.copy(sample / GT, tmp_path / GT)
    with pytest.raises(LabelError, match="map_clsloc"):
        load_ground_truth([tmp_path / GT], CLASSES)


def test_devkit_id_missing_from_map(tmp_path: Path) -> None:
    gt = _write(tmp_path / GT, "1\n7\n")
    _write(tmp_path / "map_clsloc.txt", "n01443537 1 goldfish\n")
    with pytest.raises(LabelError, match=r"devkit ID 7"):
        load_ground_truth([gt], CLASSES)


def test_map_alone_is_refused(tmp_path: Path) -> None:
    mp = _write(tmp_path / "map_clsloc.txt", "n01443537 1 goldfish\n")
    with pytest.raises(LabelError, match="ground truth"):
        load_ground_truth([mp], CLASSES)


def test_wnid_per_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "val_wnids.txt", "n01751748\nn09193705\n\nn01440764\n")
    assert load_ground_truth([path], CLASSES) == {
        _val(1): "n01751748", _val(2): "n09193705", _val(3): "n01440764"}


def test_kaggle_with_boxes_and_unsorted_rows(tmp_path: Path) -> None:
    path = _write(tmp_path / "LOC_val_solution.csv", (
        "ImageId,PredictionString\n"
        f"{_val(3)},n01440764 10 20 30 40 n01440764 1 2 3 4\n"
        f"{_val(1)},n15075141 1 2 3 4\n"))
    assert load_ground_truth([path], CLASSES) == {_val(1): "n15075141", _val(3): "n01440764"}


def test_caffe_uses_sorted_index_and_strips_paths(tmp_path: Path) -> None:
    path = _write(tmp_path / "val.txt", f"val/{_val(1)}.JPEG 0\n{_val(2)}.JPEG 999\n")
    assert load_ground_truth([path], CLASSES) == {_val(1): "n01440764", _val(2): "n15075141"}


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
    assert load_ground_truth([path], CLASSES) == {_val(1): CLASSES.wnids[1]}


def test_conflicting_files(tmp_path: Path) -> None:
    a = _write(tmp_path / "val.txt", f"{_val(1)}.JPEG 0\n")
    b = _write(tmp_path / "wnids.txt", "n01443537\n")
    with pytest.raises(LabelError, match=_val(1)):
        load_ground_truth([a, b], CLASSES)


def test_map_listing_an_id_twice(tmp_path: Path) -> None:
    gt = _write(tmp_path / GT, "1\n")
    mp = _write(tmp_path / "map_clsloc.txt", "n01443537 1 goldfish\nn01440764 1 tench\n")
    with pytest.raises(LabelError, match="listed twice"):
        load_ground_truth([gt, mp], CLASSES)


@pytest.mark.parametrize("index", [1000, 5000, -1])
def test_caffe_index_out_of_range(tmp_path: Path, index: int) -> None:
    path = _write(tmp_path / "val.txt", f"{_val(1)}.JPEG 3\n{_val(2)}.JPEG {index}\n")
    with pytest.raises(LabelError, match=rf"val.txt:2: class index {index}"):
        load_ground_truth([path], CLASSES)


# --- resolve_labels ------------------------------------------------------------------------------


def _flat_folder(root: Path, names: list[str]) -> Path:
    root.mkdir()
    for i, name in enumerate(names):
        (root / name).write_bytes(jpeg((16, 16), seed=i))
    return root


def test_resolve_from_ground_truth(tmp_path: Path) -> None:
    listing = list_source(_flat_folder(tmp_path / "val", [f"{_val(i)}.JPEG" for i in (2, 1, 3)]))
    truth = {_val(1): "n15075141", _val(2): "n01440764", _val(3): "n01443537",
             _val(4): "n01484850"}
    labels = resolve_labels(listing, CLASSES, truth)
    assert labels.tolist() == [999, 0, 1]
    assert labels.dtype.kind == "i"


def test_resolve_from_folder(tmp_path: Path) -> None:
    for w in ("n01443537", "n15075141"):
        (tmp_path / w).mkdir()
        (tmp_path / w / f"img_{w}.JPEG").write_bytes(jpeg((16, 16)))
    listing = list_source(tmp_path)
    assert resolve_labels(listing, CLASSES, None).tolist() == [1, 999]


def test_resolve_from_inner_tar(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "train.tar", [
        ("n15075141.tar", tar_bytes([("a.JPEG", jpeg((16, 16)))])),
        ("n01440764.tar", tar_bytes([("b.JPEG", jpeg((16, 16)))])),
    ])
    listing = list_source(path)
    assert [listing.key_str(i) for i in range(2)] == ["a", "b"]
    assert resolve_labels(listing, CLASSES, None).tolist() == [999, 0]


def test_resolve_from_key_prefix(tmp_path: Path) -> None:
    listing = list_source(_flat_folder(tmp_path / "images", [
        "n01440764_tench.JPEG", "n01443537_goldfish.JPEG", "n15075141_toilet_tissue.JPEG"]))
    assert resolve_labels(listing, CLASSES, None).tolist() == [0, 1, 999]


def test_resolve_sample_train_tar(sample: Path) -> None:
    listing = list_source(sample / "ILSVRC2012_img_train.tar")
    labels = resolve_labels(listing, CLASSES, None)
    for i in range(len(listing)):
        assert CLASSES.wnids[labels[i]] == listing.key_str(i).split("_")[0]


def test_resolve_sample_val_with_every_truth_form(sample: Path) -> None:
    listing = list_source(sample / "ILSVRC2012_img_val.tar")
    results = [resolve_labels(listing, CLASSES, load_ground_truth([sample / f], CLASSES))
               for f in (GT, "val.txt", "LOC_val_solution.csv")]
    expected = _sample_truth(sample)
    want = [CLASSES.index(expected[listing.key_str(i)]) for i in range(len(listing))]
    for labels in results:
        assert labels.tolist() == want


def test_no_label_names_the_image(tmp_path: Path) -> None:
    root = _flat_folder(tmp_path / "misc", ["holiday_photo.JPEG"])
    listing = list_source(root)
    with pytest.raises(LabelError, match=r"misc/holiday_photo\.JPEG"):
        resolve_labels(listing, CLASSES, None)


def test_val_image_without_truth_hints_at_labels(tmp_path: Path) -> None:
    listing = list_source(_flat_folder(tmp_path / "val", [f"{_val(1)}.JPEG"]))
    with pytest.raises(LabelError, match=rf"val/{_val(1)}\.JPEG.*--labels"):
        resolve_labels(listing, CLASSES, None)


def test_image_missing_from_truth_names_the_image(tmp_path: Path) -> None:
    listing = list_source(_flat_folder(tmp_path / "val", [f"{_val(1)}.JPEG", f"{_val(9)}.JPEG"]))
    with pytest.raises(LabelError, match=rf"val/{_val(9)}\.JPEG"):
        resolve_labels(listing, CLASSES, {_val(1): "n01440764"})


def test_unknown_folder_wnid_names_the_image(tmp_path: Path) -> None:
    (tmp_path / "n00000001").mkdir()
    (tmp_path / "n00000001" / "x.JPEG").write_bytes(jpeg((16, 16)))
    with pytest.raises(LabelError, match=r"n00000001/x\.JPEG"):
        resolve_labels(list_source(tmp_path), CLASSES, None)


def test_custom_class_table_labels(tmp_path: Path) -> None:
    table: ClassTable = parse_class_table("n15075141 tissue\nn01443537 goldfish\n", "t.txt")
    listing = list_source(_flat_folder(tmp_path / "imgs", [
        "n15075141_a.JPEG", "n01443537_b.JPEG"]))
    assert table.wnids == ("n01443537", "n15075141")
    assert [listing.key_str(i) for i in range(2)] == ["n01443537_b", "n15075141_a"]
    assert resolve_labels(listing, table, None).tolist() == [0, 1]


# --- real ground truth ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_truths(real_data: Path) -> dict[str, dict[str, str]]:
    meta = real_data / "meta"
    return {
        "devkit": load_ground_truth([meta / GT, meta / "map_clsloc.txt"], CLASSES),
        "devkit-sibling": load_ground_truth([meta / GT], CLASSES),
        "kaggle": load_ground_truth([meta / "LOC_val_solution.csv"], CLASSES),
        "caffe": load_ground_truth([meta / "caffe_val.txt"], CLASSES),
    }


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


def test_real_val_originals_resolve(real_data: Path,
                                    real_truths: dict[str, dict[str, str]]) -> None:
    listing = list_source(real_data / "originals" / "val")
    labels = resolve_labels(listing, CLASSES, real_truths["devkit"])
    assert labels.tolist() == [CLASSES.index("n04584207")] * 2


def test_real_train_originals_resolve_from_folders(real_data: Path) -> None:
    listing = list_source(real_data / "originals" / "train")
    assert len(listing) == 13 and listing.errors == ()
    labels = resolve_labels(listing, CLASSES, None)
    for i in range(len(listing)):
        assert CLASSES.wnids[labels[i]] == listing.member_str(i).split("/")[0]
