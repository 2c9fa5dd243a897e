"""Reading the Hugging Face parquet copy a row group at a time, and what is refused."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from imgprep.errors import LabelError, SourceFormatError  # noqa: E402
from imgprep.inputs import parquetio  # noqa: E402
from imgprep.inputs.fakes.parquet import hub_class_names, hub_metadata, write_parquet  # noqa: E402
from imgprep.inputs.synsets import imagenet_classes  # noqa: E402

CLASSES = imagenet_classes()
NAMES = hub_class_names(CLASSES)


def _rows(n: int = 10) -> list[tuple[str, bytes, int]]:
    return [(f"{CLASSES.wnids[7 * i]}_{100 + i}_{CLASSES.wnids[7 * i]}.JPEG",
             bytes([i]) * (50 + i), 7 * i) for i in range(n)]


def test_the_footer_says_the_row_groups_and_class_names(tmp_path: Path) -> None:
    path = tmp_path / "train-00000-of-00001.parquet"
    write_parquet(path, _rows(10), NAMES, rows_per_group=4)
    assert parquetio.is_parquet(path) and not parquetio.is_parquet(tmp_path)
    meta = parquetio.read_meta(path, CLASSES)
    assert meta.row_groups == (4, 4, 2) and meta.rows == 10
    assert meta.class_names is not None and len(meta.class_names) == 1000
    assert "crane2" in meta.class_names  # the second 'crane', as datasets needs unique names


def test_listing_reads_only_names_and_labels_a_row_group_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "train-00000-of-00001.parquet"
    rows = _rows(10)
    write_parquet(path, rows, NAMES, rows_per_group=4)
    asked: list[Any] = []
    real = pq.ParquetFile.read_row_group

    def spy(self: Any, i: int, columns: Any = None, **kw: Any) -> Any:
        asked.append((i, columns))
        return real(self, i, columns=columns, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    groups = list(parquetio.iter_labels(path, CLASSES, allow_test=False))
    assert [g.first_row for g in groups] == [0, 4, 8]
    assert [p for g in groups for p in g.paths] == [r[0] for r in rows]
    assert [int(x) for g in groups for x in g.labels] == [r[2] for r in rows]
    assert asked == [(g, ["image.path", "label"]) for g in range(3)]
    batches: list[Any] = []
    real_batches = pq.ParquetFile.iter_batches
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", lambda self, **kw: batches.append(
        (kw["row_groups"], kw["columns"])) or real_batches(self, **kw))
    asked.clear()
    assert list(parquetio.iter_images(path)) == [r[1] for r in rows]
    assert asked == [] and batches == [([g], ["image.bytes"]) for g in range(3)]


def _table(image: Any, label: Any, names: list[str] | None = None) -> Any:
    meta = {b"huggingface": hub_metadata(names)} if names else None
    return pa.table({"image": image, "label": label}).replace_schema_metadata(meta)


def test_a_parquet_of_another_schema_is_refused_naming_what_it_lacks(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"img": [b"x"], "cls": ["a"]}), path)
    with pytest.raises(SourceFormatError, match=r"x.parquet is a parquet file but not the "
                       r"Hugging Face copy.*'image' column.*integer 'label'.*img: binary"):
        parquetio.read_meta(path, CLASSES)


def test_imagenette_metadata_is_refused_not_read_as_imagenet_labels(tmp_path: Path) -> None:
    path = tmp_path / "train-00000-of-00001.parquet"
    names = ["tench", "English springer", "cassette player", "chain saw", "church",
             "French horn", "garbage truck", "gas pump", "golf ball", "parachute"]
    write_parquet(path, [(r[0], r[1], i % 10) for i, r in enumerate(_rows(5))], names)
    with pytest.raises(LabelError, match=r"names 10 classes \(tench, English springer.*not "
                       r"the 1000 of ILSVRC2012.*0-9 are not ImageNet's"):
        parquetio.read_meta(path, CLASSES)


def test_class_names_in_another_order_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "train-00000-of-00001.parquet"
    write_parquet(path, _rows(3), NAMES[::-1])
    with pytest.raises(LabelError, match=r"names 1000 of its 1000 classes otherwise.*label 0: "
                       r"'toilet tissue"):
        parquetio.read_meta(path, CLASSES)


def test_null_labels_are_refused_from_the_statistics_naming_the_row_group(
        tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    image = pa.array([{"bytes": b"x", "path": "a.JPEG"}] * 6)
    pq.write_table(_table(image, pa.array([1, 2, 3, 4, None, 6], pa.int64())), path,
                   row_group_size=3)
    with pytest.raises(SourceFormatError, match=r"t.parquet: row group 1 holds 1 null 'label'"):
        parquetio.read_meta(path, CLASSES)


def test_null_labels_without_statistics_are_refused_naming_the_row(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    image = pa.array([{"bytes": b"x", "path": "a.JPEG"}] * 6)
    pq.write_table(_table(image, pa.array([1, 2, 3, 4, None, 6], pa.int64())), path,
                   row_group_size=3, write_statistics=False)
    parquetio.read_meta(path, CLASSES)
    with pytest.raises(SourceFormatError, match=r"row group 1, row 1 \(row 4 of the file\): "
                       r"'label' is null"):
        list(parquetio.iter_labels(path, CLASSES, allow_test=False))


def test_null_image_bytes_are_refused_naming_the_row(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    image = pa.array([{"bytes": b"x", "path": "a"}, {"bytes": None, "path": "b"}, None],
                     type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(_table(image, pa.array([1, 2, 3], pa.int64())), path,
                   write_statistics=False)
    with pytest.raises(SourceFormatError, match=r"row group 0, row 1: 'image.bytes' is null"):
        list(parquetio.iter_images(path))


@pytest.mark.parametrize(("labels", "allow_test", "match"), [
    ([0, 1000], False, r"row 1 \(row 1 of the file\): label 1000 is outside 0..999"),
    ([5, -1], False, r"label -1 is the test split's -1 outside the test split"),
    ([-2, -1], True, r"row 0 .*label -2 is outside -1..999"),
])
def test_labels_out_of_range_are_refused_naming_the_row(
        tmp_path: Path, labels: list[int], allow_test: bool, match: str) -> None:
    path = tmp_path / "t.parquet"
    write_parquet(path, [(f"x{i}.JPEG", b"x", v) for i, v in enumerate(labels)], NAMES)
    with pytest.raises(LabelError, match=match):
        list(parquetio.iter_labels(path, CLASSES, allow_test=allow_test))


def test_the_test_split_label_is_read_where_allowed(tmp_path: Path) -> None:
    path = tmp_path / "test-00000-of-00001.parquet"
    write_parquet(path, [("ILSVRC2012_test_00000001.JPEG", b"x", -1)], NAMES)
    (group,) = parquetio.iter_labels(path, CLASSES, allow_test=True)
    assert group.labels.tolist() == [-1]


def test_without_pyarrow_the_refusal_names_the_extra(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "train-00000-of-00001.parquet"
    write_parquet(path, _rows(2), NAMES)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(SourceFormatError, match=r"needs pyarrow.*pip install 'imgprep\[parquet\]'"):
        parquetio.read_meta(path, CLASSES)


def test_a_truncated_parquet_is_refused_as_damaged(tmp_path: Path) -> None:
    path = tmp_path / "train-00000-of-00001.parquet"
    write_parquet(path, _rows(4), NAMES)
    path.write_bytes(path.read_bytes()[:-100])
    assert not parquetio.is_parquet(path)
    with pytest.raises(SourceFormatError, match="not a readable parquet file.*download it again"):
        parquetio.read_meta(path, CLASSES)
