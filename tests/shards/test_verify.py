"""Parallel verify: the same report, line for line, whatever the worker count; a dead worker
is an error, never a silent pass. A split whose conversion was killed is reported as
unfinished, never passed over; a folder imgprep never wrote is called so, with no progress
bar."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

import imgprep.shards.verify as verify_mod
from imgprep.cli.commands import cli
from imgprep.convert.options import ConvertOptions
from imgprep.convert.run import convert
from imgprep.errors import ManifestError
from imgprep.job.world import World
from imgprep.shards.index import write_index
from imgprep.shards.indexing import index_folder
from imgprep.shards.layout import Layout, scan_layout
from imgprep.shards.manifest import read_manifest, write_manifest
from imgprep.shards.verify import VerifyError, verify
from imgprep.shards.writers import ShardWriter
from loaders import LoaderError, LoaderOptions, ShardLoader
from tests.support import clean_env, jpeg, one_line_error


def _damaged_shards(src: Path, dst: Path) -> Path:
    """A copy whose first shard holds a bad label, an undecodable image and a repeated key,
    and whose manifest matches its bytes (so only the sample checks find the problems)."""
    shutil.copytree(src, dst)
    m = read_manifest(dst, "train")
    first = dst / m.shards[0].name
    with ShardWriter(first) as w:
        w.add("a", {"jpg": jpeg((256, 256), 1), "cls": b"2"})
        w.add("b", {"jpg": b"not a jpeg", "cls": b"1"})
        w.add("c", {"jpg": jpeg((256, 256), 2), "cls": b"999999"})
        w.add("a", {"jpg": jpeg((256, 256), 3), "cls": b"0"})
        w.add("d", {"cls": b"0"})
    d = json.loads((dst / "train.json").read_text())
    d["total_samples"] += 5 - d["shards"][0]["samples"]
    d["shards"][0].update(samples=5, bytes=w.bytes, sha256=w.sha256)
    (dst / "train.json").write_text(json.dumps(d))
    return dst


@pytest.mark.parametrize("fmt", ["shards", "list"])
def test_a_good_conversion_is_ok_with_any_worker_count(converted: dict[str, Path],
                                                       fmt: str) -> None:
    reports = [verify(converted[fmt], workers=w) for w in (1, 2, 3)]
    assert all(r.ok for r in reports), reports[0].problems
    assert len({(r.checked, r.samples) for r in reports}) == 1
    assert reports[0].samples == read_manifest(converted[fmt]).total_samples


def test_problems_are_reported_identically_in_order(converted: dict[str, Path],
                                                    tmp_path: Path) -> None:
    bad = _damaged_shards(converted["shards"], tmp_path / "bad")
    reports = [verify(bad, workers=w) for w in (1, 2, 4)]
    first = reports[0].problems
    assert any("label b'999999' outside" in p for p in first)
    assert any(":b.jpg does not decode" in p for p in first)
    assert any(":a: key appears in more than one place" in p for p in first)
    assert any(":d: has ['cls'], needs jpg and cls" in p for p in first)
    for r in reports[1:]:
        assert r.problems == first
        assert (r.checked, r.samples) == (reports[0].checked, reports[0].samples)


def test_one_shard_is_split_over_the_workers(converted: dict[str, Path],
                                             tmp_path: Path) -> None:
    bad = _damaged_shards(converted["shards"], tmp_path / "bad")
    m = read_manifest(bad, "train")
    one = verify_mod.verify_shards(bad, m, True, lambda n: None, workers=1)
    ticks: list[int] = []
    many = verify_mod.verify_shards(bad, m, True, ticks.append, workers=7)  # 7 > 3 shards
    assert many.problems == one.problems
    assert sum(ticks) == sum(s.samples for s in m.shards) - 1  # every sample ticked once


def test_corrupt_shard_file_is_reported_once(converted: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "flip"
    shutil.copytree(converted["shards"], bad)
    m = read_manifest(bad, "train")
    path = bad / m.shards[1].name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    for w in (1, 4):
        rep = verify(bad, workers=w)
        assert rep.problems == [f"{m.shards[1].name}: sha256 differs from the manifest "
                                "(corrupt copy)"]


def test_list_problems_are_the_same_in_order(converted: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "list"
    shutil.copytree(converted["list"], bad)
    lines = (bad / "train.txt").read_text().splitlines()
    (bad / lines[3].split()[0]).unlink()
    (bad / lines[7].split()[0]).write_bytes(b"junk")
    lines[10] = lines[10].split()[0] + " 5000"
    (bad / "train.txt").write_text("\n".join(lines) + "\n")
    reports = [verify(bad / "train.txt", workers=w) for w in (1, 3)]
    assert reports[0].problems == reports[1].problems
    assert [p.split(":")[1] for p in reports[0].problems] == ["4", "8", "11"]


_PARENT = os.getpid()
_REAL_CHECK = verify_mod._check_shard


def _dies_on_second_shard(job: verify_mod._ShardJob) -> verify_mod._ShardResult:
    if os.getpid() != _PARENT and job.entry.name.endswith("000001.tar"):
        os.kill(os.getpid(), signal.SIGKILL)
    return _REAL_CHECK(job)


def test_a_killed_worker_is_an_error(converted: dict[str, Path],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_mod, "_check_shard", _dies_on_second_shard)
    with pytest.raises(VerifyError, match="verify worker died"):
        verify(converted["shards"], workers=2)


def _with_index(folder: Path, shift: int) -> None:
    """Rewrite the sample index (and the manifest's entry for it) with every member of the
    first shard's second sample moved by ``shift`` bytes: an index the manifest vouches for
    that points the loaders at the wrong bytes."""
    m = read_manifest(folder, "train")
    layouts = [scan_layout(folder / s.name) for s in m.shards]
    first = layouts[0]
    offset = first.offset.copy()
    lo = int(first.counts[0])
    offset[lo:lo + int(first.counts[1])] += np.uint64(shift)
    layouts[0] = Layout(first.exts, first.counts, offset, first.size, first.ext)
    write_manifest(folder, replace(m, index=write_index(folder, "train", m.shards, layouts)))


def test_the_sample_index_is_checked_against_the_manifest_and_the_tars(
        converted: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "idx"
    shutil.copytree(converted["shards"], folder)
    m = read_manifest(folder, "train")
    _with_index(folder, 512)
    reports = [verify(folder, workers=w) for w in (1, 3)]
    assert reports[0].problems == reports[1].problems
    (problem,) = reports[0].problems
    assert problem.startswith(f"{m.shards[0].name}: sample 1: the sample index puts its .cls")
    assert f"imgprep index {folder}" in problem
    with pytest.raises(LoaderError, match=m.shards[0].name):  # what verify warns of
        next(iter(ShardLoader(folder, "train", World(),
                              LoaderOptions(batch_size=4, workers=0, shuffle=False))))
    index_folder(folder)
    assert verify(folder, workers=2).ok

    (folder / m.index.name).unlink()  # type: ignore[union-attr]
    (problem,) = verify(folder, workers=2).problems
    assert "cannot read index" in problem and "imgprep index" in problem
    write_manifest(folder, replace(read_manifest(folder, "train"), index=None))
    (problem,) = verify(folder, workers=2).problems
    assert "lists no sample index" in problem and f"imgprep index {folder}" in problem


def test_an_index_with_fewer_samples_names_the_first_sample_it_lacks(tmp_path: Path) -> None:
    def lay(counts: list[int]) -> Layout:
        m = sum(counts)
        return Layout(("cls", "jpg"), np.asarray(counts, np.uint8), np.arange(m, dtype=np.uint64),
                      np.ones(m, np.uint32), np.zeros(m, np.uint8))

    why = verify_mod._layout_problem("s.tar", lay([2, 2, 2]), lay([2, 2]), tmp_path)
    assert why is not None and "gives 2 samples" in why and "into 3" in why
    assert "first difference at sample 2" in why


# ------------------------------------------------------------------ unfinished and foreign folders

# Runs ``imgprep ARGS…`` and SIGKILLs itself when it starts converting image N + 1: a kill -9
# half-way through a split, at the same point on every run.
_KILLED_AT = """
import os, signal, sys
import imgprep.convert.image as t
real, seen, stop = t.convert_image, [0], int(sys.argv[1])
def convert_image(*a, **k):
    seen[0] += 1
    if seen[0] > stop:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*a, **k)
