"""What a manifest says of where its split came from: labels no name can check are refused
unless taken as given on purpose (``--trust-labels``, recorded); images a ground truth lists
that the input lacks are reported by the run and its dry run, recorded, and said by
``verify``; a no-op rerun from another form leaves the recorded source as it was."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from imgprep.inputs.fakes import SampleSpec, make_fake
from imgprep.inputs.synsets import imagenet_classes
from imgprep.shards.manifest import read_manifest
from tests.support.cli import invoke, ok
from tests.support.images import jpeg
from tests.support.procs import one_line_error

SPEC = SampleSpec(classes=3, per_class=2, val=8, test=2, seed=7)  # the runs convert val
CLASSES = imagenet_classes()
SMALL = ("--size", "16", "-j", "1", "--shards", "1")
ZIP = "imagenet-object-localization-challenge.zip"


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The Kaggle zip and the tree it extracts to."""
    root = tmp_path_factory.mktemp("forms")
    make_fake("kaggle-zip", root / "kaggle-zip", SPEC)
    with zipfile.ZipFile(root / "kaggle-zip" / ZIP) as zf:
        zf.extractall(root / "kaggle")
    return {form: root / form for form in ("kaggle", "kaggle-zip")}


# ------------------------------------------------------------ labels no name can check


def _unnamed_parquet(tmp_path: Path) -> Path:
    """A Hub-schema train parquet file whose ``image.path`` is null in every row, its
    labels all shifted by one class."""
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    from imgprep.inputs.fakes.parquet import hub_class_names, hub_metadata

    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("image", image), ("label", pa.int64())],
                       metadata={b"huggingface": hub_metadata(hub_class_names(CLASSES))})
    table = pa.table({"image": pa.array([{"bytes": jpeg((32, 24), seed=i), "path": None}
                                         for i in range(5)], type=image),
                      "label": pa.array([i + 1 for i in range(5)], type=pa.int64())},
                     schema=schema)
    path = tmp_path / "in" / "train-00000-of-00001.parquet"
    path.parent.mkdir()
    pq.write_table(table, path, row_group_size=2)
    return path


def test_parquet_rows_without_a_path_are_refused_unless_trusted(tmp_path: Path) -> None:
    src, out = _unnamed_parquet(tmp_path), tmp_path / "out"
    for extra in (("--dry-run",), ()):
        one_line_error(invoke("convert", src, "-o", out, *SMALL, *extra), 3,
                       f"{src}: 5 of 5 rows have no image.path", "(rows 0, 1, 2 …)",
                       "cannot be checked against a file name",
                       "--trust-labels to accept the labels as given")
    assert not out.exists()
    dry = ok(invoke("convert", src, "-o", out, "--dry-run", "--json", "--trust-labels"))
    assert dry["splits"][0]["label_check"] == "trusted"
    s = ok(invoke("convert", src, "-o", out, "--json", "--trust-labels", *SMALL))
    assert (s["label_source"], s["label_check"], s["samples"]) == ("input", "trusted", 5)
    source = read_manifest(out, "train").source
    assert source is not None and source.label_check == "trusted"
    r = invoke("verify", out, "--no-decode", "--json")
    assert r.exit_code == 0, r.output
    note = ("train: its labels were taken as given (--trust-labels), not checked against the "
            "published labels or the images' names")
    assert json.loads(r.stdout)["notes"] == [note]
    assert json.loads(invoke("info", out, "--json").stdout)["notes"] == [note]
    assert f"note: {note}" in invoke("info", out).stdout.splitlines()


# ------------------------------------------------------------ images the ground truth lists


