"""Repeated augmentation (``LoaderOptions.repeats``, as DeiT's and torchvision's RASampler):
an epoch of ``k`` repeats holds about n / k distinct samples of a pool of n, each k times.

- **The repeated order.** An epoch keeps its length: n positions. Position p of epoch e's
  repeated order is copy ``p mod k`` of entry ``(w * d + p // k) mod n`` of its *cycle's*
  order, where ``d = ceil(n / k)`` is the distinct samples an epoch holds, ``c = e // k`` the
  epoch's cycle and ``w = e mod k`` its window in the cycle. The cycle's order is the pool's
  seeded order (``loaders.order``) keyed by c in the epoch's place, so the k epochs of a
  cycle take k consecutive windows of d entries of one permutation (the last window wraps
  around to the first ``k * d - n < k`` entries). Each epoch thus holds d samples in a
  seeded order: every one k times but the last (``n - (d - 1) * k`` copies, 1 to k), a
  uniformly drawn d of the pool in a uniformly drawn order, as RASampler's epoch; and
  unlike RASampler's independent epochs, every k epochs of a cycle hold every sample of the
  pool (fewer than k of them twice). With k = 1 the repeated order is the order itself.
- **Every plan promise kept.** The repeated order depends on nothing of the World, and plans
  cut it into steps exactly as they cut the order (``loaders.epochs``): the same step counts
  and batch shapes, the same tails, the same done positions after every step, so exact and
  elastic resume hold as they are (a state's ``samples`` counts positions of the repeated
  order). A state records k (``REPEATS_KEY``, only when k > 1); a state of another k is
  refused, since its positions name other samples.
- **Where the copies go.** Copies are consecutive positions. With k > 1 a step's block of
  positions ``[a, a + L)`` goes to its g rank slots strided, not in consecutive runs: slot r
  takes ``a + r, a + r + g, ...``, as many as its run in ``loaders.epochs.Cut`` is long
  (runs within a step differ by at most one, the longer first: exactly how many of the
  block's positions are r mod g). Consecutive positions go to consecutive slots (mod g),
  across the boundaries of full steps too, whose blocks are g x batch long: where g >= k,
  the k copies of a sample are on k different ranks. They share a step unless a step
  boundary falls between them: at most one sample a boundary, and none in an epoch's full
  steps when k divides g x batch (RASampler's copies are cut the same way).
- **Draws differ between copies.** Copies on different ranks are in different batches, whose
  generators are seeded by their first positions (``PlannedEpoch.batch_rng``); copies in
  one batch (g < k) take successive draws of its generator.
"""

from __future__ import annotations

import numpy as np

REPEATS_KEY = "repeats"  # the state_dict key that records k > 1 (absent: 1)


def check_repeats(repeats: object) -> int:
    """``repeats`` as a repeat count, or a ValueError."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, not {repeats!r}")
    return int(repeats)


def held(positions: np.ndarray, n: int, epoch: int, repeats: int) -> tuple[int, np.ndarray]:
    """Epoch ``epoch``'s repeated order of a pool of ``n`` samples at ``positions``: the key
    of the order it takes entries from (the cycle, in the epoch's place) and the entry each
    position holds."""
    at = np.asarray(positions, dtype=np.int64)
    if repeats == 1 or n == 0:
        return epoch, at
    cycle, window = divmod(int(epoch), repeats)
    distinct = -(-n // repeats)
    return cycle, (window * distinct + at // repeats) % n
