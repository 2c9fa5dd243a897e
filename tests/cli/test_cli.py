"""End-to-end tests of the ``imgprep`` command line: resume after a kill, bad input, error
messages and exit codes, and the companion commands (verify, info, preview, make-sample).

Exit codes: 0 success, 1 finished with failures, 2 usage error, 3 could not run, 130 Ctrl-C.
Fast cases run the click command in-process (``CliRunner``); kill and signal tests run
``python -m imgprep`` as a real subprocess, always with a timeout.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import Result
from PIL import Image

from imgprep import __version__, jpegcrop
from imgprep.convert.image import transform_version
from imgprep.inputs.synsets import imagenet_classes
from imgprep.shards.info import loader_path
from imgprep.shards.manifest import read_manifest
from tests.support import (
    encode,
    interruptible,
    jpeg,
    nested_images,
    one_line_error,
    photo,
    published_label,
    published_val_txt,
    tar_bytes,
    tmp_leftovers,
    write_tar,
)
from tests.support.cli import invoke

CLASSES = imagenet_classes()
TIMEOUT = 120


# ---------------------------------------------------------------------------- helpers



def summary_of(r: Result) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def convert_ok(src: Path, out: Path, *extra: object, workers: int = 2) -> dict[str, Any]:
    r = invoke("convert", src, "-o", out, "-j", workers, "-q", "--json", *extra)
    assert r.exit_code == 0, f"exit {r.exit_code}: {r.output}"
    return summary_of(r)


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def module_cmd(*args: object) -> list[str]:
    return [sys.executable, "-m", "imgprep", *(str(a) for a in args)]


def run_module(*args: object, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(module_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          check=False)


def read_errors(log: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in log.read_text("utf-8").splitlines()]


def undecodable(tar_path: Path) -> set[str]:
    """Stems of the images in a nested train tar that PIL cannot fully decode (independent)."""
    bad: set[str] = set()
    for stem, data in nested_images(tar_path):
        try:
            with Image.open(io.BytesIO(data)) as img:
                img.load()
        except Exception:  # any failure at all makes it a bad image
            bad.add(stem)
    return bad


# ---------------------------------------------------------------------------- resume after a kill


def _proc_children(pid: int) -> list[int]:
    """Live (non-zombie) processes whose parent is ``pid``."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            rest = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(rest) > 1 and rest[1] == str(pid) and rest[0] != "Z":
            kids.append(int(stat.parent.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def finished_records(state: Path) -> int:
    """Task records under ``<out>/.imgprep/<split>/`` (not the ``.tmp-`` ones being written)."""
    return sum(1 for p in state.glob("*/*.json") if not p.name.startswith("."))


@dataclass
class Kill:
    killed: bool
    records_before: int
    at: float


def run_and_kill(args: Sequence[object], state: Path, trigger: str, delay: float,
                 sig: signal.Signals = signal.SIGKILL) -> tuple[Kill, subprocess.Popen[bytes]]:
    """Start ``imgprep convert``; send ``sig`` once a task record exists or after ``delay``."""
    proc = subprocess.Popen(module_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=interruptible)
    t0 = time.monotonic()
    try:
        while proc.poll() is None:
            elapsed = time.monotonic() - t0
            if trigger == "first-record" and finished_records(state):
                break
            if trigger == "delay" and elapsed >= delay:
                break
            assert elapsed < TIMEOUT, "convert did not finish nor write a record in time"
            time.sleep(0.002)
        kids = _proc_children(proc.pid)
        records = finished_records(state)
        killed = proc.poll() is None
        if killed:
            proc.send_signal(sig)
        proc.wait(timeout=30)
        # PR_SET_PDEATHSIG: the workers die with their parent; give them a moment to go.
        deadline = time.monotonic() + 10
        while any(_alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.01)
        orphans = [k for k in kids if _alive(k)]
        for k in orphans:
            os.kill(k, signal.SIGKILL)
        assert not orphans, f"workers {orphans} outlived the killed convert"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    return Kill(killed, records, round(time.monotonic() - t0, 3)), proc


def kill_and_rerun(args: Sequence[object], out: Path, reference: Path
                   ) -> tuple[Kill, dict[str, Any]]:
    """``imgprep ARGS`` (a convert writing ``out``) killed once its first task is recorded,
    then run again: the rerun exits 0, leaves no temporary file and gives ``reference``'s
    bytes. The kill and the rerun's JSON summary."""
    kill, _ = run_and_kill(args, out / ".imgprep", "first-record", 0)
    where = f"kill at {kill.at}s: {kill}"
    rerun = run_module(*args)
    assert rerun.returncode == 0, f"{where}\n{rerun.stderr}"
    assert not tmp_leftovers(out), where
    assert tree_bytes(out) == tree_bytes(reference), where
    return kill, json.loads(rerun.stdout)


@dataclass(frozen=True)
class ResumeCase:
    src: Path
    args: tuple[str, ...]
    reference: Path
    tasks: int


def _resume_case(root: Path, fmt: str) -> ResumeCase:
    wnids = CLASSES.wnids[::100]  # 10 classes
    if fmt == "shards":
        # 200 small JPEGs (a few distinct ones reused) in 20 shards of 10
        pool = [jpeg((160, 120), seed=i) for i in range(8)]
        per_class, args = 20, ("--shard-size", "10", "--size", "64")
    else:
        # 1100 tiny images: two label-list chunks (a chunk is 1000 images), the short one
        # done first, so a kill at the first record lands in the long one
        pool = [jpeg((64, 48), seed=i) for i in range(16)]
        per_class, args = 110, ("--format", "list", "--size", "32")
    src = write_tar(root / "ILSVRC2012_img_train.tar", [
        (f"{w}.tar", tar_bytes([(f"{w}_{j}.JPEG", pool[(c * 7 + j) % len(pool)])
                               for j in range(per_class)]))
        for c, w in enumerate(wnids)])
    reference = root / "reference"
    s = convert_ok(src, reference, *args)
    assert s["samples"] == 10 * per_class and s["tasks_resumed"] == 0
    return ResumeCase(src, args, reference, s["tasks"])


@pytest.fixture(scope="module")
def resume_cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ResumeCase]:
    return {fmt: _resume_case(tmp_path_factory.mktemp(f"resume_{fmt}"), fmt)
            for fmt in ("shards", "list")}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["shards", "list"])
