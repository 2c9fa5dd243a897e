"""A resolution schedule: the output size of each epoch (progressive resizing).

- ``SizeSchedule`` is a table of steps ``(first epoch, size)``: epoch e is made at the size of
  the last step whose first epoch is at most e (the first step is epoch 0; after the last
  step its size holds). It is a pure function of the epoch, so every rank makes the same
  size in the same epoch (equal batches), a rerun makes the same batches (deterministic)
  and a resume from ``(epoch, samples done)`` on any World makes the rest of the epoch at
  the size the uninterrupted run would have.
- ``SizeSchedule.ramp`` is FFCV's linear ramp (``get_resolution`` of its ImageNet example):
  ``low`` up to epoch ``start``, ``high`` from epoch ``end``, in between the straight line
  rounded to a multiple of ``step`` (32 px) with numpy's rounding (half to even), as FFCV
  rounds it.
- One spelling, ``str(schedule)`` (``"0=160,13=192"``), is what a loader state and a
  checkpoint record and what a refused resume names; ``parse`` reads it back, and also a
  ramp written ``LOW:HIGH@START-END`` (optionally ``/STEP``) or a bare size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

RAMP_STEP = 32  # FFCV rounds its ramp's sizes to multiples of 32 px
_RAMP = re.compile(r"^(\d+):(\d+)@(\d+)-(\d+)(?:/(\d+))?$")


@dataclass(frozen=True)
class SizeSchedule:
    """Epoch -> output size, as steps ``((first epoch, size), ...)`` in epoch order, the
    first at epoch 0, each size >= 1 and different from the step before it."""

    steps: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        steps = tuple((int(e), int(s)) for e, s in self.steps)
        object.__setattr__(self, "steps", steps)
        if not steps or steps[0][0] != 0:
            raise ValueError(f"a size schedule starts at epoch 0: {self.steps!r}")
        for (e0, s0), (e1, s1) in zip(steps, steps[1:], strict=False):
            if e1 <= e0 or s1 == s0:
                raise ValueError(f"a size schedule's steps need rising epochs and a new size "
                                 f"each: ({e0}, {s0}) then ({e1}, {s1})")
        if min(s for _, s in steps) < 1:
            raise ValueError(f"a size schedule's sizes must be >= 1: {self}")

    @classmethod
    def table(cls, sizes: dict[int, int] | list[int] | tuple[int, ...]) -> SizeSchedule:
        """From ``{first epoch: size}``, or one size per epoch (the last one holds after);
        repeated sizes merge into one step."""
        items = sorted(sizes.items()) if isinstance(sizes, dict) else list(enumerate(sizes))
        steps: list[tuple[int, int]] = []
        for epoch, size in items:
            if not steps or steps[-1][1] != size:
                steps.append((epoch, size))
        return cls(tuple(steps))

    @classmethod
    def constant(cls, size: int) -> SizeSchedule:
        return cls(((0, size),))

    @classmethod
    def ramp(cls, low: int, high: int, start: int, end: int, step: int = RAMP_STEP
             ) -> SizeSchedule:
        """FFCV's ramp: ``low`` through epoch ``start``, ``high`` from epoch ``end``, in
        between the straight line rounded to a multiple of ``step``."""
        if not 0 <= start < end or step < 1:
            raise ValueError(f"a ramp needs 0 <= start < end and step >= 1, not start {start}, "
                             f"end {end}, step {step}")
        return cls.table([ramp_size(e, low, high, start, end, step) for e in range(end + 1)])

    def size_at(self, epoch: int) -> int:
        """The output size of ``epoch``."""
        return next(s for e, s in reversed(self.steps) if e <= epoch)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Every size the schedule makes, ascending."""
        return tuple(sorted({s for _, s in self.steps}))

    @property
    def largest(self) -> int:
        return max(s for _, s in self.steps)

    def __str__(self) -> str:
        return ",".join(f"{e}={s}" for e, s in self.steps)

    @classmethod
    def parse(cls, text: str) -> SizeSchedule:
        """``E=S,E=S,...`` (the table, ``str``'s form), ``LOW:HIGH@START-END[/STEP]`` (a
        ramp) or ``S`` (one size); ValueError says which forms there are."""
        t = text.replace(" ", "")
        try:
            if m := _RAMP.match(t):
                low, high, start, end, step = m.groups()
                return cls.ramp(int(low), int(high), int(start), int(end),
                                int(step or RAMP_STEP))
            if t.isdigit():
                return cls.constant(int(t))
            pairs = [(int(e), int(s)) for e, s in (p.split("=") for p in t.split(","))]
            if len(dict(pairs)) != len(pairs):
                raise ValueError("an epoch named twice")
            return cls.table(dict(pairs))
        except ValueError as e:
            raise ValueError(f"size schedule {text!r}: expected EPOCH=SIZE,... (e.g. "
                             f"0=160,13=192), LOW:HIGH@START-END[/STEP] (e.g. 160:192@11-13) "
                             f"or SIZE ({e})") from None


def ramp_size(epoch: int, low: int, high: int, start: int, end: int,
              step: int = RAMP_STEP) -> int:
    """FFCV's ``get_resolution``: the size of ``epoch`` on the ramp."""
    if epoch <= start:
        return low
    if epoch >= end:
        return high
    line = float(np.interp([epoch], [start, end], [low, high])[0])
    return int(np.round(line / step)) * step


__all__ = ["RAMP_STEP", "SizeSchedule", "ramp_size"]
