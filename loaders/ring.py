"""Shared memory between a loader and its worker processes: batch slots and small counters.

Workers decode batches straight into their own ring of slots (made once, before they start)
and send only ``(generation, worker, slot, rows, size)``: PyTorch's default would move each
batch into a fresh shared-memory segment, a copy and thousands of page faults per batch.
A slot holds ``batch_size`` rows of the largest output size the loader makes (a size
schedule's largest); a batch of a smaller size fills the front of its slot, contiguous, so
the workers live through every size change of the schedule (a restart per size would cost
their start-up each time: docs/loaders.md, "Size schedules").

Protocol, chosen so that a killed worker can leave nothing held:
- each worker has a semaphore counting its free slots; the worker takes one before decoding,
  the main process gives it back once it has copied the batch out, or (batches handed over
  in place) once the batch's consumer asks for the next one. The main process never waits
  on a semaphore, so a dead worker cannot stall it. Slots are given back in the order each
  worker filled them, which is the order it takes them in (``made % slots``);
- a new iteration bumps the shared *generation* and posts one token to every worker's
  semaphore: a worker blocked on a slot of the abandoned iteration wakes, sees the new
  generation and stops; a worker resets its own semaphore to "all slots free" when it starts
  an iteration (the main process ignores batches of older generations, and gives back no
  slot of an iteration that is no longer the current one);
- counters (epoch, batches to skip, generation, the workers active in the pass, each pool's
  starting position; per worker its pid, the batch it is making, the samples it skipped, and
  the CPU time it spent making batches and their count: ``loaders.sizing``'s look) have one
  writer each: no lock.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import weakref
from collections.abc import Generator, Iterable
from typing import Any

import numpy as np
import torch

from loaders.batch import as_nchw, row_shape, with_draws

_EPOCH, _SKIP, _GENERATION, _ACTIVE, _HEAD = range(5)  # then the pools' starts, the workers
_PER_WORKER = 5  # pid, batch in the making, skipped samples, CPU microseconds, batches made
_PARENT_CHECK_S = 5.0  # a worker blocked on a slot checks this often that its parent lives


class Ring:
    """``workers`` rings of ``slots`` batches (``batch_size`` rows of uint8 pixels, each 3 x
    ``size`` x ``size``, or ``size`` x ``size`` x 3 when ``channels_last``; a batch of a
    smaller size takes the front of its slot), with the counters both sides read (``pools``
    starting positions of an epoch's plan); see the module docstring for the protocol.
    Batches come out NCHW-shaped (``loaders.batch.as_nchw``)."""

    def __init__(self, workers: int, slots: int, batch_size: int, size: int, pools: int = 1, *,
                 channels_last: bool = False) -> None:
        self.workers, self.slots, self.pools = max(1, workers), slots, pools
        self.channels_last, self.size = channels_last, size
        self.state: Any = mp.Array("q", [0] * (_HEAD + pools + _PER_WORKER * self.workers),
                                   lock=False)
        shape = (workers, slots, batch_size, *row_shape(size, channels_last))
        self.data = torch.empty(shape, dtype=torch.uint8).share_memory_() if workers > 0 \
            else None
        self._free = [mp.Semaphore(slots) for _ in range(workers)]
        self._parent = os.getpid()
        self._lock_pages = False  # page-lock the slots for CUDA once the workers run
        self.page_locked = False

    def lock_pages(self) -> bool:
        """Ask for the slots to be page-locked for CUDA (``cudaHostRegister``), so that a
        batch handed over in place copies to a GPU asynchronously, straight from its slot.
        Done by ``in_order`` when the first batch arrives: the workers have been forked by
        then (a page-locked range may be left out of a child's memory). False where there
        are no slots (no workers) or no CUDA device."""
        if not self.page_locked:
            self._lock_pages = self.data is not None and torch.cuda.is_available()
        return self.page_locked or self._lock_pages

    def _page_lock(self) -> None:
        self._lock_pages = False
        assert self.data is not None
        ptr, size = self.data.data_ptr(), self.data.numel()
        cudart = torch.cuda.cudart()
        self.page_locked = int(cudart.cudaHostRegister(ptr, size, 0)) == 0
        if self.page_locked:  # given back before the shared memory is unmapped
            weakref.finalize(self, cudart.cudaHostUnregister, ptr)
        else:
            _take_cuda_error()

    # -- counters
    def set_epoch(self, epoch: int, starts: tuple[int, ...], skip: int) -> None:
        """The next pass: ``epoch``'s plan from ``starts`` (per pool), its first ``skip``
        batches left out."""
        self.state[_EPOCH], self.state[_SKIP] = epoch, skip
        self.state[_HEAD:_HEAD + self.pools] = list(starts)

    def epoch(self) -> tuple[int, tuple[int, ...], int]:
        """(epoch, starts, skip) of the pass ``set_epoch`` set."""
        starts = tuple(int(x) for x in self.state[_HEAD:_HEAD + self.pools])
        return int(self.state[_EPOCH]), starts, int(self.state[_SKIP])

    def set_active(self, workers: int) -> None:
        """The workers that make the next pass's batches (the others sleep through it)."""
        self.state[_ACTIVE] = workers

    def active(self) -> int:
        return int(self.state[_ACTIVE])

    @property
    def generation(self) -> int:
        return int(self.state[_GENERATION])

    def _slot(self, w: int, k: int) -> int:
        return _HEAD + self.pools + _PER_WORKER * w + k

    def pid(self, w: int) -> int:
        return int(self.state[self._slot(w, 0)])

    def making(self, w: int) -> int:
        """The batch worker ``w`` is making (or last made) in the current plan."""
        return int(self.state[self._slot(w, 1)])

    def note(self, w: int, b: int) -> None:
        self.state[self._slot(w, 1)] = b

    def add_skipped(self, w: int, n: int) -> None:
        self.state[self._slot(w, 2)] += n

    def skipped(self) -> int:
        return sum(int(self.state[self._slot(w, 2)]) for w in range(self.workers))

    def add_work(self, w: int, cpu_s: float) -> None:
        """Worker ``w`` made a batch in ``cpu_s`` seconds of its CPU time."""
        self.state[self._slot(w, 3)] += round(cpu_s * 1e6)
        self.state[self._slot(w, 4)] += 1

    def work(self) -> tuple[float, int]:
        """The CPU seconds the workers spent making batches, and the batches, since the ring
        was made."""
        return (sum(int(self.state[self._slot(w, 3)]) for w in range(self.workers)) / 1e6,
                sum(int(self.state[self._slot(w, 4)]) for w in range(self.workers)))

    # -- main process
    def new_iteration(self) -> int:
        """Start an iteration: counters reset, workers of the last one released."""
        for w in range(self.workers):
            self.state[self._slot(w, 2)] = 0
        self.state[_GENERATION] += 1
        for sem in self._free:
            sem.release()  # wakes a worker blocked in an abandoned iteration
        return self.generation

    def in_order(self, items: Iterable[tuple[Any, ...]], generation: int, pin: bool,
                 first: int = 0, in_place: bool = False
                 ) -> Generator[tuple[torch.Tensor, ...], None, None]:
        """The DataLoader's ``(batch number, ring ticket, label bytes[, draws])`` items (or,
        with no workers, ``(number, images, labels[, draws])``) as batches in batch-number
        order from ``first``: each ticket's slot is copied out (``in_place``: handed over as
        a view of the slot, given back when the next batch is asked for), tickets of an
        abandoned iteration are dropped, and batches that arrive early wait for their turn.
        A batch is ``(images, labels)``, or ``(images, labels, draws)`` where its item
        carries draws' bytes (``loaders.mixing``: a uint8 tensor of them)."""
        pending: dict[int, tuple[tuple[torch.Tensor, ...], int]] = {}
        for number, images, labels, *rest in items:
            held = -1  # the worker whose slot holds the batch (in place), else -1
            if not isinstance(images, torch.Tensor):
                gen, w, slot, n, *size = (int(x) for x in images)
                if gen != generation:
                    continue  # a batch of an abandoned iteration
                if self._lock_pages:
                    self._page_lock()
                s = size[0] if size else None
                if in_place:
                    images, held = self.view(w, slot, n, s), w
                else:
                    images = self.take(w, slot, n, pin, s)
                labels = torch.frombuffer(bytearray(labels), dtype=torch.int64)
            pending[int(number)] = (with_draws(images, labels, rest[0] if rest else None), held)
            while first in pending:
                batch, held = pending.pop(first)
                yield batch
                if held >= 0 and self.generation == generation:
                    self._free[held].release()  # its consumer asked for the next batch
                first += 1

    def rows(self, w: int, slot: int, rows: int, size: int | None = None) -> torch.Tensor:
        """The first ``rows`` rows of ``size`` (None: the ring's size) in a slot, as the worker
        writes them (``row_shape``): the front of the slot, contiguous."""
        assert self.data is not None
        if size is None or size == self.size:
            return self.data[w, slot, :rows]
        if not 0 < size <= self.size:
            raise ValueError(f"size {size} does not fit the ring's slots of {self.size} px")
        shape = row_shape(size, self.channels_last)
        return self.data[w, slot].view(-1)[:rows * math.prod(shape)].view(rows, *shape)

    def take(self, w: int, slot: int, rows: int, pin: bool, size: int | None = None
             ) -> torch.Tensor:
        """Copy a batch (of ``size``) out of its slot and free the slot."""
        src = self.rows(w, slot, rows, size)
        out = torch.empty(src.shape, dtype=torch.uint8, pin_memory=pin)
        np.copyto(out.numpy(), src.numpy())  # one memcpy, no OpenMP
        self._free[w].release()
        return as_nchw(out, self.channels_last)

    def view(self, w: int, slot: int, rows: int, size: int | None = None) -> torch.Tensor:
        """A batch (of ``size``) in its slot, NCHW-shaped, not copied; the slot stays taken
        (``in_order`` gives it back)."""
        return as_nchw(self.rows(w, slot, rows, size), self.channels_last)

    # -- worker side
    def begin(self, w: int) -> None:
        """A worker starts an iteration: record its pid, mark every slot free."""
        self.state[self._slot(w, 0)] = os.getpid()
        sem = self._free[w]
        while sem.acquire(block=False):
            pass
        for _ in range(self.slots):
            sem.release()

    def acquire(self, w: int, generation: int) -> bool:
        """Block until worker ``w`` has a free slot; False once the iteration is abandoned
        (or the loader's process is gone)."""
        while not self._free[w].acquire(timeout=_PARENT_CHECK_S):
            if os.getppid() != self._parent:
                return False
        return self.generation == generation

    def slot_array(self, w: int, slot: int, rows: int, size: int | None = None) -> np.ndarray:
        """The first ``rows`` rows of ``size`` in a slot, as the worker writes them."""
        return self.rows(w, slot, rows, size).numpy()


def is_dead(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie counts as dead)."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] in (b"Z", b"X")
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def _take_cuda_error() -> None:
    """A refused ``cudaHostRegister`` leaves its error behind for the next kernel launch's
    check to raise, in the trainer's first step: take it here, with a launch of our own."""
    try:
        torch.empty(1, device="cuda").fill_(0)
    except RuntimeError:
        return  # the refusal's error, now consumed