def test_kill_then_rerun_gives_identical_output(resume_cases: dict[str, ResumeCase],
                                                tmp_path: Path, fmt: str) -> None:
    """SIGKILL once the first task is recorded; the rerun resumes it. (Kills at random
    points, on 1 worker and on 2 ranks: tests/harness/test_faults.py.)"""
    case = resume_cases[fmt]
    assert case.tasks == (20 if fmt == "shards" else 2)
    out = tmp_path / "out"
    args = ("convert", case.src, "-o", out, "-j", "2", "-q", "--json", *case.args)
    kill, s = kill_and_rerun(args, out, case.reference)
    where = f"kill at {kill.at}s: {kill}"
    assert s["complete"] and s["tasks"] == case.tasks, where
    assert s["tasks_resumed"] >= kill.records_before, where
    assert s["tasks_resumed"] > 0, where


@pytest.mark.slow
def test_ctrl_c_exits_130_and_rerun_resumes(resume_cases: dict[str, ResumeCase],
                                            tmp_path: Path) -> None:
    case = resume_cases["shards"]
    out = tmp_path / "out"
    args = ("convert", case.src, "-o", out, "-j", "2", "-q", "--json", *case.args)
    kill, proc = run_and_kill(args, out / ".imgprep", "first-record", 0, signal.SIGINT)
    if kill.killed:
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        assert proc.returncode == 130, err
        assert "Traceback" not in err
        assert err.strip().splitlines() == [
            "imgprep: interrupted; rerun the same command to resume"]
        assert not (out / "train.json").exists()
    rerun = run_module(*args)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["tasks_resumed"] > 0
    assert not tmp_leftovers(out)
    assert tree_bytes(out) == tree_bytes(case.reference)


def test_rerun_redoes_only_a_damaged_shard(sample: Path, tmp_path: Path) -> None:
    src = sample / "ILSVRC2012_img_train.tar"
    first = convert_ok(src, tmp_path, "--shards", "4")
    before = tree_bytes(tmp_path)
    shard = tmp_path / "train-000002.tar"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    again = convert_ok(src, tmp_path, "--shards", "4")
    assert (first["tasks_resumed"], again["tasks_resumed"]) == (0, 3)
    assert tree_bytes(tmp_path) == before


def test_rerun_rewrites_a_deleted_list_image(sample: Path, tmp_path: Path) -> None:
    src = sample / "ILSVRC2012_img_train.tar"
    convert_ok(src, tmp_path, "--format", "list")
    before = tree_bytes(tmp_path)
    victim = next((tmp_path / "train").rglob("*.jpg"))
    victim.unlink()
    again = convert_ok(src, tmp_path, "--format", "list")
    assert again["tasks_resumed"] == 0  # the only chunk no longer verifies: redone
    assert tree_bytes(tmp_path) == before


def test_reconvert_with_other_options_leaves_only_described_shards(sample: Path,
                                                                   tmp_path: Path) -> None:
    """Reconverting into the same folder with fewer shards (``--overwrite``: other options
    without it are refused) must not leave stale shards.

    Shards of the earlier run that the new manifest does not list duplicate samples for
    anything that globs ``train-*.tar`` (rsync to nodes, webdataset on a pattern).
    """
    src = sample / "ILSVRC2012_img_train.tar"
    out, fresh = tmp_path / "reused", tmp_path / "fresh"
    convert_ok(src, out, "--shards", "5")
    one_line_error(invoke("convert", src, "-o", out, "--shards", "3"), 3,
                   "--shards: 5 there, 3 now", "--overwrite")
    again = convert_ok(src, out, "--shards", "3", "--overwrite")
    assert again["tasks_resumed"] == 0
    convert_ok(src, fresh, "--shards", "3")
    m = json.loads((out / "train.json").read_text("utf-8"))
    listed = sorted(s["name"] for s in m["shards"])
    assert sorted(p.name for p in out.glob("train-*.tar")) == listed
    assert {k: v for k, v in tree_bytes(out).items() if not k.startswith(".imgprep/")} == \
        {k: v for k, v in tree_bytes(fresh).items() if not k.startswith(".imgprep/")}


# ---------------------------------------------------------------------------- bad images


