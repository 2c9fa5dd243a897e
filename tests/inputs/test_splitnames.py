"""The split a name says (``imgprep.inputs.splitnames``): one rule set, the same for every form
that reads a split from a name (folders and tars, the Hub's parquet and tar.gz files, a
webdataset set's shards, a file given alone)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgprep.inputs.forms.wds import shard_sets
from imgprep.inputs.hfnames import file_split, hub_split
from imgprep.inputs.splitnames import ARCHIVES, WORDS, split_of_name


@pytest.mark.parametrize("word", sorted(WORDS))
def test_every_form_reads_every_word_as_the_same_split(word: str, tmp_path: Path) -> None:
    split = WORDS[word]
    assert split_of_name(word) == split_of_name(word.upper()) == split
    assert split_of_name(f"{word.title()}.tar") == split
    assert hub_split(f"{word}-00000-of-00001.parquet") == split
    assert hub_split(f"{word}_images_0.tar.gz") == split
    (tmp_path / f"imagenet1k-{word}-0000.tar").write_bytes(b"")
    assert shard_sets(tmp_path) == ({split: [tmp_path / f"imagenet1k-{word}-0000.tar"]}
                                    if split != "test" else {})  # a set's test shards: unread


def test_image_net_orgs_archive_names_say_their_split() -> None:
    assert {name: split_of_name(f"{name.upper()}.tar") for name in ARCHIVES} == ARCHIVES
    assert [split_of_name(n) for n in ("val2", "images", "n01440764", "train.zip")] == [None] * 4


@pytest.mark.parametrize(("name", "split"), [
    ("validation-00013-of-00014.parquet", "val"), ("test_images.tar.gz", "test"),
    ("my-val-images.tar.gz", "val"), ("imagenet-test.parquet", "test"),
    ("imagenet.parquet", "train"), ("valtest.tar.gz", "test"),
])
def test_a_file_given_alone_is_the_split_its_name_says(name: str, split: str) -> None:
    assert file_split(name) == split
