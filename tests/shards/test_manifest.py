"""The manifest's ``labelled`` field: a split converted without labels says so; manifests
written before the field existed read as labelled; a field of the wrong type is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imgprep.errors import ManifestError
from imgprep.shards.manifest import SPLITS, Manifest, parse_manifest, read_manifest, write_manifest


def manifest(**kw: Any) -> Manifest:
    return Manifest(split="test", format="list", total_samples=0, classes=[["n01440764", "t"]],
                    mean=[0.0] * 3, std=[0.0] * 3, options={}, tool_version="t", **kw)


def test_the_test_split_is_a_split_imgprep_writes() -> None:
    assert SPLITS == ("train", "val", "test")


@pytest.mark.parametrize("labelled", [True, False])
def test_labelled_round_trips(tmp_path: Path, labelled: bool) -> None:
    path = write_manifest(tmp_path, manifest(labelled=labelled))
    assert json.loads(path.read_text())["labelled"] is labelled
    assert read_manifest(path).labelled is labelled


def test_a_manifest_without_the_field_is_labelled(tmp_path: Path) -> None:
    d = manifest(labelled=False).to_json()
    del d["labelled"]
    assert parse_manifest(d, "old.json").labelled is True


def test_a_labelled_field_of_the_wrong_type_is_refused() -> None:
    d = {**manifest().to_json(), "labelled": "no"}
    with pytest.raises(ManifestError, match=r"old.json: field 'labelled' has the wrong type"):
        parse_manifest(d, "old.json")