def test_bad_images_fail_the_run_without_a_manifest(bad_sample: Path, tmp_path: Path) -> None:
    src = bad_sample / "ILSVRC2012_img_train.tar"
    bad = undecodable(src)
    assert bad
    r = invoke("convert", src, "-o", tmp_path, "-j", "2", "-q", "--json", "--shard-size", "8")
    one_line_error(r, 1, "train-errors.jsonl", "--max-errors 0")
    s = summary_of(r)
    assert s["complete"] is False and s["manifest"] is None
    assert s["errors"] == len(bad) and s["samples"] == 24 - len(bad)
    assert not (tmp_path / "train.json").exists()
    errors = read_errors(tmp_path / "train-errors.jsonl")
    assert {e["key"] for e in errors} == bad
    for e in errors:
        assert e["source"].startswith(str(src) + "/")
        assert e["source"].endswith(f"/{e['key']}.JPEG")
        assert e["reason"]
    # every other image is in the shards
    keys = set()
    for p in sorted(tmp_path.glob("train-*.tar")):
        with tarfile.open(p) as tf:
            keys |= {m.name.partition(".")[0] for m in tf}
    assert len(keys) == 24 - len(bad) and not keys & bad

    # Raising --max-errors finishes the run from the records: nothing is converted again.
    r2 = invoke("convert", src, "-o", tmp_path, "-j", "2", "-q", "--json", "--shard-size", "8",
                "--max-errors", len(bad))
    assert r2.exit_code == 0, r2.output
    s2 = summary_of(r2)
    assert s2["complete"] and s2["tasks_resumed"] == s2["tasks"] == 3
    m = json.loads((tmp_path / "train.json").read_text("utf-8"))
    assert m["errors"] == len(bad) and m["error_log"] == "train-errors.jsonl"
    assert m["total_samples"] == 24 - len(bad)


def test_bad_sample_with_max_errors_two(bad_sample: Path, tmp_path: Path) -> None:
    """conftest's ``bad_sample`` holds a truncated JPEG and a zero-byte file: two errors."""
    src = bad_sample / "ILSVRC2012_img_train.tar"
    s = convert_ok(src, tmp_path, "--max-errors", "2")
    m = json.loads((tmp_path / "train.json").read_text("utf-8"))
    reasons = [e["reason"] for e in read_errors(tmp_path / "train-errors.jsonl")]
    assert any("empty file" in r for r in reasons), reasons
    assert (s["errors"], m["errors"], m["total_samples"]) == (2, 2, 22)


def test_bad_images_in_a_label_list(bad_sample: Path, tmp_path: Path) -> None:
    src = bad_sample / "ILSVRC2012_img_train.tar"
    bad = undecodable(src)
    s = convert_ok(src, tmp_path, "--format", "list", "--max-errors", len(bad))
    lines = (tmp_path / "train.txt").read_text("utf-8").splitlines()
    assert len(lines) == s["samples"] == 24 - len(bad)
    assert not {Path(line.split()[0]).stem for line in lines} & bad
    assert {e["key"] for e in read_errors(tmp_path / "train-errors.jsonl")} == bad
    r = invoke("verify", tmp_path, "-q")
    assert r.exit_code == 0, r.output


QUIRKY = {
    "gray": lambda: jpeg(seed=1, mode="L"),
    "cmyk": lambda: jpeg(seed=2, mode="CMYK"),
    "rgba_png": lambda: encode(photo(seed=3).convert("RGBA"), "PNG"),
    "palette_png": lambda: encode(photo(seed=4).convert("P"), "PNG"),
    "bilevel_png": lambda: encode(photo(seed=5).convert("1"), "PNG"),
    "la_png": lambda: encode(photo(seed=6).convert("LA"), "PNG"),
    "sixteen_bit": lambda: encode(Image.fromarray(
        np.asarray(photo(seed=7).convert("L"), dtype=np.uint16) * 257), "PNG"),
    "tiny": lambda: jpeg((3, 2), seed=8),
}
BROKEN = {
    "truncated": (lambda: jpeg((400, 300), seed=9)[:1500], "truncated"),
    "zero": (lambda: b"", "empty file"),
    "html": (lambda: b"<!DOCTYPE html><html>403 Forbidden</html>", "HTML"),
    "noise": (lambda: bytes(random.Random(0).randrange(256) for _ in range(3000)),
              "not an image"),
    "bomb": (lambda: jpeg((800, 600), seed=10), "--max-pixels"),
}


def test_bad_images_are_recorded_and_quirky_ones_converted(tmp_path: Path) -> None:
    wnid = CLASSES.wnids[7]
    members = [(f"{wnid}_{k}.JPEG", make()) for k, make in QUIRKY.items()]
    members += [(f"{wnid}_{k}.JPEG", make()) for k, (make, _) in BROKEN.items()]
    src = write_tar(tmp_path / "quirks.tar", members)
    out = tmp_path / "out"
    s = convert_ok(src, out, "--max-errors", len(BROKEN), "--max-pixels", 300_000)
    assert (s["samples"], s["errors"]) == (len(QUIRKY), len(BROKEN))
    errors = {e["key"]: e for e in read_errors(out / "train-errors.jsonl")}
    assert set(errors) == {f"{wnid}_{k}" for k in BROKEN}
    for k, (_, why) in BROKEN.items():
        e = errors[f"{wnid}_{k}"]
        assert why in e["reason"], e
        assert e["source"] == f"{src}/{wnid}_{k}.JPEG"
    with tarfile.open(out / "train-000000.tar") as tf:
        jpgs = {m.name: tf.extractfile(m).read() for m in tf  # type: ignore[union-attr]
                if m.name.endswith(".jpg")}
    assert set(jpgs) == {f"{wnid}_{k}.jpg" for k in QUIRKY}
    for name, data in jpgs.items():
        with Image.open(io.BytesIO(data)) as img:
            assert (img.format, img.mode, img.size) == ("JPEG", "RGB", (256, 256)), name