t.convert_image = convert_image
from imgprep.cli.commands import cli
cli(sys.argv[2:], prog_name="imgprep")
"""


def _killed_convert(after: int, *args: object) -> None:
    p = subprocess.run([sys.executable, "-c", _KILLED_AT, str(after), "convert", *map(str, args)],
                       env=clean_env(), capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == -signal.SIGKILL, f"exit {p.returncode}: {p.stderr[-2000:]}"


def _cli(*args: object) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.mark.parametrize("fmt", ["shards", "list"])
def test_a_killed_split_beside_a_finished_one_is_reported(sample: Path, tmp_path: Path,
                                                          fmt: str) -> None:
    out = tmp_path / "out"
    # a val split sorted into class folders, as many keep it: labels from the folder names
    convert(ConvertOptions(input=sample / "ILSVRC2012_img_train.tar", out=out, split="val",
                           format=fmt, workers=1))
    train = [sample / "ILSVRC2012_img_train.tar", "-o", out, "--format", fmt, "--shards", 4,
             "-j", 1, "-q"]
    _killed_convert(30, *train)  # 48 images: two shards (12 each) done, the third half-written
    assert not (out / "train.json").exists() and (out / ".imgprep" / "train").is_dir()

    r = _cli("verify", out)
    assert r.exit_code == 1, r.output
    problems = r.stderr.strip().splitlines()
    unfinished = [p for p in problems if "unfinished" in p]
    assert len(unfinished) == 1 and "the train split" in unfinished[0], r.stderr
    assert str(out) in unfinished[0] and "no train.json" in unfinished[0]
    assert "imgprep convert" in unfinished[0] and "--split val" in unfinished[0]
    if fmt == "shards":
        assert "2 task records" in unfinished[0] and "1 temporary file" in unfinished[0]
    else:  # one chunk of 1000 lines: no task finished, only the state folder says so
        assert "no task finished" in unfinished[0]
    checked = out / ("val.json" if fmt == "shards" else "val.txt")
    assert r.stdout.startswith(f"{checked}: PROBLEMS") and "unfinished: train" in r.stdout

    r = _cli("verify", out, "--json", "-q")
    assert r.exit_code == 1
    s = json.loads(r.stdout)
    assert (s["ok"], s["unfinished"], s["samples"]) == (False, ["train"], 48)

    r = _cli("verify", out, "--split", "val")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"{checked}: OK") and "unfinished" not in r.output

    r = _cli("verify", out, "--split", "train")  # nothing finished to check: could not run
    one_line_error(r, 3, str(out), "no manifest", "train split", "unfinished")

    done = subprocess.run([sys.executable, "-m", "imgprep", "convert", *map(str, train)],
                          env=clean_env(), capture_output=True, text=True, timeout=120,
                          check=False)  # what the message says to do
    assert done.returncode == 0, done.stderr
    r = _cli("verify", out, "--json", "-q")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["unfinished"] == []


@pytest.mark.parametrize("fmt", ["shards", "list"])
def test_a_folder_with_only_a_killed_split_cannot_be_verified(sample: Path, tmp_path: Path,
                                                              fmt: str) -> None:
    out = tmp_path / "out"
    _killed_convert(5, sample / "ILSVRC2012_img_train.tar", "-o", out, "--format", fmt,
                    "-j", 1, "-q")
    r = _cli("verify", out)
    line = one_line_error(r, 3, str(out), "no manifest", "the train split", "unfinished",
                          "imgprep convert")
    assert "not an imgprep folder" not in line and r.stdout == ""


def _no_progress_bar(stderr: str) -> None:
    """No tqdm line ("verify: 0img [00:00, ?img/s]"), empty or not."""
    assert not stderr.startswith("verify"), stderr
    assert not any(s in stderr for s in ("img/s", "it/s", "0img", "\r")), stderr


def test_a_folder_that_was_never_converted_is_not_an_imgprep_folder(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    stray = tmp_path / "photos"
    (stray / "n01440764").mkdir(parents=True)
    (stray / "n01440764" / "a.JPEG").write_bytes(jpeg())
    (stray / "notes.txt").write_text("not a label list\n")
    for folder in (empty, stray):
        for extra in ((), ("--split", "val"), ("--json",)):
            r = _cli("verify", folder, *extra)
            line = one_line_error(r, 3, str(folder), "not an imgprep folder", "imgprep convert",
                                  "<split>.json")
            assert "did not finish" not in line
            _no_progress_bar(r.stderr)
            assert r.stdout == ""
    with pytest.raises(ManifestError, match="not an imgprep folder"):
        verify(empty)


def test_the_parent_of_a_converted_folder_is_named_in_the_message(
        converted: dict[str, Path]) -> None:
    parent = converted["shards"].parent
    r = _cli("verify", parent)
    one_line_error(r, 3, str(parent), "not an imgprep folder", str(converted["shards"]))


def test_info_and_preview_say_the_same_of_a_foreign_folder(tmp_path: Path) -> None:
    for args in (("info", tmp_path), ("preview", tmp_path, "-o", tmp_path / "x.png")):
        one_line_error(_cli(*args), 3, str(tmp_path), "not an imgprep folder", "no manifest")


def test_a_split_stopped_by_bad_images_says_so(bad_sample: Path, tmp_path: Path) -> None:
    s = convert(ConvertOptions(input=bad_sample / "ILSVRC2012_img_train.tar", out=tmp_path,
                               workers=1))
    assert not s.complete and not (tmp_path / "train.json").exists()
    with pytest.raises(ManifestError, match="unfinished") as e:
        verify(tmp_path)
    assert "more bad images than --max-errors" in str(e.value)
    assert "train-errors.jsonl" in str(e.value)
