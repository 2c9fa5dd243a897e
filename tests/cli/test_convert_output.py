"""What ``imgprep convert`` prints besides its files: the ``--json`` summary, whose keys
users parse (one a field of ``ConvertSummary``), and the library's warnings and notes, which
the command prints on stderr (``--quiet`` keeps the warnings and drops the notes)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import asdict, fields
from pathlib import Path

import pytest

from imgprep.cli.logs import configure_logging
from imgprep.convert.options import ConvertOptions
from imgprep.convert.run import convert
from imgprep.convert.summary import ConvertSummary
from imgprep.inputs.synsets import imagenet_classes
from tests.support.cli import invoke, jpeg_tree, ok

# The keys of one split's --json summary, as users and scripts read them: renaming, adding or
# dropping one is a change of the command's output.
SUMMARY_KEYS = {
    "complete", "role", "rank", "world_size", "node_rank", "mode", "split", "format", "input",
    "input_kind", "images_listed", "samples", "errors", "max_errors", "unknown_wnids",
    "label_source", "label_check", "label_check_names", "expected_images", "missing_images",
    "missing_first", "skipped_non_images", "tasks", "tasks_mine",
    "tasks_resumed", "bytes", "seconds", "images_per_s", "workers", "out", "manifest",
    "error_log", "warnings", "warning_log",
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    wnids = imagenet_classes().wnids[:2]
    return jpeg_tree(tmp_path / "train", {f"{w}/{w}_{i}.JPEG": 10 * k + i
                                          for k, w in enumerate(wnids) for i in range(3)})


def test_the_json_summary_has_the_keys_users_parse(tree: Path, tmp_path: Path) -> None:
    assert {f.name for f in fields(ConvertSummary)} == SUMMARY_KEYS
    s = ok(invoke("convert", tree, "-o", tmp_path / "cli", "--size", "16", "-j", "1", "-q",
                  "--json"))
    assert set(s) == SUMMARY_KEYS
    assert (s["complete"], s["role"], s["samples"], s["errors"], s["error_log"], s["warnings"],
            s["warning_log"]) == (True, "finaliser", 6, 0, None, 0, None)
    assert s["manifest"] == str(tmp_path / "cli" / "train.json")
    lib = asdict(convert(ConvertOptions(input=tree, out=tmp_path / "lib", workers=1)))
    timing = {"seconds", "images_per_s", "out", "manifest", "bytes"}
    assert {k: v for k, v in lib.items() if k not in timing} == {
        k: v for k, v in s.items() if k not in timing}


def test_library_warnings_print_on_stderr_and_quiet_drops_only_notes(
        capsys: pytest.CaptureFixture[str]) -> None:
    log = logging.getLogger("imgprep.convert.run")
    for quiet in (False, True, False):  # set up again by each command: one line each
        configure_logging(quiet)
        log.warning("a warning")
        log.info("a note")
        log.debug("a detail")
        err = capsys.readouterr().err
        want = ["imgprep: warning: a warning"] + ([] if quiet else ["imgprep: a note"])
        assert err.splitlines() == want


def test_the_library_leaves_logging_to_the_application() -> None:
    code = ("import logging, imgprep.convert.run, imgprep.stage.run; "
            "lib = logging.getLogger('imgprep'); "
            "print([type(h).__name__ for h in lib.handlers], lib.level, logging.root.handlers)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "['NullHandler'] 0 []"


def test_overwrite_is_said_as_a_warning_even_when_quiet(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    ok(invoke("convert", tree, "-o", out, "--size", "16", "-j", "1", "-q", "--json"))
    r = invoke("convert", tree, "-o", out, "--size", "24", "-j", "1", "-q", "--json",
               "--overwrite")
    assert json.loads(r.stdout)["complete"]
    (line,) = r.stderr.splitlines()
    assert line.startswith("imgprep: warning: --overwrite: removed the finished train split")