# ---------------------------------------------------------------------------- fatal input errors


def test_missing_input_is_a_usage_error(tmp_path: Path) -> None:
    r = invoke("convert", tmp_path / "nope.tar", "-o", tmp_path / "out")
    assert r.exit_code == 2
    assert "nope.tar" in r.stderr and "does not exist" in r.stderr
    assert "Traceback" not in r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("content", "why"), [
    (os.urandom(5000), "not a readable tar"),
    (b"", "is empty (0 bytes)"),
    (b"hello, not a tar\n" * 64, "not a readable tar"),
    (b"\x1f\x8b\x08\x00" + bytes(200), "gzip"),
])
def test_garbage_input_tar_exits_3(tmp_path: Path, content: bytes, why: str) -> None:
    src = tmp_path / "ILSVRC2012_img_train.tar"
    src.write_bytes(content)
    r = invoke("convert", src, "-o", tmp_path / "out", "-j", "1")
    assert why in one_line_error(r, 3, src.name)
    assert not (tmp_path / "out" / "train.json").exists()


def test_folder_without_images_exits_3(tmp_path: Path) -> None:
    src = tmp_path / "empty"
    src.mkdir()
    (src / "README.txt").write_text("no images here\n")
    r = invoke("convert", src, "-o", tmp_path / "out")
    one_line_error(r, 3, str(src), "no images")


def test_truncated_input_tar_is_recorded(tmp_path: Path) -> None:
    wnid = CLASSES.wnids[1]
    data = tar_bytes([(f"{wnid}_1.JPEG", jpeg(seed=1)), (f"{wnid}_2.JPEG", jpeg((500, 375)))])
    src = tmp_path / "cut.tar"
    src.write_bytes(data[:9000])
    out = tmp_path / "out"
    r = invoke("convert", src, "-o", out, "-j", "1", "-q")
    one_line_error(r, 1, "train-errors.jsonl")
    errors = read_errors(out / "train-errors.jsonl")
    assert errors and all(e["source"].startswith(str(src)) for e in errors)
    assert any(f"{wnid}_2.JPEG" in e["source"] for e in errors)
    assert not (out / "train.json").exists()


@pytest.mark.parametrize("content", [
    b"this is not\na ground truth file\n",
    b"\xff\xfe\x00\x01binary\x00\x00",
    b"ILSVRC2012_val_00000001.JPEG n01440764 extra\n",
])
def test_unknown_ground_truth_format_exits_3(sample: Path, tmp_path: Path,
                                             content: bytes) -> None:
    gt = tmp_path / "mystery.txt"
    gt.write_bytes(content)
    r = invoke("convert", sample / "ILSVRC2012_img_val.tar", "-o", tmp_path / "out",
               "--labels", gt)
    one_line_error(r, 3, str(gt))


