"""webdataset shard sets: their splits, sample keys and labels, and what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgprep.errors import SourceFormatError
from imgprep.inputs.fakes.wds import shard_bytes, shard_name
from imgprep.inputs.forms import ListContext, detect, list_split
from imgprep.inputs.forms import wds as form
from imgprep.inputs.sources import Listing
from tests.support import tar_bytes


def _shard(folder: Path, name: str, members: list[tuple[str, bytes]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(tar_bytes(members))
    return folder / name


def _listing(path: Path, split: str | None = None) -> Listing:
    found = detect(path)
    assert found.form == "wds"
    s = found.split(split) if split else found.splits[0]
    assert s is not None
    return list_split(s, ListContext(workers=1))


def test_a_folder_with_train_and_validation_sets_is_two_splits(tmp_path: Path) -> None:
    for split in ("train", "val"):
        (tmp_path / shard_name(split, 0)).write_bytes(shard_bytes(
            [(f"n01440764_{split}", b"x", 0, "n01440764_1.JPEG", "tench")]))
    found = detect(tmp_path)
    assert [s.split for s in found.splits] == ["train", "val"]
    assert detect(tmp_path / "imagenet1k-validation-0000.tar").splits[0].split == "val"


def test_two_sets_of_one_split_are_refused(tmp_path: Path) -> None:
    _shard(tmp_path, "imagenet1k-train-0000.tar", [("a.jpg", b"x")])
    _shard(tmp_path, "imagenet22k-train-0000.tar", [("a.jpg", b"x")])
    with pytest.raises(SourceFormatError, match="two train shard sets"):
        detect(tmp_path)


def test_a_key_that_is_not_canonical_takes_the_stem_of_the_json_filename(
        tmp_path: Path) -> None:
    meta = json.dumps({"filename": "ILSVRC2012_val_00000007.JPEG", "label": 999}).encode()
    _shard(tmp_path, "imagenet1k-validation-0000.tar", [
        ("s000017.jpg", b"img"), ("s000017.cls", b"999"), ("s000017.json", meta)])
    listing = _listing(tmp_path)
    assert listing.key_str(0) == "ILSVRC2012_val_00000007"
    assert listing.wnid_str(0) == "n15075141"  # class 999
    assert listing.member_str(0) == "imagenet1k-validation-0000.tar/s000017.jpg"


def test_without_cls_the_label_comes_from_the_json_or_the_key(tmp_path: Path) -> None:
    meta = json.dumps({"label": 1}).encode()  # n01443537
    _shard(tmp_path, "imagenet1k-train-0000.tar", [
        ("n01443537_5.jpg", b"img"), ("n01443537_5.json", meta),
        ("n01440764_6.jpg", b"img2")])
    listing = _listing(tmp_path)
    assert [listing.key_str(i) for i in range(2)] == ["n01440764_6", "n01443537_5"]
    # n01443537_5 from its .json; n01440764_6 carries none: the class its key names
    assert [listing.wnid_str(i) for i in range(2)] == ["n01440764", "n01443537"]


def test_bad_samples_are_recorded_and_skipped(tmp_path: Path) -> None:
    _shard(tmp_path, "imagenet1k-train-0000.tar", [
        ("n01440764_1.jpg", b"ok"), ("n01440764_1.cls", b"0"),
        ("n01440764_2.cls", b"0"),
        ("n01440764_3.jpg", b"x"), ("n01440764_3.cls", b"1000"),
        ("n01440764_4.jpg", b"x"), ("n01440764_4.cls", b"tench")])
    listing = _listing(tmp_path)
    assert [listing.key_str(i) for i in range(len(listing))] == ["n01440764_1"]
    reasons = {e.source: e.reason for e in listing.errors}
    assert "sample without an image" in reasons["imagenet1k-train-0000.tar/n01440764_2"]
    assert "outside 0..999" in reasons["imagenet1k-train-0000.tar/n01440764_3"]
    assert "not a class index" in reasons["imagenet1k-train-0000.tar/n01440764_4"]


def test_a_damaged_shard_is_refused_naming_it(tmp_path: Path) -> None:
    shard = _shard(tmp_path, "imagenet1k-train-0000.tar",
                   [("n01440764_1.jpg", b"x" * 2000), ("n01440764_1.cls", b"0")])
    shard.write_bytes(shard.read_bytes()[:1500])
    with pytest.raises(SourceFormatError, match="imagenet1k-train-0000.tar: .*re-download"):
        _listing(tmp_path)


def test_sample_keys_end_at_the_first_dot() -> None:
    assert form.sample_key("dir/n01440764_1.seg.png") == ("dir/n01440764_1", "seg.png")
    assert form.sample_key("n01440764_1.JPG") == ("n01440764_1", "jpg")
