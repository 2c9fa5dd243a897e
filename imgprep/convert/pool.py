"""Convert's worker pool: forked processes that die with their parent and hold no lock.

Each worker takes task indices from a queue, runs ``job(index, tick)`` and ships the result
back; ``tick`` counts one image in the worker's own slot of a shared array (no lock a killed
worker could hold). A worker that dies, or a parent that is killed (``PR_SET_PDEATHSIG`` plus a
parent-pid check), ends the run with a message saying to rerun; an ImgprepError raised by a job
is re-raised in the parent as is, any other exception with the worker's traceback.
"""

from __future__ import annotations

import gc
import math
import multiprocessing as mp
import os
import queue
import signal
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from imgprep.errors import ImgprepError
from imgprep.procs import die_with_parent

R = TypeVar("R")
Tick = Callable[[], None]
Job = Callable[[int, Tick], R]
POLL_S = 0.2
PART_SHARE = 2  # a part is 1/(PART_SHARE x workers) of the items left


def _worker_main(job: Job[Any], tasks: Any, results: Any, counts: Any, k: int,
                 parent: int) -> None:
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def tick() -> None:  # this worker's own slot: no lock that a killed worker could hold
        counts[k] += 1

    while True:
        index = tasks.get()
        if index is None:
            return
        try:
            results.put(("ok", job(index, tick)))
        except ImgprepError as e:
            results.put(("error", index, e))
        except Exception as e:  # a bug: ship the traceback to the parent, which re-raises
            results.put(("bug", index, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def _check_alive(procs: list[Any], unfinished: int) -> None:
    """Raise when a worker died (or all ended) with work unfinished."""
    dead = [p for p in procs if p.exitcode not in (None, 0)]
    if dead or all(p.exitcode is not None for p in procs):
        code = dead[0].exitcode if dead else 0
        raise ImgprepError(
            f"a convert worker died (exit code {code}) with {unfinished} tasks unfinished; "
            "rerun the same command to resume"
        ) from None


def _start(procs: list[Any]) -> None:
    """Fork the workers with the parent's objects frozen, so that the workers' garbage
    collections leave the parent's pages shared instead of copying them."""
    gc.freeze()
    try:
        for p in procs:
            p.start()
    finally:
        gc.unfreeze()


def part_cuts(sizes: Sequence[int], workers: int, minimum: int) -> list[list[int]]:
    """Where tasks of ``sizes`` items are cut into parts (each task's cuts, from 0 to its
    size): each part is a share of all the items left, at least ``minimum``, so the first
    parts are big (little to ship) and the last small (the workers finish together)."""
    left = sum(sizes)
    out = []
    for n in sizes:
        cuts = [0]
        while cuts[-1] < n or len(cuts) == 1:  # an empty task is one empty part
            step = min(n - cuts[-1], max(minimum, math.ceil(left / (PART_SHARE * workers))))
            cuts.append(cuts[-1] + step)
            left -= step
        out.append(cuts)
    return out


def run_pool(job: Job[R], indices: Sequence[int], workers: int,
             progress: Callable[[int], None] | None = None,
             on_result: Callable[[R], None] | None = None) -> list[R]:
    """``job(index, tick)`` for every index on ``workers`` forked processes (in-process when
    1 or one task); results unordered. ``progress(n)`` reports images done; ``on_result(r)``
    is called in this process with each result as it arrives (while the others run)."""
    report = progress or (lambda n: None)
    take = on_result or (lambda r: None)
    if workers <= 1 or len(indices) <= 1:
        done = []
        for i in indices:
            done.append(job(i, lambda: report(1)))
            take(done[-1])
        return done
    ctx = mp.get_context("fork")
    counts = ctx.Array("q", max(1, workers), lock=False)
    tasks_q = ctx.Queue()
    results_q = ctx.Queue()
    for i in indices:
        tasks_q.put(i)
    n_procs = min(workers, len(indices))
    for _ in range(n_procs):
        tasks_q.put(None)
    procs = [ctx.Process(target=_worker_main, name=f"imgprep-convert-{k}", daemon=True,
                         args=(job, tasks_q, results_q, counts, k, os.getpid()))
             for k in range(n_procs)]
    _start(procs)
    out: list[R] = []
    seen = 0
    try:
        while len(out) < len(indices):
            try:
                msg = results_q.get(timeout=POLL_S)
            except queue.Empty:
                _check_alive(procs, len(indices) - len(out))
            else:
                if msg[0] == "ok":
                    out.append(msg[1])
                    take(msg[1])
                elif msg[0] == "error":
                    raise msg[2]
                else:
                    raise RuntimeError(f"convert worker failed on task {msg[1]}: {msg[2]}")
            now = sum(counts)
            if now > seen:
                report(now - seen)
                seen = now
    finally:
        for p in procs:
            if p.is_alive() and len(out) < len(indices):
                p.terminate()
        for p in procs:
            p.join(timeout=10)
    now = sum(counts)
    if now > seen:
        report(now - seen)
    return out
