"""Shared memory between a loader and its worker processes: batch slots and small counters.

Workers decode batches straight into their own ring of slots (made once, before they start)
and send only ``(generation, worker, slot, rows)``: PyTorch's default would move each batch
into a fresh shared-memory segment, a copy and thousands of page faults per batch.

Protocol, chosen so that a killed worker can leave nothing held:
- each worker has a semaphore counting its free slots; the worker takes one before decoding,
  the main process gives it back once it has copied the batch out. The main process never
  waits on a semaphore, so a dead worker cannot stall it;
- a new iteration bumps the shared *generation* and posts one token to every worker's
  semaphore: a worker blocked on a slot of the abandoned iteration wakes, sees the new
  generation and stops; a worker resets its own semaphore to "all slots free" when it starts
  an iteration (the main process ignores batches of older generations);
- counters (epoch, batches to skip, generation, each pool's starting position; per worker
  its pid, the batch it is making and the samples it skipped) have one writer each: no lock.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

_EPOCH, _SKIP, _GENERATION, _HEAD = range(4)  # then the pools' starts, then the workers
_PER_WORKER = 3  # pid, batch in the making, skipped samples
_PARENT_CHECK_S = 5.0  # a worker blocked on a slot checks this often that its parent lives


class Ring:
    """``workers`` rings of ``slots`` batches (``batch`` x 3 x ``size`` x ``size`` uint8),
    with the counters both sides read (``pools`` starting positions of an epoch's plan);
    see the module docstring for the protocol."""

    def __init__(self, workers: int, slots: int, batch: int, size: int, pools: int = 1
                 ) -> None:
        self.workers, self.slots, self.pools = max(1, workers), slots, pools
        self.state: Any = mp.Array("q", [0] * (_HEAD + pools + _PER_WORKER * self.workers),
                                   lock=False)
        self.data = torch.empty((workers, slots, batch, 3, size, size),
                                dtype=torch.uint8).share_memory_() if workers > 0 else None
        self._free = [mp.Semaphore(slots) for _ in range(workers)]
        self._parent = os.getpid()

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

    def note(self, w: int, batch: int) -> None:
        self.state[self._slot(w, 1)] = batch

    def add_skipped(self, w: int, n: int) -> None:
        self.state[self._slot(w, 2)] += n

    def skipped(self) -> int:
        return sum(int(self.state[self._slot(w, 2)]) for w in range(self.workers))

    # -- main process
    def new_iteration(self) -> int:
        """Start an iteration: counters reset, workers of the last one released."""
        for w in range(self.workers):
            self.state[self._slot(w, 2)] = 0
        self.state[_GENERATION] += 1
        for sem in self._free:
            sem.release()  # wakes a worker blocked in an abandoned iteration
        return self.generation

    def in_order(self, items: Iterable[tuple[Any, Any, Any]], generation: int, pin: bool,
                 first: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The DataLoader's ``(batch number, ring ticket, label bytes)`` items (or, with no
        workers, ``(number, images, labels)``) as batches in batch-number order from
        ``first``: each ticket's slot is copied out, tickets of an abandoned iteration are
        dropped, and batches that arrive early wait for their turn."""
        pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for number, images, labels in items:
            if not isinstance(images, torch.Tensor):
                gen, w, slot, n = (int(x) for x in images)
                if gen != generation:
                    continue  # a batch of an abandoned iteration
                images = self.take(w, slot, n, pin)
                labels = torch.frombuffer(bytearray(labels), dtype=torch.int64)
            pending[int(number)] = (images, labels)
            while first in pending:
                yield pending.pop(first)
                first += 1

    def take(self, w: int, slot: int, rows: int, pin: bool) -> torch.Tensor:
        """Copy a batch out of its slot and free the slot."""
        assert self.data is not None
        out = torch.empty((rows, *self.data.shape[3:]), dtype=torch.uint8, pin_memory=pin)
        np.copyto(out.numpy(), self.data[w, slot, :rows].numpy())  # one memcpy, no OpenMP
        self._free[w].release()
        return out

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

    def slot_array(self, w: int, slot: int, rows: int) -> np.ndarray:
        assert self.data is not None
        return self.data[w, slot, :rows].numpy()


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
