"""Every ``imgprep`` command takes ``-q/--quiet`` and ``--json``, as the README and
docs/commands.md promise: checked on the click group itself, so a new command without them
fails here; and what the two flags do for the commands that had neither."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import click
import pytest

from imgprep.cli.commands import cli
from imgprep.convert.options import ConvertOptions
from imgprep.convert.run import convert
from tests.support.cli import invoke


def flag_options(command: click.Command) -> dict[str, click.Option]:
    """Each spelling of each flag option of ``command`` (``-q``, ``--quiet`` …)."""
    return {spelling: p for p in command.params if isinstance(p, click.Option) and p.is_flag
            for spelling in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_command_takes_quiet_and_json(name: str) -> None:
    flags = flag_options(cli.commands[name])
    assert "--quiet" in flags and "-q" in flags, f"imgprep {name} has no -q/--quiet"
    assert flags["-q"] is flags["--quiet"], f"imgprep {name}: -q is not short for --quiet"
    assert "--json" in flags, f"imgprep {name} has no --json"
    # the shared cliopts options, not look-alikes: one name each in every handler
    assert (flags["--quiet"].name, flags["--json"].name) == ("quiet", "as_json")
    help_text = invoke(name, "--help").stdout
    assert "--quiet" in help_text and "--json" in help_text


@pytest.fixture(scope="module")
def train_shards(sample: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("flags")
    convert(ConvertOptions(input=sample / "ILSVRC2012_img_train.tar", out=out, num_shards=2,
                           workers=1))
    return out


def test_preview_json_names_the_sheet_and_its_samples(train_shards: Path, tmp_path: Path) -> None:
    sheet = tmp_path / "sheet.png"
    r = invoke("preview", train_shards, "-o", sheet, "-n", 5, "--json")
    assert r.exit_code == 0, r.output
    (line,) = r.stdout.splitlines()
    s = json.loads(line)
    assert (s["output"], s["samples"], s["split"]) == (str(sheet), 5, "train")
    assert s["folder"] == str(train_shards)
    assert sheet.is_file() and r.stderr == ""


def test_preview_quiet_prints_nothing(train_shards: Path, tmp_path: Path) -> None:
    sheet = tmp_path / "sheet.png"
    r = invoke("preview", train_shards, "-o", sheet, "-n", 3, "-q")
    assert r.exit_code == 0, r.output
    assert (r.stdout, r.stderr) == ("", "")
    assert sheet.is_file()
    r = invoke("preview", train_shards, "-o", tmp_path / "x.png", "-q", "--split", "val")
    assert r.exit_code == 3 and r.stdout == ""  # errors still say why, on stderr
    assert r.stderr.startswith("imgprep: error: ") and "val.json" in r.stderr


def test_info_quiet_prints_nothing_but_a_strict_failure(
        train_shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = invoke("info", train_shards, "-q", "--strict")
    assert r.exit_code == 0, r.output
    assert (r.stdout, r.stderr) == ("", "")
    import imgprep.shards.info

    monkeypatch.setattr(imgprep.shards.info, "pil_warning", lambda info: "PIL is stock Pillow")
    r = invoke("info", "-q", "--strict")  # stock Pillow: the loader does not need it
    assert (r.exit_code, r.stdout, r.stderr) == (0, "", "")
    monkeypatch.setattr(imgprep.shards.info, "resampler_warning", lambda: "no resampler")
    r = invoke("info", "-q")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "", "")
    r = invoke("info", "-q", "--strict")
    assert (r.exit_code, r.stdout) == (1, "")
    assert r.stderr == "imgprep: error: no resampler\n"


def test_info_warns_of_stock_pillow_with_the_clis_warning_prefix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A wheel user's environment: stock Pillow and no pillow-simd. One warning line, in the
    form every command's warnings take (imgprep.cli.logs), that claims nothing replaced."""
    import imgprep.shards.info
    from imgprep.shards.info import pil_info

    stock = replace(pil_info(check_avx2=False), pil_version="13.0.0", pillow_simd=False,
                    stock_pillow_installed="13.0.0", pillow_simd_installed=None)
    monkeypatch.setattr(imgprep.shards.info, "pil_info", lambda check_avx2=True: stock)
    r = invoke("info")
    assert r.exit_code == 0, r.output
    (line,) = [ln for ln in r.stderr.splitlines() if "Pillow" in ln]
    assert line.startswith("imgprep: warning: PIL 13.0.0 is stock Pillow: ")
    assert "replaced" not in line and "WARNING" not in r.stderr
    r = invoke("info", "--strict")  # a warning, not a failure
    assert r.exit_code == 0 and "imgprep: warning: PIL 13.0.0 is stock Pillow" in r.stderr


def test_make_sample_quiet_prints_nothing(tmp_path: Path) -> None:
    r = invoke("make-sample", tmp_path / "fake", "--classes", 2, "--per-class", 1, "--val", 1,
               "-q")
    assert r.exit_code == 0, r.output
    assert (r.stdout, r.stderr) == ("", "")
    assert (tmp_path / "fake" / "ILSVRC2012_img_train.tar").is_file()
