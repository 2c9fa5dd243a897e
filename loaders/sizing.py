"""Demand sizing: as many decoding workers as the consumer's rate needs, not one a core.

The pillow backend starts its ``workers`` processes once (the most it runs) and, with a
``DemandSizing`` in its options, keeps only some of them *active*: an active worker decodes
its share of the batches (batch b of a pass from batch s: worker ``(b - s) % active``), the
others sleep through the pass. Every ``every`` batches ``Sizer.look`` weighs what the look
saw:

- the consumer's demand: the batches it took over the time it spent on them (the look's
  wall time less the time it waited for the next batch), in batches/s;
- a batch's cost: the CPU seconds the workers spent making batches over the batches they
  made (their own counters in the ring, ``loaders.ring``);

and asks for ``ceil(demand x cost x margin)`` workers, within ``least`` .. ``workers``: fewer
when the workers idle beside a consumer that waits no more than ``wait`` of the look (the ring
stays full), more when it waited longer and the workers' CPU time says they could not keep up
(a wait the workers' pace does not explain, such as the hand-over's own cost, is no reason to
start more). A change ends the pass at the
next batch and starts another from there with the new count, as a resume at that batch would:
each batch's samples and pixels come from the epoch's plan and the batch's own generator
(``loaders.config.PlannedEpoch``), never from which worker made it, so the batches are those
of any fixed count, and ``state_dict`` and resume do not know the count. A change costs the
batches the workers had made ahead (made again) and a batch's wait while the new pass starts;
``every`` keeps changes rare.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

logger = logging.getLogger("loaders")
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class DemandSizing:
    """How a pillow loader sizes its active workers to the consumer (``LoaderOptions.sizing``).

    Attributes:
        every: batches between two looks (and so between two changes at most).
        margin: workers asked for over the bare need (decoding rates wander).
        least: the fewest active workers.
        wait: the share of a look the consumer may wait for batches before the count grows.
    """

    every: int = 100
    margin: float = 1.25
    least: int = 1
    wait: float = 0.05

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 2:
            raise ValueError(f"every must be an integer >= 2 batches, not {self.every!r}")
        if not self.margin >= 1.0:
            raise ValueError(f"margin must be >= 1, not {self.margin!r}")
        if isinstance(self.least, bool) or not isinstance(self.least, int) or self.least < 1:
            raise ValueError(f"least must be an integer >= 1, not {self.least!r}")
        if not 0.0 <= self.wait < 1.0:
            raise ValueError(f"wait must be a share from 0 to 1, not {self.wait!r}")


@dataclass(frozen=True, kw_only=True)
class Look:
    """What one look saw: the batches the consumer took, the look's wall time and the part
    of it spent waiting for batches, and the workers' CPU seconds and batches made."""

    batches: int
    wall_s: float
    waited_s: float
    busy_s: float
    made: int

    @property
    def waited(self) -> float:
        """The share of the look the consumer spent waiting for batches."""
        return self.waited_s / self.wall_s if self.wall_s > 0 else 0.0

    def need(self, margin: float) -> float:
        """Workers the consumer's demand keeps busy, times ``margin``."""
        if self.made == 0 or self.batches == 0:
            return 0.0
        demand = self.batches / max(self.wall_s - self.waited_s, 1e-6)
        return demand * (self.busy_s / self.made) * margin


@dataclass(frozen=True, kw_only=True)
class Resize:
    """A change of the active count: where, from what to what, and the look behind it."""

    epoch: int
    batch: int  # the first batch the new count makes
    before: int
    after: int
    look: Look


class Sizer:
    """The active worker count of one loader (module docstring): starts at ``most``."""

    def __init__(self, sizing: DemandSizing, most: int) -> None:
        self.sizing, self.most = sizing, most
        self.least = min(sizing.least, most)
        self.count = most
        self.changes: list[Resize] = []

    def decide(self, look: Look) -> int:
        """The count after ``look`` (the count itself when nothing calls for a change)."""
        s, n = self.sizing, self.count
        need = max(self.least, min(self.most, math.ceil(look.need(s.margin))))
        waited = look.waited > s.wait
        if need > n and waited or need < n and not waited:
            return need
        return n

    def watch(self, batches: Iterator[T], work: Callable[[], tuple[float, int]],
              epoch: int, first: int) -> Iterator[T]:
        """``batches`` (a pass from batch ``first`` with ``count`` workers) passed on, looked
        at every ``every`` batches (``work``: the workers' CPU seconds and batches made so
        far); ends early, after a batch, where a look changes the count (the caller starts a
        new pass from the next batch). The first batch of the pass is left out of the looks:
        its wait is the pass's start, not the workers' pace."""
        b = first
        start = waited = 0.0
        busy0, made0 = 0.0, 0
        taken = 0
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            now = time.perf_counter()
            if b == first:
                start, (busy0, made0) = now, work()
            else:
                waited += now - t0
                taken += 1
            yield batch
            b += 1
            if taken < self.sizing.every:
                continue
            busy, made = work()
            look = Look(batches=taken, wall_s=time.perf_counter() - start, waited_s=waited,
                        busy_s=busy - busy0, made=made - made0)
            after = self.decide(look)
            if after != self.count:
                self._change(Resize(epoch=epoch, batch=b, before=self.count, after=after,
                                    look=look))
                return
            start, waited, taken, (busy0, made0) = time.perf_counter(), 0.0, 0, (busy, made)

    def _change(self, r: Resize) -> None:
        self.changes.append(r)
        self.count = r.after
        logger.info("loader: %d -> %d active workers from epoch %d batch %d (the consumer "
                    "waited %.1f%% of the last %d batches; they need %.1f workers)", r.before,
                    r.after, r.epoch, r.batch, 100 * r.look.waited, r.look.batches,
                    r.look.need(self.sizing.margin))
