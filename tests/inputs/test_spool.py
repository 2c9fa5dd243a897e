"""The spool: a source without random access copied once into a file read by offset."""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from imgprep.errors import SourceFormatError, WaitTimeout
from imgprep.inputs.spool import (
    LOCK_PREFIX,
    SpoolJob,
    is_finished,
    read_index,
    remove_spool,
    spool_all,
    spool_bytes,
    spool_path,
    write_spool,
)


def _items(source: Path, max_bytes: int | None = None) -> Iterator[tuple[str, bytes]]:
    """A source file of lines 'name size': each item is size bytes derived from its name."""
    for line in source.read_text().splitlines():
        name, size = line.split()
        if name == "FAIL":
            raise SourceFormatError(f"{source}: damaged at {size}")
        if name == "SLOW":
            time.sleep(float(size))
            continue
        yield name, (name.encode() * int(size))[:int(size)]


def _sources(tmp_path: Path, count: int, per: int = 5) -> list[SpoolJob]:
    src = tmp_path / "src"
    src.mkdir(parents=True, exist_ok=True)
    folder = tmp_path / "out" / ".imgprep" / "train" / "spool"
    jobs = []
    for i in range(count):
        p = src / f"part-{i}.txt"
        p.write_text("".join(f"k{i}_{j} {10 + 7 * j}\n" for j in range(per)))
        jobs.append(SpoolJob(source=p, spool=spool_path(folder, i, p), read=_items))
    return jobs


def test_a_spool_file_gives_back_every_item_by_offset(tmp_path: Path) -> None:
    items = [("a.JPEG", b"x" * 10), ("b/c.JPEG", b""), ("é.jpg", b"yz" * 300)]
    path = tmp_path / "one.spool"
    assert write_spool(path, iter(items)) == 3
    index = read_index(path)
    data = path.read_bytes()
    assert index.names == ("a.JPEG", "b/c.JPEG", "é.jpg")
    got = [data[o:o + s] for o, s in zip(index.offset.tolist(), index.size.tolist(),
                                         strict=True)]
    assert got == [b for _, b in items]
    again = tmp_path / "two.spool"
    write_spool(again, iter(items))
    assert again.read_bytes() == data  # the same source gives the same bytes


def test_a_spool_file_cut_short_is_not_finished(tmp_path: Path) -> None:
    path = tmp_path / "one.spool"
    write_spool(path, iter([("a", b"abc"), ("b", b"def")]))
    assert is_finished(path)
    path.write_bytes(path.read_bytes()[:-1])
    assert not is_finished(path)
    with pytest.raises(OSError, match="not a finished spool file"):
        read_index(path)
    assert not is_finished(tmp_path / "missing.spool")


def test_spooling_is_the_same_for_any_worker_count(tmp_path: Path) -> None:
    one = _sources(tmp_path, 4)
    two = [SpoolJob(source=j.source, spool=tmp_path / "two" / j.spool.name, read=_items)
           for j in one]
    assert spool_all(one, workers=1) == 4
    assert spool_all(two, workers=2, start=3) == 4
    for a, b in zip(one, two, strict=True):
        assert a.spool.read_bytes() == b.spool.read_bytes()
    assert spool_all(one, workers=2) == 0  # all finished: nothing read again


def test_a_source_that_fails_leaves_no_spool_file_and_a_rerun_finishes(tmp_path: Path) -> None:
    jobs = _sources(tmp_path, 2)
    good = jobs[1].source.read_text()
    jobs[1].source.write_text(good + "FAIL 3\n")
    with pytest.raises(SourceFormatError, match="damaged at 3"):
        spool_all(jobs, workers=1)
    assert is_finished(jobs[0].spool) and not jobs[1].spool.exists()
    assert not [p for p in jobs[1].spool.parent.iterdir() if p.name.startswith(".tmp-")]
    jobs[1].source.write_text(good)
    assert spool_all(jobs, workers=1) == 1


def _spool_in_child(jobs: list[SpoolJob]) -> None:
    spool_all(jobs, workers=1)


@pytest.mark.timeout(60)
def test_a_rerun_after_kill_keeps_finished_spool_files(tmp_path: Path) -> None:
    jobs = _sources(tmp_path, 3)
    jobs[1].source.write_text(jobs[1].source.read_text() + "SLOW 30\n")
    child = mp.get_context("fork").Process(target=_spool_in_child, args=(jobs,))
    child.start()
    tmp = jobs[1].spool.with_name(f".tmp-{jobs[1].spool.name}")
    deadline = time.monotonic() + 30
    while not tmp.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert is_finished(jobs[0].spool) and not is_finished(jobs[1].spool)
    first = jobs[0].spool.stat().st_ino
    jobs[1].source.write_text(jobs[1].source.read_text().replace("SLOW 30\n", ""))
    assert spool_all(jobs, workers=1) == 2  # the one cut short and the one never begun
    assert jobs[0].spool.stat().st_ino == first
    assert all(is_finished(j.spool) for j in jobs)


def _hold_lock(path: Path, ready: Any) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    time.sleep(60)


@pytest.mark.timeout(60)
def test_a_file_another_process_spools_is_waited_for_and_redone_when_it_dies(
        tmp_path: Path) -> None:
    jobs = _sources(tmp_path, 2)
    folder = jobs[0].spool.parent
    folder.mkdir(parents=True)
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_lock,
                         args=(folder / f"{LOCK_PREFIX}{jobs[0].spool.name}", ready))
    holder.start()
    assert ready.wait(10)
    with pytest.raises(WaitTimeout, match="another process to spool"):
        spool_all(jobs, workers=1, wait_timeout=1)
    assert is_finished(jobs[1].spool) and not is_finished(jobs[0].spool)
    assert holder.pid is not None
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    assert spool_all(jobs, workers=1) == 1
    assert is_finished(jobs[0].spool)


def test_the_spool_cost_and_its_removal(tmp_path: Path) -> None:
    jobs = _sources(tmp_path, 3)
    total = sum(j.source.stat().st_size for j in jobs)
    assert spool_bytes(jobs) == total
    spool_all(jobs[:1], workers=1)
    assert spool_bytes(jobs) == total - jobs[0].source.stat().st_size
    folder = jobs[0].spool.parent
    outside = tmp_path / "keep.txt"
    outside.write_text("keep")
    (folder / "link").symlink_to(outside)
    assert remove_spool(folder) == 3  # the spool file, its lock file, the link
    assert not folder.exists() and outside.read_text() == "keep"


def test_a_spool_of_another_source_file_is_not_reused(tmp_path: Path) -> None:
    jobs = _sources(tmp_path, 2)
    assert spool_all(jobs, workers=1) == 2
    jobs[1].source.write_text("other_0 3\n")  # another download under the same name
    assert spool_all(jobs, workers=1) == 1
    assert read_index(jobs[1].spool).names == ("other_0",)


def test_without_flock_each_writer_uses_a_temporary_name_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from imgprep.inputs import spool

    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(spool.fcntl, "flock", no_flock)
    opened: list[str] = []
    real_open = spool._private_open

    def spy(final: Path) -> Any:
        opened.append(final.name)
        return real_open(final)

    monkeypatch.setattr(spool, "_private_open", spy)
    jobs = _sources(tmp_path, 2)
    assert spool_all(jobs, workers=1) == 2
    assert opened == [j.spool.name for j in jobs]
    assert all(is_finished(j.spool) for j in jobs)
    assert not [p for p in jobs[0].spool.parent.iterdir() if p.name.startswith(".tmp-")]
