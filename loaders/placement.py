"""Where a loader's processes run: the rank's own process on a core of its own, its decoding
workers on the rest of the rank's share (``LoaderOptions.pin_cpus``), and how nice they are.

- The plan is the rank's (``World.cpu_plan``, ``imgprep.job.cpus``), resolved with the
  options (``ResolvedOptions.cpus``: None where the loader does not pin).
- ``enter`` pins every thread of the loader's process (the caller's: it trains, launches the
  GPU's work, and its CUDA threads run beside it) to the plan's ``main`` CPUs when a backend
  is made; the pillow backend's worker processes pin themselves to ``workers`` as they start
  (``worker_init``, DataLoader's ``worker_init_fn``), and the dali and nvjpeg backends'
  decoding threads likewise (``thread_init``). Two loaders of one rank (train and val) make
  the same plan, so the second changes nothing.
- ``worker_nice`` is added to each worker's nice value as it starts (on Linux a thread has
  its own: the in-process backends' decoding threads take it too).
- A pillow worker freezes the objects it inherited from the loader's process as it starts
  (``gc.freeze``): they live as long as the worker, and a trainer's process holds hundreds of
  thousands of them (torch's alone), which each of the worker's full garbage collections
  would otherwise walk; measured, about a fifth of a stored-pixel sample's time. Freezing
  also leaves the pages they lie on shared with the parent.
"""

from __future__ import annotations

import functools
import gc
import os
from collections.abc import Callable, Collection

from imgprep import World, pin_threads
from loaders.config import ResolvedOptions


def enter(o: ResolvedOptions) -> None:
    """Pin the calling process's threads to the plan's ``main`` CPUs, where it has one."""
    if o.cpus is not None:
        pin_threads(o.cpus.main)


def settle(cpus: Collection[int] | None, nice: int, _worker_id: int = 0) -> None:
    """In a worker process as it starts: the objects it inherited frozen, onto ``cpus``
    (None: where it is), ``nice`` added."""
    gc.freeze()
    if cpus is not None:
        pin_threads(cpus)
    if nice:
        os.nice(nice)


def worker_init(o: ResolvedOptions) -> Callable[[int], None]:
    """The pillow backend's ``worker_init_fn`` for ``o``."""
    return functools.partial(settle, None if o.cpus is None else o.cpus.workers,
                             o.worker_nice)


def thread_init(o: ResolvedOptions) -> Callable[[], None] | None:
    """A decoding thread's initializer (a thread pool's ``initializer``): the calling thread
    onto the plan's worker CPUs, ``worker_nice`` added; None where there is nothing to do."""
    if o.cpus is None and not o.worker_nice:
        return None
    return functools.partial(_settle_thread, None if o.cpus is None else o.cpus.workers,
                             o.worker_nice)


def _settle_thread(cpus: Collection[int] | None, nice: int) -> None:
    if cpus is not None:
        os.sched_setaffinity(0, cpus)  # 0: the calling thread (Linux)
    if nice:
        os.nice(nice)  # the calling thread's own (Linux)


def cpu_line(world: World, pin: bool) -> str:
    """Where this rank's loader runs, in the one line the trainer prints at start."""
    if not pin:
        return "cpus: not pinned (the loader's workers may run on any of this rank's CPUs)"
    plan = world.cpu_plan()
    if isinstance(plan, str):
        return f"cpus: not pinned: {plan}"
    return plan.line(world.rank)
