"""What a fuzz target is: a callable ``(data, rng) -> outcome`` that returns a short label of
what happened (``decoded``, ``declined:...``) and raises ``Mismatch`` when a promise fails.
Every call into the extension is ``bounded``: the per-image budget (imgprep/csrc/budget.h)
must keep the CPU time of any one call on any input under ``CPU_LIMIT``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

Target = Callable[[bytes, np.random.Generator], str]
T = TypeVar("T")
# seconds of CPU one call may take: the most the budget lets through (2^26 blocks over 342
# scans of a 2048x2048 frame) costs about 0.4 s, in the normal build and the sanitizer's
# alike (that one links the system's libjpeg, not instrumented)
CPU_LIMIT = 2.0


class Mismatch(AssertionError):
    """A target's promise failed on an input (wrong pixels, a bad report): not a crash."""


def bounded(limit: float, where: str, call: Callable[[], T]) -> T:
    """``call()``, whose CPU time (``time.process_time``) must stay under ``limit`` seconds,
    whether it returns or raises: Mismatch otherwise."""
    t0 = time.process_time()
    try:
        return call()
    finally:
        spent = time.process_time() - t0
        if spent > limit:
            raise Mismatch(f"{where} took {spent:.2f} s of CPU, over {limit:g} s: the budget "
                           "does not bound it")


def alternate(*targets: Target) -> Target:
    """One target that hands each input to one of ``targets``, drawn from its generator."""

    def target(data: bytes, rng: np.random.Generator) -> str:
        return targets[int(rng.integers(len(targets)))](data, rng)

    return target
