"""The Hugging Face parquet form: its files, its listing and its refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyarrow")

from imgprep.errors import LabelError, SourceFormatError  # noqa: E402
from imgprep.inputs.fakes.parquet import hub_class_names, hub_path, write_split  # noqa: E402
from imgprep.inputs.forms import parquet as hfparquet  # noqa: E402
from imgprep.inputs.synsets import imagenet_classes  # noqa: E402

CLASSES = imagenet_classes()
NAMES = hub_class_names(CLASSES)


def _rows(n: int, split: str = "train") -> list[tuple[str, bytes, int]]:
    out = []
    for i in range(n):
        wnid = CLASSES.wnids[11 * i]
        key = f"{wnid}_{500 + i}" if split == "train" else f"ILSVRC2012_{split}_{i + 1:08d}"
        out.append((hub_path(key, wnid, split), bytes([i]) * (20 + i),
                    -1 if split == "test" else 11 * i))
    return out


def test_the_files_of_each_split_are_found_from_the_download_folder(tmp_path: Path) -> None:
    write_split(tmp_path / "data", "train", _rows(6), NAMES, files=3)
    write_split(tmp_path / "data", "val", _rows(4, "val"), NAMES, files=2)
    found = hfparquet.parquet_files(tmp_path)
    assert [p.name for p in found["train"]] == [f"train-{i:05d}-of-00003.parquet"
                                                for i in range(3)]
    assert [p.name for p in found["val"]] == ["validation-00000-of-00002.parquet",
                                              "validation-00001-of-00002.parquet"]
    assert hfparquet.parquet_files(tmp_path / "data") == found
    one = found["train"][1]
    assert hfparquet.parquet_files(one) == {"train": [one]}


def test_an_unfinished_download_is_refused_naming_the_missing_files(tmp_path: Path) -> None:
    files = write_split(tmp_path / "data", "train", _rows(6), NAMES, files=3)
    files[1].unlink()
    with pytest.raises(SourceFormatError, match=r"holds 2 of the 3 train parquet files "
                       r"\(missing: train-00001-of-00003.parquet\)"):
        hfparquet.parquet_files(tmp_path)


def test_keys_are_canonical_stems_and_wnids_come_from_the_label(tmp_path: Path) -> None:
    (path,) = write_split(tmp_path, "val", _rows(5, "val"), NAMES, files=1)
    listing = hfparquet.list_file(path, CLASSES, allow_test=False)
    assert [k.decode() for k in listing.key] == [f"ILSVRC2012_val_{i + 1:08d}" for i in range(5)]
    assert [w.decode() for w in listing.wnid] == [CLASSES.wnids[11 * i] for i in range(5)]
    assert listing.member[0].decode() == f"{path.name}/ILSVRC2012_val_00000001_n01440764.JPEG"


def test_the_test_split_has_no_class(tmp_path: Path) -> None:
    (path,) = write_split(tmp_path, "test", _rows(3, "test"), NAMES, files=1)
    listing = hfparquet.list_file(path, CLASSES, allow_test=True)
    assert listing.key[0] == b"ILSVRC2012_test_00000001" and set(listing.wnid) == {b""}


def test_a_label_that_disagrees_with_the_name_is_refused_naming_the_rows(tmp_path: Path) -> None:
    rows = _rows(6)
    rows[4] = (rows[4][0], rows[4][1], rows[4][2] + 1)
    (path,) = write_split(tmp_path, "train", rows, NAMES, files=1)
    with pytest.raises(LabelError, match=r"1 rows whose label is another class than the wnid "
                       r"their image.path ends in \(row 4 \(n01689811_504_n01689811.JPEG: "
                       r"label 45 = n01692333\)"):
        hfparquet.list_file(path, CLASSES, allow_test=False)


def test_a_row_without_a_path_is_refused_unless_its_label_is_trusted(tmp_path: Path) -> None:
    rows = _rows(2)
    (path,) = write_split(tmp_path, "train", [("", rows[0][1], 3), rows[1]], NAMES, files=1)
    with pytest.raises(LabelError, match=r"1 of 2 rows have no image.path, or one that names "
                       r"no class and no published image \(rows 0\), so their labels cannot "
                       r"be checked .* or pass --trust-labels to accept the labels as given"):
        hfparquet.list_file(path, CLASSES, allow_test=False)
    listing = hfparquet.list_file(path, CLASSES, allow_test=False, trust=True)
    assert listing.key[0] == b"train-00000-of-00001_000000"
    assert listing.wnid[0] == CLASSES.wnids[3].encode()


def test_spooled_items_are_the_image_bytes_in_row_order(tmp_path: Path) -> None:
    rows = _rows(9)
    files = write_split(tmp_path / "data", "train", rows, NAMES, files=2)
    listed = [hfparquet.list_file(p, CLASSES, allow_test=False) for p in files]
    containers, cols, _ = hfparquet.columns(listed, tmp_path / "spool", workers=2, start=1)
    got = {}
    for c, o, s, k in zip(cols["container"], cols["offset"], cols["size"], cols["key"],
                          strict=True):
        with open(containers[c], "rb") as f:
            f.seek(o)
            got[k.decode()] = f.read(s)
    want = {r[0].rsplit("_", 1)[0]: r[1] for r in rows}
    assert got == want
    dry, cols2, _ = hfparquet.columns(listed, None, workers=1)
    assert dry == tuple(str(p) for p in files) and (cols2["key"] == cols["key"]).all()
