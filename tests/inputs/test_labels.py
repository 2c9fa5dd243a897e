"""Every listed image's label (imgprep.inputs.labels): from ground truth, from what the input
carries (class folders and tars, names, the listing's wnid column that every form fills), or
from the published validation labels; carried labels meet the published-label check, a shift
or a disagreement refused naming how many and the first, ``--trust-labels`` counting them."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from imgprep.errors import LabelError
from imgprep.inputs.groundtruth import LabelCheck, load_ground_truth
from imgprep.inputs.labels import label_listing, resolve_labels
from imgprep.inputs.sources import Listing, list_source
from imgprep.inputs.synsets import (
    ClassTable,
    imagenet_classes,
    imagenet_val_labels,
    parse_class_table,
)
from tests.support import jpeg, tar_bytes, write_tar

CLASSES = imagenet_classes()
PUBLISHED = imagenet_val_labels()
GT = "ILSVRC2012_validation_ground_truth.txt"


def _val(i: int) -> str:
    return f"ILSVRC2012_val_{i:08d}"


def _sample_truth(sample: Path) -> dict[str, str]:
    """{key: wnid} of the fake sample's val.txt, read independently of imgprep."""
    out = {}
    for line in (sample / "val.txt").read_text().splitlines():
        name, idx = line.split()
        out[name.rsplit(".", 1)[0]] = CLASSES.wnids[int(idx)]
    return out


def listing(rows: list[tuple[str, str]], root: str = "/data/in") -> Listing:
    """A listing of (member, carried wnid or "") rows, as a form would build it: the key is
    the member's stem, sorted by key; no image is read."""
    rows = sorted(rows, key=lambda r: Path(r[0]).stem)
    n = len(rows)
    return Listing(
        root=root, kind="folder", containers=(root,), container=np.zeros(n, dtype=np.int32),
        offset=np.full(n, -1, dtype=np.int64), size=np.ones(n, dtype=np.int64),
        member=np.asarray([m.encode() for m, _ in rows] or [b""])[:n],
        key=np.asarray([Path(m).stem.encode() for m, _ in rows] or [b""])[:n],
        wnid=np.asarray([w.encode() for _, w in rows] or [b""], dtype="S9")[:n])


def published_wnid(k: int, shift: int = 0) -> str:
    return CLASSES.wnids[(int(PUBLISHED[k - 1]) + shift) % 1000]


