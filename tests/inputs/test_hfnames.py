"""The key and class of an image name in the Hugging Face Hub's copies and shard sets."""

from __future__ import annotations

import pytest

from imgprep.inputs.hfnames import hub_split, is_canonical, parse_name


@pytest.mark.parametrize(("name", "key", "wnid"), [
    ("n01440764_10026_n01440764.JPEG", "n01440764_10026", "n01440764"),
    ("train/n01440764_10026_n01440764.JPEG", "n01440764_10026", "n01440764"),
    ("ILSVRC2012_val_00000001_n01751748.JPEG", "ILSVRC2012_val_00000001", "n01751748"),
    ("ILSVRC2012_test_00000001.JPEG", "ILSVRC2012_test_00000001", ""),
    ("n01440764_10026.JPEG", "n01440764_10026", "n01440764"),
    ("ILSVRC2012_val_00000001.JPEG", "ILSVRC2012_val_00000001", ""),
    ("odd name.v2.jpg", "odd_name_v2", ""),
])
def test_a_name_gives_its_canonical_stem_and_the_class_it_names(name: str, key: str,
                                                                 wnid: str) -> None:
    got = parse_name(name)
    assert (got.key, got.wnid, got.conflict) == (key, wnid, "")
    assert is_canonical(got.key) == (key != "odd_name_v2")


def test_a_name_that_names_two_classes_says_so() -> None:
    got = parse_name("n01440764_10026_n01443537.JPEG")
    assert got.key == "n01440764_10026"
    assert "n01440764" in got.conflict and "n01443537" in got.conflict


@pytest.mark.parametrize(("name", "split"), [
    ("train-00000-of-00294.parquet", "train"), ("validation-00013-of-00014.parquet", "val"),
    ("test-00000-of-00028.parquet", "test"), ("train_images_4.tar.gz", "train"),
    ("val_images.tar.gz", "val"), ("test_images.tar.gz", "test"),
    ("imagenet1k-train-0000.tar", None), ("train.parquet", None),
])
def test_the_split_of_a_hub_file_is_in_its_name(name: str, split: str | None) -> None:
    assert hub_split(name) == split
