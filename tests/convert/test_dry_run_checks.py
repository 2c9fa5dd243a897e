"""A dry run refuses what the run refuses, with the same message, for the forms that need a
staging copy too (the Hub's parquet files and tar.gz archives), and says in plain text what
the run would log as errors and the ``--max-errors`` it would need."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgprep.inputs.fakes import FakeSummary, SampleSpec, make_fake
from imgprep.inputs.synsets import imagenet_classes
from tests.support.cli import invoke, jpeg_tree, ok
from tests.support.images import jpeg
from tests.support.procs import one_line_error

SPEC = SampleSpec(classes=3, per_class=5, val=8, seed=5, test=3)
CLASSES = imagenet_classes()
SMALL = ("--size", "16", "-j", "1")


@pytest.fixture(scope="module")
def targz(tmp_path_factory: pytest.TempPathFactory) -> FakeSummary:
    return make_fake("hf-targz", tmp_path_factory.mktemp("forms") / "hf-targz", SPEC)


def _both_refuse(src: Path, out: Path, *names: object) -> str:
    """The dry run and the run of ``src`` each exit 3 with the same one-line error naming
    ``names``; nothing is written."""
    lines = [one_line_error(invoke("convert", src, "-o", out, *SMALL, *extra), 3, *names)
             for extra in (("--dry-run",), ())]
    assert lines[0] == lines[1] and not out.exists()
    return lines[0]


def _parquet(tmp_path: Path, rows: list[tuple[str, int]]) -> Path:
    pytest.importorskip("pyarrow")
    from imgprep.inputs.fakes.parquet import hub_class_names, write_split

    data = [(path, jpeg((32, 24), seed=i), label) for i, (path, label) in enumerate(rows)]
    (path,) = write_split(tmp_path / "in", "train", data, hub_class_names(CLASSES), files=1)
    return path


def _train_rows(n: int) -> list[tuple[str, int]]:
    return [(f"{CLASSES.wnids[c]}_{100 + c}_{CLASSES.wnids[c]}.JPEG", c) for c in range(n)]


@pytest.mark.parametrize("label", [1000, -1])
def test_a_parquet_label_outside_the_classes_is_refused_by_the_dry_run(
        tmp_path: Path, label: int) -> None:
    rows = _train_rows(6)
    rows[4] = (rows[4][0], label)
    src = _parquet(tmp_path, rows)
    _both_refuse(src, tmp_path / "out", src, str(label))


def test_a_parquet_label_that_disagrees_with_its_path_is_refused_by_the_dry_run(
        tmp_path: Path) -> None:
    rows = _train_rows(6)
    rows[2] = (rows[2][0], 7)
    src = _parquet(tmp_path, rows)
    _both_refuse(src, tmp_path / "out", src, "1 rows whose label is another class than the "
                 f"wnid their image.path ends in (row 2 ({rows[2][0]}: label 7")


@pytest.mark.parametrize("damage", ["truncated", "bad-crc"])
def test_a_damaged_tar_gz_is_refused_by_the_dry_run(targz: FakeSummary, tmp_path: Path,
                                                     damage: str) -> None:
    data = bytearray((Path(targz.out) / "data" / "val_images.tar.gz").read_bytes())
    if damage == "bad-crc":
        data[-8] ^= 0xFF  # the gzip trailer's CRC-32 of the whole stream
    else:
        data = data[: len(data) * 2 // 3]
    src = tmp_path / "val_images.tar.gz"
    src.write_bytes(bytes(data))
    why = "CRC check failed" if damage == "bad-crc" else "ended before the end-of-stream"
    _both_refuse(src, tmp_path / "out", src, "the compressed stream is damaged or cut short",
                 why, "re-download it")


def test_a_whole_tar_gz_is_counted_by_the_dry_run(targz: FakeSummary, tmp_path: Path) -> None:
    src = Path(targz.out) / "data" / "val_images.tar.gz"
    rep = ok(invoke("convert", src, "-o", tmp_path / "out", "--dry-run", "--json"))
    (val,) = rep["splits"]
    assert (val["split"], val["images"], val["label_check"]) == ("val", SPEC.val, "canonical")
    assert val["spool_bytes"] == src.stat().st_size and not (tmp_path / "out").exists()


def test_the_plain_dry_run_states_unknown_classes_and_the_max_errors_needed(
        tmp_path: Path) -> None:
    files = {f"n01440764_{i}.JPEG": i for i in range(4)}
    files |= {f"n99999999_{i}.JPEG": 10 + i for i in range(3)}
    src = jpeg_tree(tmp_path / "flat", files)
    r = invoke("convert", src, "-o", tmp_path / "out", "--dry-run")
    assert r.exit_code == 0, r.output
    assert ("  errors: 3 images named with wnids outside the class table, each logged as an "
            "error; the run would fail: it needs --max-errors 3 (now 0), or --classes with a "
            "table that has them") in r.stdout.splitlines()
    r = invoke("convert", src, "-o", tmp_path / "out", "--dry-run", "--max-errors", "3")
    assert "within --max-errors 3" in r.stdout
    assert invoke("convert", src, "-o", tmp_path / "out", *SMALL).exit_code == 1


def test_split_test_converts_the_test_parquet_without_saying_it_is_not_converted(
        tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    fake = make_fake("hf-parquet", tmp_path / "hf", SPEC)
    r = invoke("convert", fake.inputs[0], "-o", tmp_path / "out", "--split", "test", *SMALL)
    assert r.exit_code == 0, r.output
    assert "not converted" not in r.stderr and "test: 3 samples" in r.stdout
    r = invoke("convert", fake.inputs[0], "-o", tmp_path / "out", "--split", "test",
               "--dry-run", "--json")
    assert json.loads(r.stdout)["skipped"] == []
    r = invoke("convert", fake.inputs[0], "-o", tmp_path / "dry", "--dry-run", "--json")
    assert [s.split(": ", 1)[1] for s in json.loads(r.stdout)["skipped"]] == [
        "3 images without labels; --split test converts them as an unlabelled split"]
