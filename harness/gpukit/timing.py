"""Batches per second, as a training loop takes them: a pass over a loader timed from its first
batch to its last (the pipeline's fill, the first batch's latency, is reported apart), each
batch made ready (``sync``: the GPU's work on it done) before the next is asked for.

A pass stops after ``limit`` batches; the loaders support that (the next ``set_epoch`` starts
a new pass, and the abandoned one is closed here). Rounds of two measures are compared with
``bench.common.paired_ratio``: the median over rounds of each round's own ratio.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from bench.common import paired_ratio

Batch = tuple[torch.Tensor, ...]  # (images, labels), or with batch-level draws third


def no_sync() -> None:
    """A CPU batch is ready when it arrives."""


def cuda_sync() -> None:
    torch.cuda.synchronize()


def batch_rate(batches: Iterable[Batch], limit: int,
               sync: Callable[[], None] = no_sync) -> dict[str, float]:
    """Images/s over up to ``limit`` batches after the first (``limit`` >= 2 for a rate), and
    the first batch's latency; the pass is closed after the last batch taken."""
    it = iter(batches)
    t0 = time.perf_counter()
    first = last = t0
    taken = images = 0
    try:
        for imgs, _labels in it:
            sync()
            last = time.perf_counter()
            taken += 1
            if taken == 1:
                first = last
            else:
                images += int(imgs.shape[0])
            if taken >= limit:
                break
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    span = last - first
    return {"images_per_s": images / span if span > 0 else 0.0, "batches": taken,
            "first_batch_s": first - t0}


def ratio_of(num: Sequence[float], den: Sequence[float]) -> float:
    """The median over rounds of ``num[i] / den[i]`` (no round set aside: the machine the kit
    measures is its own)."""
    return paired_ratio([(n, 0.0) for n in num], [(d, 0.0) for d in den])


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def rates(passes: Sequence[dict[str, Any]]) -> list[float]:
    return [float(p["images_per_s"]) for p in passes]
