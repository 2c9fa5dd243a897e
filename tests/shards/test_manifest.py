"""The manifest read back: its ``options`` and ``source`` as the typed records convert wrote
(``imgprep.sections``), byte for byte again when written; a manifest without a field reads
with the record's default; a field of the wrong type or value is refused naming it. The
``labelled`` field: a split converted without labels says so; manifests written before the
field existed read as labelled."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from imgprep.errors import ManifestError
from imgprep.sections import (
    SPLITS,
    Holdout,
    ManifestOptions,
    SourceSection,
    TransformOptions,
)
from imgprep.shards.manifest import Manifest, parse_manifest, read_manifest, write_manifest
from tests.support import REPO


def manifest(**kw: Any) -> Manifest:
    return Manifest(split="test", format="list", total_samples=0, classes=[["n01440764", "t"]],
                    mean=[0.0] * 3, std=[0.0] * 3,
                    options=ManifestOptions(format="list", split="test"), tool_version="t", **kw)


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


@pytest.mark.parametrize("fmt", ["shards", "list"])
def test_a_converted_manifest_reads_typed_and_writes_back_byte_for_byte(
        converted: dict[str, Path], tmp_path: Path, fmt: str) -> None:
    path = converted[fmt] / "train.json"
    m = read_manifest(path)
    assert isinstance(m.options, ManifestOptions) and isinstance(m.source, SourceSection)
    assert (m.options.format, m.options.split) == (fmt, "train")
    assert m.options.transform == TransformOptions() and m.options.fingerprint is not None
    assert m.source.images == m.total_samples and m.stats_images > 0
    assert write_manifest(tmp_path, m).read_bytes() == path.read_bytes()


def test_the_holdout_sits_flat_in_the_options_and_reads_back() -> None:
    held = Holdout(per_class=2, seed=5, images=12, counts_sha256="c" * 64)
    opts = ManifestOptions(format="shards", split="val", holdout=held, fingerprint="f" * 64)
    d = opts.to_json()
    assert {k for k in d if k.startswith("holdout")} == {
        "holdout_per_class", "holdout_seed", "holdout_images", "holdout_counts_sha256"}
    assert ManifestOptions.from_json(d, "m.json", fmt="list", split="train") == opts
    assert "fingerprint" not in replace(opts, fingerprint=None).to_json()


def test_a_manifest_without_its_sections_reads_with_the_records_defaults(tmp_path: Path) -> None:
    d = manifest().to_json()
    d["options"], d["source"] = {}, {}
    del d["stats_images"]
    m = parse_manifest(d, "old.json")
    assert m.options == ManifestOptions(format="list", split="test")
    assert m.options.transform == TransformOptions() and m.source is None and m.stats_images == 0
    partial = {**d, "options": {"seed": 3, "transform": {"size": 128}},
               "source": {"kind": "tar", "name": "a.tar", "images": 4}}
    m = parse_manifest(partial, "old.json")
    assert m.options.seed == 3 and m.options.transform == TransformOptions(size=128)
    assert m.source == SourceSection(kind="tar", name="a.tar", images=4, skipped_non_images=0)
    assert json.loads(write_manifest(tmp_path, m).read_text())["options"]["transform"] == \
        TransformOptions(size=128).to_json()


@pytest.mark.parametrize(("where", "value", "said"), [
    ("options", {"seed": "0"}, "options: field 'seed' has the wrong type"),
    ("options", {"num_shards": 0}, "options: num_shards must be an integer 1 or more"),
    ("options", {"split": "holdout"}, "options: split must be one of"),
    ("options", {"transform": {"size": 3}}, "options: transform: size must be an integer"),
    ("options", {"transform": {"exif_transpose": 1}}, "field 'exif_transpose' has the wrong"),
    ("options", {"holdout_per_class": 2}, "options: field 'holdout_seed' is missing"),
    ("options", [], "options' has the wrong type"),
    ("source", {"kind": "tar", "name": "a", "images": -1}, "source: images must be"),
    ("source", {"kind": "tar", "images": 1}, "source: field 'name' is missing"),
    ("source", "a.tar", "source: not a JSON object"),
    ("mean", [0.5, 0.5], "field 'mean' must be three numbers"),
    ("std", [0.2, 0.2, True], "field 'std' must be three numbers"),
])
def test_a_section_field_of_the_wrong_type_or_value_is_refused_naming_it(
        where: str, value: object, said: str) -> None:
    d = {**manifest().to_json(), where: value}
    with pytest.raises(ManifestError, match=r"^old\.json: .*" + re.escape(said)):
        parse_manifest(d, "old.json")


def test_no_module_reads_a_manifest_section_by_key() -> None:
    """Sections are read as the records they are, never ``options["…"]``/``source["…"]``."""
    by_key = re.compile(r"""\b(options|source)\[["']""")
    found = [f"{p.relative_to(REPO)}:{n}" for top in ("imgprep", "loaders", "scripts")
             for p in sorted((REPO / top).rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if by_key.search(line)]
    assert found == []