def test_devkit_ids_without_map_convert_with_the_devkits_map(sample: Path,
                                                            tmp_path: Path) -> None:
    gt = tmp_path / "ILSVRC2012_validation_ground_truth.txt"
    shutil.copy(sample / gt.name, gt)  # no map_clsloc.txt beside it
    r = invoke("convert", sample / "ILSVRC2012_img_val.tar", "-o", tmp_path / "out",
               "--labels", gt, "-q", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["label_check"] == "canonical"


def test_val_image_without_ground_truth_exits_3(tmp_path: Path) -> None:
    src = write_tar(tmp_path / "val.tar", [
        (f"ILSVRC2012_val_{i:08d}.JPEG", jpeg(seed=i)) for i in (1, 2, 3)])
    gt = tmp_path / "val.txt"
    gt.write_text(published_val_txt((1, 2)))
    r = invoke("convert", src, "-o", tmp_path / "out", "--labels", gt)
    one_line_error(r, 3, "ILSVRC2012_val_00000003", str(src))
    assert not (tmp_path / "out" / "val.json").exists()


def test_val_images_without_labels_say_pass_labels(tmp_path: Path) -> None:
    """A validation name past the 50,000 published ones has no label to take; the published
    ones convert with theirs."""
    src = write_tar(tmp_path / "val.tar", [("ILSVRC2012_val_00050001.JPEG", jpeg())])
    r = invoke("convert", src, "-o", tmp_path / "out")
    assert "--labels" in one_line_error(r, 3, "ILSVRC2012_val_00050001.JPEG")
    src = write_tar(tmp_path / "val.tar", [("ILSVRC2012_val_00000001.JPEG", jpeg())])
    r = invoke("convert", src, "-o", tmp_path / "out", "-q", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["label_source"] == "published", r.output


@pytest.mark.parametrize("where", ["under-a-file", "file-below"])
def test_unwritable_output_exits_3(sample: Path, tmp_path: Path, where: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("I am a file\n")
    out = blocker / "out" if where == "under-a-file" else blocker / "x" / "y"
    r = invoke("convert", sample / "ILSVRC2012_img_val.tar", "-o", out,
               "--labels", sample / "val.txt")
    one_line_error(r, 3, str(out))
    assert blocker.read_text() == "I am a file\n"


def test_output_that_is_a_file_is_a_usage_error(sample: Path, tmp_path: Path) -> None:
    out = tmp_path / "taken"
    out.write_text("x")
    r = invoke("convert", sample / "ILSVRC2012_img_val.tar", "-o", out)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert out.read_text() == "x"


@pytest.mark.parametrize("sub", ["converted", "."])
def test_output_inside_input_folder_exits_3(tmp_path: Path, sub: str) -> None:
    src = tmp_path / "train"
    wnid = CLASSES.wnids[3]
    (src / wnid).mkdir(parents=True)
    (src / wnid / f"{wnid}_1.JPEG").write_bytes(jpeg())
    before = tree_bytes(src)
    r = invoke("convert", src, "-o", src / sub)
    one_line_error(r, 3, "--out", "inside the input")
    assert tree_bytes(src) == before
    assert not (src / sub / ".imgprep").exists()


@pytest.mark.parametrize("ext", [".JPEG", ".jpg"])
def test_label_list_never_writes_into_the_input_tree(tmp_path: Path, ext: str) -> None:
    """``convert DATA/train -o DATA --format list`` writes DATA/train/<wnid>/<key>.jpg.

    Those are the input's own paths: the originals must stay untouched (refusing the
    command, exit 3, is fine), and the same command run again must still succeed.
    """
    wnid = CLASSES.wnids[5]
    src = tmp_path / "train"
    (src / wnid).mkdir(parents=True)
    for i in range(3):
        (src / wnid / f"{wnid}_{i}{ext}").write_bytes(jpeg((500, 375), seed=i))

    def digests() -> dict[str, str]:
        return {k: hashlib.sha256(v).hexdigest()[:12] for k, v in tree_bytes(src).items()}

    before = digests()
    r = invoke("convert", src, "-o", tmp_path, "--format", "list", "-j", "1", "-q")
    if r.exit_code == 3:
        one_line_error(r, 3, "--out")
    else:
        assert r.exit_code == 0, r.output
    assert digests() == before, "the originals were overwritten or joined by outputs"
    again = invoke("convert", src, "-o", tmp_path, "--format", "list", "-j", "1", "-q")
    assert again.exit_code == r.exit_code, again.output


@pytest.mark.parametrize(("content", "where"), [
    (b"ILSVRC2012_val_00000001.JPEG 1000\n", ":1"),  # Caffe index out of range
    (b"ImageId,PredictionString\nILSVRC2012_val_00000001,n01440764 1 2 3 4\n"
     b"ILSVRC2012_val_00000001,n01443537 1 2 3 4\n", ":3"),  # one image, two classes
    (b"n99999999\n", "n99999999"),  # a wnid outside the class table
])
def test_inconsistent_ground_truth_exits_3(sample: Path, tmp_path: Path, content: bytes,
                                           where: str) -> None:
    gt = tmp_path / "truth.txt"
    gt.write_bytes(content)
    r = invoke("convert", sample / "ILSVRC2012_img_val.tar", "-o", tmp_path / "out",
               "--labels", gt)
    one_line_error(r, 3, where)


def test_unknown_class_exits_3(tmp_path: Path) -> None:
    src = tmp_path / "pets"
    (src / "cats").mkdir(parents=True)
    (src / "cats" / "cat_1.JPEG").write_bytes(jpeg())
    msg = one_line_error(invoke("convert", src, "-o", tmp_path / "out"), 3, "cats/cat_1.JPEG")
    assert "--classes" in msg


def _hostile_members(wnid: str) -> list[tuple[str, bytes] | tarfile.TarInfo]:
    sym = tarfile.TarInfo(f"{wnid}_sym.JPEG")
    sym.type, sym.linkname = tarfile.SYMTYPE, "/etc/passwd"
    hard = tarfile.TarInfo(f"{wnid}_hard.JPEG")
    hard.type, hard.linkname = tarfile.LNKTYPE, f"{wnid}_1.JPEG"
    dev = tarfile.TarInfo(f"{wnid}_dev.JPEG")
    dev.type, dev.devmajor, dev.devminor = tarfile.CHRTYPE, 1, 3
    fifo = tarfile.TarInfo(f"{wnid}_fifo.JPEG")
    fifo.type = tarfile.FIFOTYPE
    return [
        (f"{wnid}_1.JPEG", jpeg(seed=1)),
        (f"../{wnid}_evil.JPEG", jpeg(seed=2)),
        (f"../../../{wnid}_evil3.JPEG", jpeg(seed=3)),
        (f"/tmp/{wnid}_abs.JPEG", jpeg(seed=4)),
        (f"sub/../../{wnid}_evil2.JPEG", jpeg(seed=5)),
        sym, hard, dev, fifo,
        (f"{wnid}_2.JPEG", jpeg(seed=6)),
    ]


HOSTILE = 8


@pytest.mark.parametrize("nested", [False, True])
def test_hostile_members_are_refused_and_nothing_escapes(tmp_path: Path, nested: bool) -> None:
    wnid = CLASSES.wnids[42]
    srcdir = tmp_path / "src"
    srcdir.mkdir()
    if nested:
        inner = tmp_path / "inner.tar"
        write_tar(inner, _hostile_members(wnid))
        src = write_tar(srcdir / "ILSVRC2012_img_train.tar", [
            (f"{wnid}.tar", inner.read_bytes()), ("../escape.tar", inner.read_bytes())])
        inner.unlink()
    else:
        src = write_tar(srcdir / "hostile.tar", _hostile_members(wnid))
    work = tmp_path / "work"
    work.mkdir()
    (work / "bystander.txt").write_text("untouched\n")
    out = work / "out"
    snapshot = tree_bytes(tmp_path)  # the whole test folder: names and bytes
    abs_target = Path(f"/tmp/{wnid}_abs.JPEG")
    assert not abs_target.exists()

    r = invoke("convert", src, "-o", out, "-j", "1", "-q", "--json")
    one_line_error(r, 1, "train-errors.jsonl")
    assert not (out / "train.json").exists()
    refused = HOSTILE + (1 if nested else 0)
    errors = read_errors(out / "train-errors.jsonl")
    assert len(errors) == refused, errors
    for e in errors:
        assert e["source"].startswith(str(src)), e
        assert "refused" in e["reason"], e
    reasons = " ".join(e["reason"] for e in errors)
    for what in ("'..'", "absolute", "link", "device"):
        assert what in reasons, what

    r = invoke("convert", src, "-o", out, "-j", "1", "-q", "--json", "--max-errors", refused)
    assert r.exit_code == 0, r.output
    assert summary_of(r)["samples"] == 2
    with tarfile.open(out / "train-000000.tar") as tf:
        assert sorted(m.name for m in tf if m.name.endswith(".jpg")) == [
            f"{wnid}_1.jpg", f"{wnid}_2.jpg"]

    # Nothing was written outside --out: the test folder only gained files under work/out.
    after = tree_bytes(tmp_path)
    gained = {k for k in after if k not in snapshot}
    assert all(k.startswith("work/out/") for k in gained), gained
    assert {k: after[k] for k in snapshot} == snapshot
    assert not abs_target.exists()
    assert not list(tmp_path.parent.glob(f"{wnid}_evil*"))
    assert not list(Path("/").glob(f"{wnid}_evil*"))


# ---------------------------------------------------------------------------- verify


@pytest.fixture()
def copy_of(converted: dict[str, Path], tmp_path: Path) -> Callable[[str], Path]:
    """A private, writable copy of a converted folder, to damage."""

    def make(fmt: str) -> Path:
        dst = tmp_path / fmt
        shutil.copytree(converted[fmt], dst)
        return dst
    return make


@pytest.mark.parametrize("decode", ["--decode", "--no-decode"])
@pytest.mark.parametrize("fmt", ["shards", "list"])
def test_verify_accepts_a_good_conversion(converted: dict[str, Path], fmt: str,
                                          decode: str) -> None:
    r = invoke("verify", converted[fmt], decode, "--json", "-q")
    assert r.exit_code == 0, r.output
    s = summary_of(r)
    assert s["ok"] is True and s["problems"] == [] and s["samples"] == 48
    assert s["checked"] == (3 if fmt == "shards" else 48)
    r = invoke("verify", converted[fmt], "--split", "train", decode)
    assert r.exit_code == 0 and "OK" in r.stdout, r.output


def test_verify_a_label_list_file(converted: dict[str, Path]) -> None:
    r = invoke("verify", converted["list"] / "train.txt", "--json", "-q")
    assert r.exit_code == 0, r.output
    assert summary_of(r)["samples"] == 48


def _problems(r: Result) -> list[str]:
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    lines = r.stderr.strip().splitlines()
    assert lines and all(line.startswith("imgprep: problem: ") for line in lines), r.stderr
    return lines


@pytest.mark.parametrize("decode", ["--decode", "--no-decode"])
def test_verify_finds_a_flipped_byte(copy_of: Callable[[str], Path], decode: str) -> None:
    out = copy_of("shards")
    shard = out / "train-000001.tar"
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x01
    shard.write_bytes(bytes(data))
    problems = _problems(invoke("verify", out, decode, "-q"))
    assert len(problems) == 1 and "train-000001.tar" in problems[0], problems
    assert "sha256" in problems[0]


@pytest.mark.parametrize("decode", ["--decode", "--no-decode"])
def test_verify_finds_a_missing_shard(copy_of: Callable[[str], Path], decode: str) -> None:
    out = copy_of("shards")
    (out / "train-000002.tar").unlink()
    problems = _problems(invoke("verify", out, decode, "-q"))
    assert any("train-000002.tar" in p and "missing" in p for p in problems), problems


def test_verify_finds_a_truncated_shard(copy_of: Callable[[str], Path]) -> None:
    out = copy_of("shards")
    shard = out / "train-000000.tar"
    shard.write_bytes(shard.read_bytes()[:-1024])
    problems = _problems(invoke("verify", out, "-q"))
    assert any("train-000000.tar" in p for p in problems), problems


def test_verify_finds_a_removed_list_image(copy_of: Callable[[str], Path]) -> None:
    out = copy_of("list")
    rel = (out / "train.txt").read_text("utf-8").splitlines()[5].split()[0]
    (out / rel).unlink()
    for decode in ("--decode", "--no-decode"):
        problems = _problems(invoke("verify", out, decode, "-q"))
        assert any(rel in p for p in problems), problems


def test_verify_finds_an_edited_label_list(copy_of: Callable[[str], Path]) -> None:
    out = copy_of("list")
    with (out / "train.txt").open("a") as f:
        f.write("train/n01440764/extra file.jpg 3\n")
    problems = _problems(invoke("verify", out, "--no-decode", "-q"))
    assert any("train.txt" in p and "sha256" in p for p in problems), problems
    assert any("train.txt:49" in p for p in problems), problems


def test_verify_finds_a_corrupt_list_image(copy_of: Callable[[str], Path]) -> None:
    out = copy_of("list")
    rel = (out / "train.txt").read_text("utf-8").splitlines()[0].split()[0]
    (out / rel).write_bytes(encode(photo((256, 256)), "PNG"))
    problems = _problems(invoke("verify", out, "-q"))
    assert any(rel in p and "PNG" in p for p in problems), problems


def test_verify_without_manifest_exits_3(copy_of: Callable[[str], Path]) -> None:
    out = copy_of("shards")
    (out / "train.json").unlink()
    one_line_error(invoke("verify", out, "-q"), 3, str(out), "no manifest")


def test_train_and_val_in_one_folder(sample: Path, tmp_path: Path) -> None:
    convert_ok(sample / "ILSVRC2012_img_train.tar", tmp_path, "--shards", "2")
    convert_ok(sample / "ILSVRC2012_img_val.tar", tmp_path, "--labels", sample / "val.txt")
    r = invoke("verify", tmp_path, "--json", "-q")
    assert r.exit_code == 0, r.output
    assert summary_of(r)["samples"] == 48 + 20
    r = invoke("info", tmp_path, "--json")
    assert r.exit_code == 0, r.output
    assert {m["split"]: m["samples"] for m in summary_of(r)["manifests"]} == \
        {"train": 48, "val": 20}
    r = invoke("preview", tmp_path, "-o", tmp_path / "sheet.png")
    one_line_error(r, 3, "--split")
    r = invoke("preview", tmp_path, "--split", "val", "-o", tmp_path / "sheet.png", "-n", 4)
    assert r.exit_code == 0, r.output
    (tmp_path / "val-000000.tar").unlink()
    problems = _problems(invoke("verify", tmp_path, "-q"))
    assert problems == ["imgprep: problem: val-000000.tar: missing; restore it or reconvert"]


# ---------------------------------------------------------------------------- info, preview


def test_info_json_reports_the_manifest_and_pil(converted: dict[str, Path]) -> None:
    r = invoke("info", converted["shards"], "--json")
    assert r.exit_code == 0, r.output
    info = summary_of(r)
    assert set(info) == {"versions", "pil", "libjpeg", "convert", "loader", "manifests", "notes",
                         "warning"}
    assert info["convert"]["transform_version"] == transform_version()
    assert set(info["versions"]) == {"imgprep", "python", "platform", "numpy", "torch",
                                     "webdataset", "tqdm", "click"}
    assert set(info["pil"]) == {"pil_version", "pillow_simd", "stock_pillow_installed",
                                "pillow_simd_installed", "libjpeg_turbo", "jpeg_version",
                                "core", "cpu_avx2", "avx2_build", "crop_decode", "resampler"}
    (m,) = info["manifests"]
    assert set(m) == {"path", "split", "format", "samples", "shards", "bytes", "classes",
                      "errors", "expected_images", "missing_images", "mean", "std",
                      "tool_version", "options", "index", "transform_version", "fast_decode"}
    assert m["transform_version"] == transform_version()
    first = read_manifest(converted["shards"] / "train.json").shards[0].samples
    assert m["fast_decode"] == ({"probed": first, "fast": first, "declined": {}}
                                if jpegcrop.AVAILABLE else
                                {"probed": first, "fast": 0, "declined": {
                                    f"the crop-aware decoder is not built ({jpegcrop._MISSING})":
                                    first}})
    assert (m["split"], m["format"], m["samples"], m["shards"], m["classes"], m["errors"]) == \
        ("train", "shards", 48, 3, 1000, 0)
    assert (m["path"], m["index"]) == (str(converted["shards"] / "train.json"), True)
    assert m["bytes"] == sum(p.stat().st_size for p in converted["shards"].glob("train-*.tar"))
    assert info["pil"]["pillow_simd"] is True  # the project's venv has pillow-simd
    lib = jpegcrop.library()
    assert info["libjpeg"] == (asdict(lib) if lib is not None else None)
    assert info["warning"] is None
    assert info["versions"]["imgprep"] == __version__ == importlib.metadata.version("imgprep")
    assert info["versions"]["webdataset"] == importlib.metadata.version("webdataset")
    r = invoke("info", converted["list"], "--json")
    assert r.exit_code == 0, r.output
    (m,) = summary_of(r)["manifests"]
    assert (m["format"], m["samples"], m["shards"], m["index"]) == ("list", 48, 0, False)
    assert m["fast_decode"] == {}
    r = invoke("info", "--json")  # no manifest asked for: no "manifests" key
    assert r.exit_code == 0, r.output
    assert set(summary_of(r)) == {"versions", "pil", "libjpeg", "convert", "loader", "warning"}


def test_info_human_and_strict(converted: dict[str, Path]) -> None:
    r = invoke("info", converted["shards"], "--strict")
    assert r.exit_code == 0, r.output
    assert "pillow-simd" in r.stdout and "48 samples" in r.stdout
    assert f"crop decode  {jpegcrop.status()}" in r.stdout
    assert "crop-aware decode: " in r.stdout
    assert f"loader       {loader_path()}" in r.stdout


def test_info_on_a_folder_without_manifest_exits_3(tmp_path: Path) -> None:
    one_line_error(invoke("info", tmp_path), 3, str(tmp_path), "no manifest")


@pytest.mark.parametrize(("n", "size"), [(8, (1024, 142)), (10, (1024, 284)), (3, (1024, 142))])
@pytest.mark.parametrize("fmt", ["shards", "list"])
def test_preview_writes_a_contact_sheet(converted: dict[str, Path], tmp_path: Path, fmt: str,
                                        n: int, size: tuple[int, int]) -> None:
    sheet = tmp_path / "sub" / "sheet.png"
    r = invoke("preview", converted[fmt], "--split", "train", "-o", sheet, "-n", n)
    assert r.exit_code == 0, r.output
    assert f"{n} samples" in r.stdout
    with Image.open(sheet) as img:
        assert (img.format, img.size) == ("PNG", size)
        arr = np.asarray(img.convert("RGB"))
    assert arr[:128, :128].std() > 5, "first thumbnail is blank"
    assert not tmp_leftovers(tmp_path)


def test_preview_of_an_unfinished_conversion_exits_3(tmp_path: Path) -> None:
    one_line_error(invoke("preview", tmp_path, "-o", tmp_path / "x.png"), 3, "no manifest")


# ---------------------------------------------------------------------------- make-sample, help


def test_make_sample_writes_tars_and_ground_truth(tmp_path: Path) -> None:
    out = tmp_path / "fake"
    r = invoke("make-sample", out, "--classes", 3, "--per-class", 2, "--val", 5, "--json")
    assert r.exit_code == 0, r.output
    s = summary_of(r)
    assert set(s) == {"out", "classes", "train_images", "val_images", "quirks", "bad",
                      "train_tar", "val_tar"}  # the summary it always gave
    assert (s["train_images"], s["val_images"], len(s["classes"])) == (6, 5, 3)
    assert (s["out"], s["train_tar"]) == (str(out), str(out / "ILSVRC2012_img_train.tar"))
    with tarfile.open(out / "ILSVRC2012_img_train.tar") as outer:
        inner_names = [m.name for m in outer]
        assert inner_names == [f"{w}.tar" for w in s["classes"]]
        for m in outer:
            f = outer.extractfile(m)
            assert f is not None
            with tarfile.open(fileobj=io.BytesIO(f.read())) as inner:
                assert [im.name for im in inner] == [
                    f"{m.name[:-4]}_{1000 + j}.JPEG" for j in range(2)]
    # val images: the first 5 published validation images of the sample's classes
    table = imagenet_classes()
    chosen = {table.index(w) for w in s["classes"]}
    numbers = [n for n in range(1, 50001) if published_label(n) in chosen][:5]
    with tarfile.open(out / "ILSVRC2012_img_val.tar") as tf:
        assert [m.name for m in tf] == [f"ILSVRC2012_val_{n:08d}.JPEG" for n in numbers]
    assert (out / "val.txt").read_text() == published_val_txt(numbers)
    assert (out / "LOC_val_solution.csv").read_text() == "ImageId,PredictionString\n" + "".join(
        f"ILSVRC2012_val_{n:08d},{table.wnids[published_label(n)]} 1 2 3 4\n" for n in numbers)
    # devkit form: one devkit ID a line for every image up to the last one, each the published
    # class through map_clsloc.txt (whose IDs are not the sorted-wnid index)
    devkit = {int(i): w for w, i, _ in (ln.split() for ln in
                                        (out / "map_clsloc.txt").read_text().splitlines())}
    assert len(devkit) == 1000 and any(table.wnids[i - 1] != w for i, w in devkit.items())
    ids = (out / "ILSVRC2012_validation_ground_truth.txt").read_text().split()
    assert [devkit[int(i)] for i in ids] == \
        [table.wnids[published_label(n)] for n in range(1, numbers[-1] + 1)]
    # and it converts, every ground-truth form giving the same shards
    shards = []
    for form in ("val.txt", "LOC_val_solution.csv", "ILSVRC2012_validation_ground_truth.txt"):
        s = convert_ok(out / "ILSVRC2012_img_val.tar", tmp_path / form, "--labels", out / form)
        assert (s["split"], s["samples"]) == ("val", 5)
        shards.append((tmp_path / form / "val-000000.tar").read_bytes())
    assert shards[0] == shards[1] == shards[2]


@pytest.mark.parametrize("classes", [8, 2])
def test_make_sample_bad_writes_both_bad_files(tmp_path: Path, classes: int) -> None:
    """``--bad`` adds a truncated JPEG and a zero-byte file, whatever the class count."""
    r = invoke("make-sample", tmp_path, "--classes", classes, "--per-class", 2, "--val", 0,
               "--bad", "--json")
    assert r.exit_code == 0, r.output
    bad = summary_of(r)["bad"]
    assert len(bad) == 2 and any("truncated" in b for b in bad) and \
        any("zero_bytes" in b for b in bad), bad
    assert len(undecodable(tmp_path / "ILSVRC2012_img_train.tar")) == 2


@pytest.mark.parametrize("command", [[], ["convert"], ["verify"], ["info"], ["preview"],
                                     ["make-sample"]])
def test_help(command: list[str]) -> None:
    r = invoke(*command, "--help")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("Usage:")
    if command:
        assert command[0] in r.stdout


def test_console_script_and_version() -> None:
    exe = shutil.which("imgprep") or str(Path(sys.executable).with_name("imgprep"))
    assert Path(exe).is_file(), "the imgprep console script is not installed"
    p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60,
                       check=False)
    assert p.returncode == 0 and __version__ in p.stdout, p.stderr
    p = run_module("convert", "--help", timeout=60)
    assert p.returncode == 0 and "--max-errors" in p.stdout


def test_unknown_option_is_a_usage_error(sample: Path, tmp_path: Path) -> None:
    r = invoke("convert", sample / "val.txt", "-o", tmp_path, "--resize", "stretch")
    assert r.exit_code == 2 and "stretch" in r.stderr
