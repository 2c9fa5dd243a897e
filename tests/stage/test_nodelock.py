"""The node lock and copier-liveness protocol on its own: one lock holder per folder, a lock
the kernel drops when its holder dies, a waiter that creates nothing, tells a dead or failed
copier of its own launch from one not started yet, and never waits past its timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from imgprep.errors import StageError, WaitTimeout
from imgprep.job.world import World
from imgprep.stage import nodelock
from imgprep.stage.nodelock import (
    copier_gone,
    held,
    lock_free,
    lock_path,
    read_json,
    record,
    record_path,
    state_dir,
    try_lock,
    wait_for_copier,
)

TIMEOUT = 30
NODE = World(rank=0, world_size=2, local_rank=0, local_world_size=2, node_rank=0, num_nodes=1,
             launcher="torchrun")


@pytest.fixture
def dst(tmp_path: Path) -> Path:
    d = tmp_path / "dst"
    state_dir(d).mkdir(parents=True)
    return d


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copier must look dead for 0.3 s (not 3) before a waiter gives up on it."""
    monkeypatch.setattr(nodelock, "DEAD_GRACE", 0.3)


def test_one_holder_at_a_time_and_released_on_exit(dst: Path) -> None:
    assert lock_free(dst)
    with held(dst, 0, time.monotonic() + 1, 1):
        assert not lock_free(dst)
        other = os.open(lock_path(dst), os.O_RDWR)
        try:
            assert not try_lock(other, dst, 0)  # a second open of the file is refused
        finally:
            os.close(other)
    assert lock_free(dst)


def test_a_second_copier_times_out_naming_the_holder(dst: Path) -> None:
    with held(dst, 0, time.monotonic() + 1, 1):
        record(dst, NODE, "copying")
        t0 = time.monotonic()
        with pytest.raises(WaitTimeout) as info:
            with held(dst, 0, time.monotonic() + 0.5, 0.5):
                pytest.fail("two holders of one lock")
        assert time.monotonic() - t0 < 5
    msg = str(info.value)
    for words in ("node 0", "waited 0.5 s", str(lock_path(dst)), f"pid {os.getpid()}", "rerun"):
        assert words in msg, (words, msg)


def test_the_kernel_drops_the_lock_of_a_killed_holder(dst: Path) -> None:
    code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(lock_path(dst))],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        assert not lock_free(dst)
        proc.kill()
        proc.wait(timeout=TIMEOUT)
        assert lock_free(dst)
    finally:
        proc.kill()
        proc.wait(timeout=TIMEOUT)


def test_lock_free_creates_nothing(tmp_path: Path) -> None:
    assert lock_free(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()


def test_record_says_who_and_how(dst: Path) -> None:
    record(dst, NODE, "failed", "disk full")
    rec = json.loads(record_path(dst).read_text())
    assert (rec["pid"], rec["ppid"], rec["state"], rec["error"], rec["node_rank"]) == \
        (os.getpid(), os.getppid(), "failed", "disk full", 0)


def test_read_json_forgives_missing_and_damaged_files(dst: Path) -> None:
    assert read_json(dst / "missing.json") is None
    (dst / "bad.json").write_bytes(b"{\"half")
    assert read_json(dst / "bad.json") is None


@pytest.mark.parametrize("state, words", [("copying", "died before finishing"),
                                          ("failed", "failed staging into")])
def test_copier_gone_when_lock_free_and_record_says_so(dst: Path, state: str,
                                                       words: str) -> None:
    record(dst, NODE, state, "the reason")
    why = copier_gone(dst, NODE)
    assert why is not None and words in why and str(dst) in why
    assert f"pid {os.getpid()}" in why and "node 0" in why
    if state == "failed":
        assert "the reason" in why


def test_copier_not_gone_while_it_holds_the_lock_or_is_done(dst: Path) -> None:
    record(dst, NODE, "copying")
    with held(dst, 0, time.monotonic() + 1, 1):
        assert copier_gone(dst, NODE) is None
    record(dst, NODE, "done")
    assert copier_gone(dst, NODE) is None


def test_copier_of_another_launch_is_not_this_launchs(dst: Path) -> None:
    """A record left by an earlier job (another parent process) says nothing about this one's
    copier, which may not have started yet."""
    record(dst, NODE, "failed", "old")
    rec = json.loads(record_path(dst).read_text())
    record_path(dst).write_text(json.dumps({**rec, "ppid": rec["ppid"] + 1}))
    assert copier_gone(dst, NODE) is None
    record_path(dst).write_text(json.dumps({**rec, "host": "elsewhere"}))
    assert copier_gone(dst, NODE) is None


def test_waiter_returns_once_staged(dst: Path) -> None:
    looks = iter([False, False, True])
    wait_for_copier(lambda: next(looks), dst, NODE, TIMEOUT, time.monotonic())


def test_waiter_fails_after_the_grace_when_its_copier_died(dst: Path, fast: None) -> None:
    record(dst, NODE, "copying")  # and nobody holds the lock: it died
    t0 = time.monotonic()
    with pytest.raises(StageError, match="died before finishing"):
        wait_for_copier(lambda: False, dst, NODE, TIMEOUT, t0)
    assert 0.3 <= time.monotonic() - t0 < 5


def test_waiter_times_out_when_no_copier_starts(dst: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        wait_for_copier(lambda: False, dst, NODE, 0.5, t0)
    assert time.monotonic() - t0 < 5
    assert "never started" in str(info.value) and "--timeout" in str(info.value)


def test_waiter_times_out_while_a_copier_holds_the_lock(dst: Path) -> None:
    with held(dst, 0, time.monotonic() + 1, 1):
        with pytest.raises(WaitTimeout, match="is still copying"):
            wait_for_copier(lambda: False, dst, NODE, 0.5, time.monotonic())
