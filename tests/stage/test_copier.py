"""The copier's thread pool (imgprep.stage.pool.parallel) and its stall watch: results in
order, the first real error raised and no item started after it, and a call stuck for good
(a hung read) ends the wait with a StageError instead of holding it, whether or not another
call failed."""

from __future__ import annotations

import random
import threading
import time

import pytest

from imgprep.errors import StageError
from imgprep.stage.pool import CopyWatch, Stopped, parallel


def test_results_come_in_item_order() -> None:
    rng = random.Random(0)
    delays = [rng.uniform(0, 0.01) for _ in range(40)]

    def slow_square(i: int) -> int:
        time.sleep(delays[i])
        return i * i

    assert parallel(slow_square, list(range(40)), 3, threading.Event()) == \
        [i * i for i in range(40)]


def test_the_first_real_error_is_raised_and_no_item_starts_after_it() -> None:
    started: list[int] = []
    stop = threading.Event()

    def work(i: int) -> int:
        started.append(i)
        if i == 3:
            raise ValueError("item 3 is bad")
        if i == 2:  # a running call that sees the stop ends as the copier's calls do
            while not stop.is_set():
                time.sleep(0.01)
            raise Stopped
        time.sleep(0.02)
        return i

    with pytest.raises(ValueError, match="item 3 is bad"):
        parallel(work, list(range(50)), 2, stop)
    assert stop.is_set()
    assert max(started) < 10, started  # the rest never started


def test_a_stuck_call_ends_the_wait_with_the_watch_s_message() -> None:
    release = threading.Event()
    watch = CopyWatch(0.3, 4, lambda k: None)

    def copy(i: int) -> int:
        def body() -> int:
            watch.tick(10)
            if i == 1:
                release.wait(60)  # a read that never returns
            return i
        return watch.copying(f"shard-{i}.tar", body)

    t0 = time.monotonic()
    try:
        with pytest.raises(StageError) as info:
            parallel(copy, [0, 1], 2, threading.Event(), watch.stuck)
    finally:
        release.set()
    assert time.monotonic() - t0 < 10
    msg = str(info.value)
    assert msg.startswith("node 4: stuck copying shard-1.tar from the file server: no byte "
                          "moved for"), msg
    assert "--stall-timeout" in msg


def test_an_error_beside_a_stuck_call_is_raised_without_waiting_for_it() -> None:
    release = threading.Event()
    watch = CopyWatch(0.3, 0, lambda k: None)

    def copy(i: int) -> int:
        if i == 0:
            raise OSError("disk full")
        release.wait(60)
        return i

    t0 = time.monotonic()
    try:
        with pytest.raises(OSError, match="disk full"):
            parallel(copy, [0, 1], 2, threading.Event(), watch.stuck)
    finally:
        release.set()
    assert time.monotonic() - t0 < 10


def test_bytes_moving_keep_the_watch_quiet() -> None:
    watch = CopyWatch(0.3, 0, lambda k: None)

    def copy(i: int) -> int:
        for _ in range(12):  # 1.2 s of slow but steady progress, 4x the limit
            time.sleep(0.1)
            watch.tick(1)
        return i

    assert parallel(copy, [0], 1, threading.Event(), watch.stuck) == [0]