# --- resolve_labels: every source, moved here from the ground-truth tests ----------------------


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
    results = [resolve_labels(listing, CLASSES,
                              load_ground_truth([sample / f], CLASSES, trust=True))
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


def test_a_val_name_past_the_published_set_hints_at_labels(tmp_path: Path) -> None:
    listing = list_source(_flat_folder(tmp_path / "val", [f"{_val(50_001)}.JPEG"]))
    with pytest.raises(LabelError, match=rf"val/{_val(50_001)}\.JPEG.*--labels"):
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



@pytest.mark.realdata
def test_real_val_originals_resolve(real_data: Path) -> None:
    listing = list_source(real_data / "originals" / "val")
    truth = load_ground_truth([real_data / "meta" / GT], CLASSES)
    labels = resolve_labels(listing, CLASSES, truth)
    assert labels.tolist() == [CLASSES.index("n04584207")] * 2


@pytest.mark.realdata
def test_real_train_originals_resolve_from_folders(real_data: Path) -> None:
    listing = list_source(real_data / "originals" / "train")
    assert len(listing) == 13 and listing.errors == ()
    labels = resolve_labels(listing, CLASSES, None)
    for i in range(len(listing)):
        assert CLASSES.wnids[labels[i]] == listing.member_str(i).split("/")[0]


# --- published labels ----------------------------------------------------------------------------


def test_canonical_val_names_get_the_published_labels(sample: Path) -> None:
    """The fake ILSVRC2012_img_val.tar, no ground truth: every image its published label."""
    lst = list_source(sample / "ILSVRC2012_img_val.tar")
    got = label_listing(lst, CLASSES)
    assert got.labels.tolist() == [int(PUBLISHED[int(lst.key_str(i)[-8:]) - 1])
                                   for i in range(len(lst))]
    assert got.source == "published"
    assert got.check == LabelCheck("published", len(lst), 0)
    expected = _sample_truth(sample)
    assert {lst.key_str(i): CLASSES.wnids[got.labels[i]] for i in range(len(lst))} == expected


@pytest.mark.realdata
def test_the_real_val_originals_get_their_published_labels(real_data: Path) -> None:
    got = label_listing(list_source(real_data / "originals" / "val"), CLASSES)
    assert got.labels.tolist() == [CLASSES.index("n04584207")] * 2
    assert got.source == "published"


def test_a_published_class_outside_a_custom_table_names_the_image() -> None:
    small = parse_class_table("n01440764 tench\n", "small.txt")
    with pytest.raises(LabelError, match=rf"{_val(1)}.JPEG: its published class "
                                         rf"{published_wnid(1)} is not in the class table"):
        label_listing(listing([(f"{_val(1)}.JPEG", "")]), small)


def test_images_the_input_labels_keep_theirs_and_the_rest_get_the_published() -> None:
    rows = [(f"{published_wnid(k)}/{_val(k)}.JPEG", published_wnid(k)) for k in (1, 2)]
    rows += [(f"{_val(k)}.JPEG", "") for k in (3, 4, 5)]
    got = label_listing(listing(rows), CLASSES)
    assert got.labels.tolist() == [int(PUBLISHED[k - 1]) for k in range(1, 6)]
    assert got.source == "input+published"
    assert got.check == LabelCheck("canonical", 5, 0)


# --- labels the input carries --------------------------------------------------------------------


def test_carried_labels_that_agree_pass_the_canonical_check() -> None:
    rows = [(f"{published_wnid(k)}/{_val(k)}.JPEG", published_wnid(k)) for k in range(1, 31)]
    got = label_listing(listing(rows), CLASSES)
    assert got.source == "input" and got.check == LabelCheck("canonical", 30, 0)
    assert got.labels.tolist() == PUBLISHED[:30].tolist()


def test_carried_labels_shifted_by_one_are_refused_naming_the_shift() -> None:
    """A form whose labels count from 1 (every class one above the published one)."""
    rows = [(f"part-0.parquet#{k}/{_val(k)}", published_wnid(k, 1)) for k in range(1, 41)]
    lst = listing(rows)
    with pytest.raises(LabelError) as e:
        label_listing(lst, CLASSES)
    msg = str(e.value)
    assert "/data/in: every one of its 40 ILSVRC2012_val_* images is labelled 1 above the " \
        "published ILSVRC2012 validation labels (it counts classes from 1" in msg
    first = f"part-0.parquet#1/{_val(1)} is {published_wnid(1, 1)} ({PUBLISHED[0] + 1}), " \
        f"published {published_wnid(1)} ({PUBLISHED[0]})"
    assert f"({first}; " in msg and msg.count(" is n") == 20 and "; and 20 more)" in msg
    assert "--labels" in msg and "--trust-labels" in msg
    got = label_listing(lst, CLASSES, trust=True)
    assert got.labels.tolist() == [(int(c) + 1) % 1000 for c in PUBLISHED[:40]]
    assert got.check == LabelCheck("trusted", 0, 40, 40)


def test_carried_labels_that_disagree_are_refused_naming_count_and_first() -> None:
    wrong = {3, 17}
    rows = [(f"{published_wnid(k, 7 if k in wrong else 0)}/{_val(k)}.JPEG",
             published_wnid(k, 7 if k in wrong else 0)) for k in range(1, 21)]
    with pytest.raises(LabelError, match=rf"/data/in: 2 of 20 ILSVRC2012_val_\* images carry "
                                         rf"labels other than the published .*\("
                                         rf"{published_wnid(3, 7)}/{_val(3)}.JPEG is "
                                         rf"{published_wnid(3, 7)} .*; {published_wnid(17, 7)}/"
                                         rf"{_val(17)}.JPEG is .*\); fix the input"):
        label_listing(listing(rows), CLASSES)
    got = label_listing(listing(rows), CLASSES, trust=True)
    assert got.check == LabelCheck("trusted", 0, 20, 2)
    assert [CLASSES.wnids[c] for c in got.labels] == [w for _, w in sorted(
        rows, key=lambda r: Path(r[0]).stem)]


def test_a_train_name_whose_wnid_differs_from_its_class_is_refused() -> None:
    rows = [(f"n01440764/n01440764_{i}.JPEG", "n01440764") for i in range(5)]
    rows += [("n01440764/n01443537_7.JPEG", "n01440764")]
    with pytest.raises(LabelError, match=r"1 of 6 images whose names start with a wnid are "
                                         r"given another class \(n01440764/"
                                         r"n01443537_7.JPEG is given n01440764, its name says "
                                         r"n01443537\); move each .*--trust-labels"):
        label_listing(listing(rows), CLASSES)
    got = label_listing(listing(rows), CLASSES, trust=True)
    assert got.labels.tolist() == [0] * 6
    assert got.check == LabelCheck("trusted", 0, 6, 1)


def test_train_labels_from_folders_and_names_pass_without_a_check() -> None:
    rows = [(f"{w}/{w}_{i}.JPEG", w) for w in ("n01440764", "n15075141") for i in range(3)]
    rows += [("n01443537_9.JPEG", "")]
    got = label_listing(listing(rows), CLASSES)
    assert sorted(got.labels.tolist()) == [0, 0, 0, 1, 999, 999, 999]
    assert got.source == "input" and got.check == LabelCheck()


@pytest.mark.slow
def test_labelling_is_vectorised_over_a_large_listing() -> None:
    """200,000 images of 1,000 classes plus 50,000 val images: no Python loop per image
    (a loop would take seconds; numpy takes a fraction of one)."""
    rng = np.random.default_rng(0)
    classes = rng.integers(0, 1000, 200_000)
    rows = [(f"{CLASSES.wnids[c]}_{i}.JPEG", CLASSES.wnids[c]) for i, c in enumerate(classes)]
    rows += [(f"{_val(k)}.JPEG", published_wnid(k)) for k in range(1, 50_001)]
    lst = listing(rows)
    t0 = time.perf_counter()
    got = label_listing(lst, CLASSES)
    took = time.perf_counter() - t0
    assert got.check == LabelCheck("canonical", 50_000, 0)
    assert np.bincount(got.labels, minlength=1000).sum() == 250_000
    assert took < 5, took
