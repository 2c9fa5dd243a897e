"""The loader's shared ring (``loaders.ring``): a worker holds at most its slots until the main
process copies a batch out (or, handed over in place, until the next batch is asked for), a
new iteration releases a worker blocked on the old one, tickets of an abandoned iteration are
dropped, batches come out in order (NCHW-shaped, from channels_last slots too), and a dead
worker is seen as dead (a zombie too). Workers are forked processes, as the DataLoader's
are."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

from loaders import ring as ring_module
from loaders.ring import Ring, is_dead

FORK = mp.get_context("fork")
TIMEOUT = 30.0
SLOTS, BATCH, SIZE = 3, 2, 4


def wait_until(what: str, cond: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def _worker(ring: Ring, tickets: Any, generation: int, batches: int) -> None:
    """What a loader worker does: take a slot, fill it, hand over a ticket; report how it
    stopped (``done``, or ``abandoned`` when ``acquire`` says the iteration is over)."""
    ring.begin(0)
    for b in range(batches):
        ring.note(0, b)  # about to wait for slot b
        if not ring.acquire(0, generation):
            tickets.put(("abandoned", b))
            return
        ring.slot_array(0, b % SLOTS, BATCH)[:] = b + 1
        tickets.put((generation, 0, b % SLOTS, BATCH))
    tickets.put(("done", batches))


@pytest.fixture
def worker() -> Iterator[Callable[..., tuple[Any, Any]]]:
    procs: list[Any] = []

    def start(ring: Ring, generation: int, batches: int) -> tuple[Any, Any]:
        tickets = FORK.Queue()
        p = FORK.Process(target=_worker, args=(ring, tickets, generation, batches), daemon=True)
        p.start()
        procs.append(p)
        return p, tickets
    yield start
    for p in procs:
        p.kill()
        p.join(TIMEOUT)


def test_a_worker_holds_at_most_its_slots_until_one_is_copied_out(
        worker: Callable[..., tuple[Any, Any]]) -> None:
    ring = Ring(1, SLOTS, BATCH, SIZE)
    generation = ring.new_iteration()
    proc, tickets = worker(ring, generation, SLOTS + 2)
    got = [tickets.get(timeout=TIMEOUT) for _ in range(SLOTS)]
    assert [t[2] for t in got] == list(range(SLOTS))
    wait_until("the worker waits for a fourth slot", lambda: ring.making(0) == SLOTS)
    time.sleep(0.3)
    with pytest.raises(queue.Empty):  # every slot is full: it waits
        tickets.get(timeout=0.2)
    assert ring.pid(0) == proc.pid

    batch = ring.take(0, 0, BATCH, pin=False)  # the first batch out frees its slot
    assert batch.shape == (BATCH, 3, SIZE, SIZE) and bool((batch == 1).all())
    assert tickets.get(timeout=TIMEOUT) == (generation, 0, 0, BATCH)
    assert int(ring.slot_array(0, 0, BATCH)[0, 0, 0, 0]) == SLOTS + 1  # slot 0 reused
    assert bool((batch == 1).all())  # the copy taken out is the worker's first batch still


def test_a_new_iteration_releases_a_worker_blocked_in_the_abandoned_one(
        worker: Callable[..., tuple[Any, Any]]) -> None:
    ring = Ring(1, SLOTS, BATCH, SIZE)
    old = ring.new_iteration()
    _, tickets = worker(ring, old, SLOTS + 5)
    for _ in range(SLOTS):
        tickets.get(timeout=TIMEOUT)
    wait_until("the worker waits for a free slot", lambda: ring.making(0) == SLOTS)
    new = ring.new_iteration()
    assert new == old + 1 == ring.generation
    assert tickets.get(timeout=TIMEOUT) == ("abandoned", SLOTS)


def test_counters_round_trip_and_a_new_iteration_resets_the_skipped_count() -> None:
    ring = Ring(2, SLOTS, BATCH, SIZE, pools=3)
    ring.set_epoch(7, (11, 0, 5), skip=4)
    assert ring.epoch() == (7, (11, 0, 5), 4)
    ring.add_skipped(0, 2)
    ring.add_skipped(1, 3)
    ring.add_skipped(1, 1)
    assert ring.skipped() == 6
    ring.note(1, 9)
    assert (ring.making(0), ring.making(1)) == (0, 9)
    g = ring.generation
    assert ring.new_iteration() == g + 1
    assert ring.skipped() == 0
    assert ring.epoch() == (7, (11, 0, 5), 4)  # the plan stays until set_epoch


def _labels(*values: int) -> bytes:
    return np.asarray(values, dtype=np.int64).tobytes()


def test_batches_come_out_in_order_and_tickets_of_an_old_iteration_are_dropped() -> None:
    ring = Ring(1, SLOTS, BATCH, SIZE)
    old = ring.new_iteration()
    gen = ring.new_iteration()
    for slot in range(SLOTS):
        ring.slot_array(0, slot, BATCH)[:] = 10 + slot
    items = [
        (2, (gen, 0, 2, BATCH), _labels(4, 5)),
        (0, (old, 0, 1, BATCH), _labels(9, 9)),  # a batch of the abandoned iteration
        (1, (gen, 0, 1, 1), _labels(2)),
        (0, (gen, 0, 0, BATCH), _labels(0, 1)),
    ]
    out = list(ring.in_order(items, gen, pin=False))
    assert [labels.tolist() for _, labels in out] == [[0, 1], [2], [4, 5]]
    assert [int(images[0, 0, 0, 0]) for images, _ in out] == [10, 11, 12]
    assert [len(images) for images, _ in out] == [BATCH, 1, BATCH]


def test_without_workers_batches_pass_through_in_order_from_the_first_asked() -> None:
    ring = Ring(0, SLOTS, BATCH, SIZE)
    assert ring.data is None
    items = [(n, torch.full((1,), n), torch.tensor([n])) for n in (4, 3, 5)]
    out = list(ring.in_order(items, ring.generation, pin=False, first=3))
    assert [int(labels[0]) for _, labels in out] == [3, 4, 5]


def test_a_dead_worker_is_seen_as_dead_even_before_it_is_reaped() -> None:
    assert not is_dead(0) and not is_dead(-1)  # no pid recorded yet
    assert not is_dead(os.getpid())
    p = subprocess.Popen(["sleep", "60"])
    try:
        assert not is_dead(p.pid)
        os.kill(p.pid, signal.SIGKILL)
        wait_until("the killed child is a zombie", lambda: _state(p.pid) == "Z")
        assert is_dead(p.pid)  # a zombie: exited, not reaped yet
    finally:
        p.kill()
        p.wait(TIMEOUT)
    assert is_dead(p.pid)  # reaped: gone from /proc


def test_the_pid_a_worker_records_is_dead_once_it_is_killed(
        worker: Callable[..., tuple[Any, Any]]) -> None:
    ring = Ring(1, SLOTS, BATCH, SIZE)
    proc, tickets = worker(ring, ring.new_iteration(), SLOTS + 1)
    tickets.get(timeout=TIMEOUT)
    pid = ring.pid(0)
    assert pid == proc.pid and not is_dead(pid)
    os.kill(pid, signal.SIGKILL)
    proc.join(TIMEOUT)
    assert is_dead(ring.pid(0))


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0].decode()
    except FileNotFoundError:
        return "gone"


def test_a_batch_handed_over_in_place_keeps_its_slot_until_the_next_is_asked_for(
        worker: Callable[..., tuple[Any, Any]]) -> None:
    """In place: the batch is a view of its slot; the worker cannot rewrite the slot while
    the batch is held (it waits for a free one), and does once the next batch is asked for."""
    ring = Ring(1, SLOTS, BATCH, SIZE)
    generation = ring.new_iteration()
    proc, tickets = worker(ring, generation, SLOTS + 2)
    items = ((b, tickets.get(timeout=TIMEOUT), _labels(b, b)) for b in range(SLOTS + 2))
    batches = ring.in_order(items, generation, pin=False, in_place=True)
    images, labels = next(batches)
    assert images.shape == (BATCH, 3, SIZE, SIZE) and labels.tolist() == [0, 0]
    assert images.data_ptr() == ring.data[0, 0].data_ptr()  # not copied
    wait_until("the worker waits for a free slot", lambda: ring.making(0) == SLOTS)
    time.sleep(0.3)
    assert bool((images == 1).all())  # held: slot 0 is not given back
    second, _ = next(batches)  # slot 0 goes back: the worker decodes batch SLOTS into it
    assert bool((second == 2).all())
    wait_until("the worker rewrites slot 0", lambda: bool((images == SLOTS + 1).all()))
    assert [int(b[0, 0, 0, 0]) for b, _ in batches] == [3, SLOTS + 1, SLOTS + 2]
    assert tickets.get(timeout=TIMEOUT) == ("done", SLOTS + 2)


def test_a_slot_held_in_place_by_an_abandoned_iteration_is_not_given_back_later() -> None:
    """A new iteration resets the workers' slots; an old in-place iterator resumed after it
    must not give one back on top (a worker could then rewrite a slot still held)."""
    ring = Ring(1, SLOTS, BATCH, SIZE)
    old = ring.new_iteration()
    ring.begin(0)
    assert ring.acquire(0, old) and ring.acquire(0, old)
    items = [(0, (old, 0, 0, BATCH), _labels(0, 0)), (1, (old, 0, 1, BATCH), _labels(1, 1))]
    batches = ring.in_order(items, old, pin=False, in_place=True)
    next(batches)
    ring.new_iteration()  # posts one token, as for a worker blocked in the old iteration
    free = ring._free[0].get_value()
    next(batches)  # the old iterator goes on: it gives nothing back
    assert ring._free[0].get_value() == free


def test_channels_last_slots_hold_rows_as_h_w_3_and_batches_leave_nchw_shaped() -> None:
    ring = Ring(1, SLOTS, BATCH, SIZE, channels_last=True)
    generation = ring.new_iteration()
    rows = ring.slot_array(0, 0, BATCH)
    assert rows.shape == (BATCH, SIZE, SIZE, 3)
    rows[...] = np.arange(3, dtype=np.uint8)  # channel c holds c everywhere
    for in_place in (False, True):
        items = [(0, (generation, 0, 0, BATCH), _labels(0, 1))]
        images, _ = next(ring.in_order(items, generation, pin=False, in_place=in_place))
        assert images.shape == (BATCH, 3, SIZE, SIZE)
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert [int(images[:, c].min()) for c in range(3)] == [0, 1, 2]
        assert [int(images[:, c].max()) for c in range(3)] == [0, 1, 2]


class FakeCudart:
    """Stands in for ``torch.cuda.cudart()``: records each registration, answers ``code``."""

    def __init__(self, code: int) -> None:
        self.code, self.registered, self.unregistered = code, [], []  # type: ignore[var-annotated]

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802
        self.registered.append((ptr, size, flags))
        return self.code

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
        self.unregistered.append(ptr)
        return 0


@pytest.mark.parametrize("code", [0, 1])
def test_slots_are_page_locked_once_when_the_first_batch_arrives(
        worker: Callable[..., tuple[Any, Any]], monkeypatch: pytest.MonkeyPatch,
        code: int) -> None:
    """lock_pages asks; the first batch of the next pass (its worker forked by then) locks
    the whole ring once, a second pass does not lock it again, and a refusal (code 1) leaves
    page_locked False (the next pass asks again) and its CUDA error taken; the lock is
    given back with the ring."""
    cudart, taken = FakeCudart(code), []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    monkeypatch.setattr(ring_module, "_take_cuda_error", lambda: taken.append(1))
    ring = Ring(1, SLOTS, BATCH, SIZE)
    assert ring.lock_pages() and not ring.page_locked and not cudart.registered
    for _ in range(2):
        generation = ring.new_iteration()
        _, tickets = worker(ring, generation, 2)
        items = ((b, tickets.get(timeout=TIMEOUT), _labels(b, b)) for b in range(2))
        got = [int(x[0, 0, 0, 0]) for x, _ in ring.in_order(items, generation, pin=False,
                                                              in_place=True)]
        assert got == [1, 2] and ring.page_locked == (code == 0)
        assert ring.lock_pages()  # locked already, or asked again
    size = SLOTS * BATCH * 3 * SIZE * SIZE
    assert cudart.registered == [(ring.data.data_ptr(), size, 0)] * (1 if code == 0 else 2)
    assert len(taken) == len(cudart.registered) - (code == 0)  # each refusal's error taken
    ptr = ring.data.data_ptr()
    del ring
    assert cudart.unregistered == ([ptr] if code == 0 else [])


def test_without_workers_or_cuda_nothing_is_page_locked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not Ring(1, SLOTS, BATCH, SIZE).lock_pages()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not Ring(0, SLOTS, BATCH, SIZE).lock_pages()
