"""What a fuzz target is: a callable ``(data, rng) -> outcome`` that returns a short label of
what happened (``decoded``, ``declined:...``) and raises ``Mismatch`` when a promise fails."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Target = Callable[[bytes, np.random.Generator], str]


class Mismatch(AssertionError):
    """A target's promise failed on an input (wrong pixels, a bad report): not a crash."""


def alternate(*targets: Target) -> Target:
    """One target that hands each input to one of ``targets``, drawn from its generator."""

    def target(data: bytes, rng: np.random.Generator) -> str:
        return targets[int(rng.integers(len(targets)))](data, rng)

    return target
