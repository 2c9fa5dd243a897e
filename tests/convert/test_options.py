"""Convert's options and records: built by keyword only, checked when built, and the one
home of the command line's choices and defaults; error records keep the error log's format."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import click
import pytest

from imgprep.cli.commands import cli
from imgprep.convert.errorlog import ErrorRecord, error_log_path, write_error_log
from imgprep.convert.options import OUTPUT_FORMATS, RANK_MODES, ConvertOptions
from imgprep.sections import FILTER_NAMES, RESIZE_MODES, TransformOptions


def test_options_are_built_by_keyword_only(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        TransformOptions(256)  # type: ignore[misc]
    with pytest.raises(TypeError):
        ConvertOptions(tmp_path, tmp_path / "out")  # type: ignore[misc]
    assert TransformOptions(size=128).size == 128


@pytest.mark.parametrize(("bad", "word"), [
    ({"size": 4}, "size"), ({"size": 5000}, "size"), ({"resize": "stretch"}, "resize"),
    ({"filter": "nearest"}, "filter"), ({"quality": 0}, "quality"),
    ({"quality": 101}, "quality"), ({"max_pixels": 0}, "max_pixels"), ({"size": True}, "size"),
])
def test_a_bad_transform_option_is_refused_naming_it(bad: dict[str, Any], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        TransformOptions(**bad)


@pytest.mark.parametrize(("bad", "word"), [
    ({"format": "zip"}, "format"), ({"mode": "replicate"}, "mode"), ({"split": "holdout"}, "split"),
    ({"shard_size": 0}, "shard_size"), ({"num_shards": 0}, "num_shards"),
    ({"workers": 0}, "workers"), ({"max_errors": -1}, "max_errors"),
    ({"wait_timeout": 0.0}, "wait_timeout"), ({"transform": {"size": 64}}, "transform"),
])
def test_a_bad_convert_option_is_refused_naming_it(tmp_path: Path, bad: dict[str, Any],
                                                   word: str) -> None:
    with pytest.raises(ValueError, match=word):
        ConvertOptions(input=tmp_path, out=tmp_path / "out", **bad)


def _params(name: str) -> dict[str, click.Parameter]:
    return {str(p.name): p for p in cli.commands[name].params}


def test_convert_takes_its_choices_and_defaults_from_the_options() -> None:
    params = _params("convert")
    choices = {"fmt": OUTPUT_FORMATS, "resize": RESIZE_MODES, "filt": FILTER_NAMES,
               "rank_mode": RANK_MODES}
    for name, want in choices.items():
        kind = params[name].type
        assert isinstance(kind, click.Choice) and tuple(kind.choices) == want, name
    transform = TransformOptions()
    opts = ConvertOptions(input=Path("in"), out=Path("out"))
    owners = {"size": (transform, "size"), "resize": (transform, "resize"),
              "filt": (transform, "filter"), "quality": (transform, "quality"),
              "max_pixels": (transform, "max_pixels"),
              "exif_transpose": (transform, "exif_transpose"), "fmt": (opts, "format"),
              "shard_size": (opts, "shard_size"), "num_shards": (opts, "num_shards"),
              "seed": (opts, "seed"), "meta": (opts, "meta"), "max_errors": (opts, "max_errors"),
              "rank_mode": (opts, "mode"), "wait_timeout": (opts, "wait_timeout")}
    assert {attr for owner, attr in owners.values() if owner is transform} == {
        f.name for f in fields(TransformOptions)}
    for param, (owner, attr) in owners.items():
        assert params[param].default == getattr(owner, attr), param


def test_error_records_round_trip_and_junk_is_refused() -> None:
    e = ErrorRecord(source="/in/a.tar/n1_1.JPEG", key="n1_1", reason="truncated image data")
    assert ErrorRecord.from_json(json.loads(json.dumps(e.to_json()))) == e
    for junk in ([], {"source": "a", "key": "b"}, {"source": "a", "key": "b", "reason": 3},
                 {"source": "a", "key": "b", "reason": "c", "extra": "d"}):
        with pytest.raises(ValueError):
            ErrorRecord.from_json(junk)


def test_the_error_log_is_one_sorted_json_object_a_line(tmp_path: Path) -> None:
    path = error_log_path(tmp_path, "train")
    errors = [ErrorRecord(source="/in/é.JPEG", key="n1_1", reason="empty file (0 bytes)"),
              ErrorRecord(source="/in", key="", reason="link refused")]
    assert write_error_log(path, errors) == path and path.name == "train-errors.jsonl"
    assert path.read_text("utf-8") == (
        '{"key": "n1_1", "reason": "empty file (0 bytes)", "source": "/in/é.JPEG"}\n'
        '{"key": "", "reason": "link refused", "source": "/in"}\n')
    assert write_error_log(path, []) is None and not path.exists()  # a stale log goes
