"""Hypothesis fuzzing: ground-truth parsers and the manifest reader raise only our own errors
(one-line messages), never a bare KeyError/IndexError/TypeError and its traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgprep.errors import ImgprepError
from imgprep.inputs.groundtruth import load_ground_truth
from imgprep.inputs.synsets import imagenet_classes
from imgprep.shards.manifest import parse_manifest

CLASSES = imagenet_classes()
FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
WNIDS = [*CLASSES.wnids[:4], "n99999999", "nXX", ""]

LINES = st.one_of(
    st.text(max_size=40),
    st.integers(-5, 1200).map(str),
    st.sampled_from(WNIDS),
    st.tuples(st.sampled_from(["ILSVRC2012_val_00000001.JPEG", "a b", "x.JPEG"]),
              st.integers(-3, 1003)).map(lambda t: f"{t[0]} {t[1]}"),
    st.tuples(st.sampled_from(WNIDS), st.integers(-1, 1001)).map(lambda t: f"{t[0]} {t[1]} n"),
    st.tuples(st.integers(0, 9), st.sampled_from(WNIDS)).map(
        lambda t: f"ILSVRC2012_val_{t[0]:08d},{t[1]} 1 2 3 4"),
    st.just("ImageId,PredictionString"),
)


@FUZZ
@given(first=st.lists(LINES, max_size=8), second=st.lists(LINES, max_size=5),
       both=st.booleans())
def test_ground_truth_parsers(tmp_path: Path, first: list[str], second: list[str],
                              both: bool) -> None:
    paths = [tmp_path / "a.txt"]
    paths[0].write_bytes("\n".join(first).encode("utf-8", "surrogatepass"))
    if both:
        paths.append(tmp_path / "b.txt")
        paths[1].write_bytes("\n".join(second).encode("utf-8", "surrogatepass"))
    try:
        truth = load_ground_truth(paths, CLASSES)
    except ImgprepError as e:
        assert "\n" not in str(e)
    else:
        assert all(CLASSES.index(w) is not None for w in truth.values())


FIELDS = ["name", "samples", "bytes", "sha256", "format_version", "format", "shards",
          "total_samples", "classes", "split", "mean", "std", "options", "tool_version",
          "errors", "node"]
JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2, 3), st.floats(allow_nan=False),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(FIELDS), inner, max_size=6)),
    max_leaves=20)
GOOD: dict[str, Any] = {
    "format_version": 1, "format": "shards", "split": "train", "total_samples": 1,
    "classes": [["n01440764", "tench"]], "mean": [0.5] * 3, "std": [0.2] * 3, "options": {},
    "tool_version": "t", "errors": 0,
    "shards": [{"name": "train-000000.tar", "samples": 1, "bytes": 10, "sha256": "a" * 64}]}


def test_the_good_manifest_parses() -> None:
    assert parse_manifest(GOOD, "m.json").total_samples == 1


@FUZZ
@given(patch=st.dictionaries(st.sampled_from(list(GOOD)), JSONISH, max_size=5), whole=JSONISH)
def test_manifest_reader(patch: dict[str, Any], whole: Any) -> None:
    for doc in ({**GOOD, **patch}, whole):
        try:
            parse_manifest(doc, "m.json")
        except ImgprepError as e:
            assert "m.json" in str(e)


@pytest.mark.parametrize("text", ["", "{", "[]", '{"format_version": 2}', "null"])
def test_unreadable_manifests_name_the_file(tmp_path: Path, text: str) -> None:
    from imgprep.errors import ManifestError
    from imgprep.shards.manifest import read_manifest

    (tmp_path / "train.json").write_text(text)
    with pytest.raises(ManifestError, match="train.json"):
        read_manifest(tmp_path, "train")