def test_validation_images_missing_from_the_input_are_reported_and_recorded(
        fakes: dict[str, Path], tmp_path: Path) -> None:
    tree = tmp_path / "kaggle"
    shutil.copytree(fakes["kaggle"], tree)
    val = sorted((tree / "ILSVRC" / "Data" / "CLS-LOC" / "val").iterdir())
    gone = [p.stem for p in val[1:3]]
    for p in val[1:3]:
        p.unlink()
    out = tmp_path / "out"
    want = (f"the ground truth lists 8 images and 2 of them are not in the input, so not "
            f"converted ({gone[0]}; {gone[1]}); if they should be there, the download or "
            "extraction is incomplete: fetch them and rerun")
    dry = ok(invoke("convert", tree, "-o", out, "--split", "val", "--dry-run", "--json"))
    (split,) = dry["splits"]
    assert (split["expected_images"], split["missing_images"], split["missing_first"]) == (
        8, 2, gone) and split["images"] == 6
    text = invoke("convert", tree, "-o", out, "--split", "val", "--dry-run")
    assert f"  missing: {want}" in text.stdout.splitlines() and not out.exists()
    s = ok(invoke("convert", tree, "-o", out, "--split", "val", "--json", *SMALL))
    assert (s["expected_images"], s["missing_images"], s["missing_first"], s["samples"]) == (
        8, 2, gone, 6)
    source = read_manifest(out, "val").source
    assert source is not None and (source.expected, source.missing, source.images) == (8, 2, 6)
    assert source.missing_first == ", ".join(gone)
    shutil.rmtree(out)
    text = invoke("convert", tree, "-o", out, "--split", "val", *SMALL)
    assert text.exit_code == 0 and f"missing: {want}" in text.stdout.splitlines()


def test_images_missing_from_the_input_are_said_once_by_convert_not_by_verify_or_info(
        fakes: dict[str, Path], tmp_path: Path) -> None:
    """The run that can act on it says it; the commands that read the result do not repeat
    it: verify not at all, info as one plain fact of the manifest, not a note."""
    tree = tmp_path / "kaggle"
    shutil.copytree(fakes["kaggle"], tree)
    for p in sorted((tree / "ILSVRC" / "Data" / "CLS-LOC" / "val").iterdir())[1:3]:
        p.unlink()
    out = tmp_path / "out"
    said = invoke("convert", tree, "-o", out, "--split", "val", *SMALL)
    assert said.exit_code == 0, said.output
    assert [ln for ln in said.output.splitlines() if "not in the input" in ln] == [
        ln for ln in said.stdout.splitlines() if ln.startswith("missing: the ground truth")]
    for args in (("verify", out, "--no-decode"), ("verify", out, "-q"), ("info", out)):
        r = invoke(*args)
        assert r.exit_code == 0, r.output
        assert "not in the input" not in r.stderr and "note:" not in r.output, args
        assert "fetch them and rerun" not in r.output, args
    assert json.loads(invoke("verify", out, "--json").stdout)["notes"] == []
    shown = [ln for ln in invoke("info", out).stdout.splitlines() if "ground truth" in ln]
    assert shown == ["  ground truth: 8 images listed, 2 of them not in the input (not "
                     "converted)"]
    info = json.loads(invoke("info", out, "--json").stdout)
    assert info["notes"] == []
    assert [(m["expected_images"], m["missing_images"]) for m in info["manifests"]] == [(8, 2)]


def test_a_whole_input_reports_nothing_missing(fakes: dict[str, Path], tmp_path: Path) -> None:
    s = ok(invoke("convert", fakes["kaggle"], "-o", tmp_path / "out", "--split", "val",
                  "--json", *SMALL))
    assert (s["expected_images"], s["missing_images"], s["missing_first"]) == (8, 0, [])
    r = invoke("verify", tmp_path / "out", "--no-decode", "--json")
    assert json.loads(r.stdout)["notes"] == []


# ------------------------------------------------------------ provenance of a no-op rerun


def test_a_no_op_rerun_from_another_form_keeps_the_recorded_source(
        fakes: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    ok(invoke("convert", fakes["kaggle-zip"] / ZIP, "-o", out, "--split", "val", "--json",
              *SMALL))
    before = (out / "val.json").read_bytes()
    s = ok(invoke("convert", fakes["kaggle"], "-o", out, "--split", "val", "--json", *SMALL))
    assert s["tasks_resumed"] == s["tasks"] == 1  # the same conversion: nothing redone
    source = read_manifest(out, "val").source
    assert source is not None and source.kind == "zip" and source.name == ZIP
    assert (out / "val.json").read_bytes() == before
