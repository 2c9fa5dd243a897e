"""A refused run cleans up what it made: the unfinished files of a staging copy (locks,
temporary files) and the folders it created go; the finished files of a staging copy stay for
a rerun, and the refusal says where they are, how large, and how to remove them."""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import pytest

from imgprep.fsutil import TMP_PREFIX
from imgprep.inputs.fakes import SampleSpec, make_fake
from imgprep.inputs.spool import LOCK_PREFIX, tidy_spool, write_spool
from tests.support.cli import invoke

SPEC = SampleSpec(classes=3, per_class=4, val=4, test=2, seed=3)
FAST = ("--size", "32", "-q", "-j", "1")


def leftovers(out: Path) -> list[str]:
    """Lock and temporary files anywhere under ``out``."""
    return sorted(p.name for p in out.rglob("*")
                  if p.name.startswith((LOCK_PREFIX, TMP_PREFIX)))


def test_a_refused_parquet_run_names_the_staging_copy_it_keeps(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    src = Path(make_fake("hf-parquet", tmp_path / "src", SPEC).inputs[0])
    out = tmp_path / "out"
    assert invoke("convert", src, "-o", out, *FAST, "--split", "train").exit_code == 0
    assert not (out / ".imgprep" / "train" / "spool").exists()  # gone with the manifest
    r = invoke("convert", src, "-o", out, *FAST, "--split", "train", "--size", "48")
    assert r.exit_code == 3 and "already holds a finished train split" in r.stderr
    spool = out / ".imgprep" / "train" / "spool"
    files = sorted(spool.glob("*.spool"))
    assert len(files) == 3  # the train files, made by the refused run
    size = sum(p.stat().st_size for p in files) / 1e6
    assert (f"the staging copy of the train split is kept for a rerun: 3 files, {size:.1f} MB "
            f"in {spool}; a rerun of the same input reuses it; if you will not rerun, remove "
            f"it: rm -r {spool}") in r.stderr
    assert leftovers(out) == []
    again = invoke("convert", src, "-o", out, *FAST, "--split", "train", "--size", "48",
                   "--overwrite")
    assert again.exit_code == 0, again.output
    assert not spool.exists()


def test_a_refused_tar_gz_leaves_no_lock_and_no_folder(tmp_path: Path) -> None:
    src = Path(make_fake("hf-targz", tmp_path / "src", SPEC).inputs[0])
    archive = src / "data" / "val_images.tar.gz"
    archive.write_bytes(archive.read_bytes()[:-200])  # cut short: refused while spooled
    out = tmp_path / "out"
    r = invoke("convert", src, "-o", out, *FAST, "--split", "val")
    assert r.exit_code == 3 and "damaged or cut short" in r.stderr, r.output
    assert "staging copy" not in r.stderr  # nothing finished was kept
    assert not out.exists()


def test_a_refused_tar_gz_keeps_the_archives_it_finished(tmp_path: Path) -> None:
    src = Path(make_fake("hf-targz", tmp_path / "src", SPEC).inputs[0])
    archive = sorted((src / "data").glob("train_images_*.tar.gz"))[1]
    archive.write_bytes(archive.read_bytes()[:-200])
    out = tmp_path / "out"
    r = invoke("convert", src, "-o", out, *FAST, "--split", "train")
    assert r.exit_code == 3 and archive.name in r.stderr
    assert "the staging copy of the train split is kept for a rerun: 1 file," in r.stderr
    assert leftovers(out) == []
    assert [p.name for p in (out / ".imgprep" / "train" / "spool").iterdir()] == [
        "00000-train_images_0.tar.gz.spool"]


def _hold(lock: Path, ready: Any, done: Any) -> None:
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    done.wait(30)


def test_tidying_leaves_what_another_process_is_writing(tmp_path: Path) -> None:
    folder = tmp_path / ".imgprep" / "train" / "spool"
    folder.mkdir(parents=True)
    write_spool(folder / "00000-a.spool", iter([("x", b"12345")]))
    for name in ("00001-b.spool", "00002-c.spool"):
        (folder / f"{LOCK_PREFIX}{name}").touch()
        (folder / f"{TMP_PREFIX}{name}").write_bytes(b"half")
    ctx = mp.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(folder / f"{LOCK_PREFIX}00002-c.spool", ready,
                                             done))
    holder.start()
    try:
        assert ready.wait(30)
        kept = tidy_spool(folder)
    finally:
        done.set()
        holder.join(30)
    assert (kept.files, kept.bytes) == (1, (folder / "00000-a.spool").stat().st_size)
    assert sorted(p.name for p in folder.iterdir()) == [
        f"{LOCK_PREFIX}00002-c.spool", f"{TMP_PREFIX}00002-c.spool", "00000-a.spool"]
