"""Hugging Face ``datasets``' stock ``webdataset`` builder over stored-pixel shards: a set
stored one way reads with the records as bytes (their extension is no image format it
decodes), and a mixed set, whose samples differ in members, is refused by the builder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from imgprep import jpegcrop
from imgprep.rawformat import read_header
from imgprep.shards.manifest import read_manifest
from tests.support.rawstore import stored_sets
from tests.support.shards import tar_samples

pytestmark = pytest.mark.skipif(not jpegcrop.AVAILABLE, reason="stored pixels need the "
                                "extension")


def load(hf: Any, folder: Path, cache: Path) -> Any:
    shards = [str(folder / s.name) for s in read_manifest(folder, "train").shards]
    return hf.load_dataset("webdataset", data_files={"train": shards}, split="train",
                           cache_dir=str(cache))


@pytest.mark.slow
def test_stored_sets_read_as_bytes_and_a_mixed_one_is_refused(
        hf_datasets: Any, converted: dict[str, Path], tmp_path: Path) -> None:
    sets = stored_sets(converted["shards"], tmp_path / "sets", ("yuv420", "mixed"))
    ds = load(hf_datasets, sets["yuv420"], tmp_path / "c1")
    want = {key: fields for _, key, fields in tar_samples(sets["yuv420"])}
    assert len(ds) == len(want)
    for row in ds:
        assert row["yuv420"] == want[row["__key__"]]["yuv420"]
        assert read_header(row["yuv420"]).kind.name == "yuv420"
    with pytest.raises(ValueError, match="same types"):
        load(hf_datasets, sets["mixed"], tmp_path / "c2")
