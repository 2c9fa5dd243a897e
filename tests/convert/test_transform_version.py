"""The manifest records how the images were made (the transform version); a folder never mixes
two: converting or resuming into a split of the other version is refused, naming both, unless
``--overwrite``; a split of the older version still verifies and loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgprep import World
from imgprep.convert import native
from imgprep.convert.image import transform_version
from imgprep.convert.options import ConvertOptions
from imgprep.convert.run import convert
from imgprep.errors import OutputExistsError
from imgprep.shards.manifest import parse_manifest, read_manifest
from imgprep.shards.verify import verify
from loaders import LoaderOptions, make_loader
from tests.support import convert_sample

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="needs both versions: the C path "
                                "is not built (only version 1 runs here)")
TRAIN = "ILSVRC2012_img_train.tar"


@pytest.fixture
def version_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process converts as it would without the C extension."""
    monkeypatch.setattr(native, "AVAILABLE", False)


def _opts(sample: Path, out: Path, **kw: object) -> ConvertOptions:
    return ConvertOptions(input=sample / TRAIN, out=out, num_shards=2, workers=1, **kw)


def test_the_manifest_records_the_transform_version(sample: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert transform_version() == 2
    convert(_opts(sample, tmp_path / "v2"))
    assert read_manifest(tmp_path / "v2", "train").transform_version == 2
    assert json.loads((tmp_path / "v2" / "train.json").read_text())["transform_version"] == 2
    monkeypatch.setattr(native, "AVAILABLE", False)
    assert transform_version() == 1
    convert(_opts(sample, tmp_path / "v1"))
    assert read_manifest(tmp_path / "v1", "train").transform_version == 1


def test_a_manifest_written_before_versions_is_version_1(sample: Path, tmp_path: Path) -> None:
    convert(_opts(sample, tmp_path))
    d = json.loads((tmp_path / "train.json").read_text())
    del d["transform_version"]
    assert parse_manifest(d, "train.json").transform_version == 1


def test_a_finished_split_of_the_other_version_is_refused_naming_both(
        sample: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as mp:
        mp.setattr(native, "AVAILABLE", False)
        convert(_opts(sample, tmp_path))
    with pytest.raises(OutputExistsError) as info:
        convert(_opts(sample, tmp_path))
    assert "transform version 1" in str(info.value) and "transform version 2" in str(info.value)
    summary = convert(_opts(sample, tmp_path, overwrite=True))
    assert summary.complete and read_manifest(tmp_path, "train").transform_version == 2


def test_an_unfinished_split_of_the_other_version_is_not_resumed(
        sample: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its task records say which version began it; --overwrite starts it over."""
    convert(_opts(sample, tmp_path))
    (tmp_path / "train.json").unlink()  # as if killed before the manifest
    with monkeypatch.context() as mp:
        mp.setattr(native, "AVAILABLE", False)
        with pytest.raises(OutputExistsError) as info:
            convert(_opts(sample, tmp_path))
        message = str(info.value)
        assert "unfinished train split (2 tasks done)" in message
        assert "transform version 2" in message and "transform version 1" in message
        summary = convert(_opts(sample, tmp_path, overwrite=True))
    assert summary.complete and summary.tasks_resumed == 0
    assert read_manifest(tmp_path, "train").transform_version == 1
    records = (tmp_path / ".imgprep" / "train").glob("*.json")
    assert {json.loads(p.read_text())["transform_version"] for p in records} == {1}


def test_a_split_of_the_same_version_resumes(sample: Path, tmp_path: Path) -> None:
    convert(_opts(sample, tmp_path))
    (tmp_path / "train.json").unlink()
    assert convert(_opts(sample, tmp_path)).tasks_resumed == 2


def test_a_version_1_split_verifies_and_loads(sample: Path, tmp_path: Path,
                                             version_1: None) -> None:
    convert_sample(sample, tmp_path, train_shards=2)
    assert read_manifest(tmp_path, "train").transform_version == 1
    report = verify(tmp_path, decode=True)
    assert report.ok, report.problems
    loader = make_loader(tmp_path, "train", World.single(),
                         LoaderOptions(batch_size=4, workers=0, seed=0))
    assert sum(1 for _ in loader) == loader.batches_per_epoch > 0
