"""Demand sizing (``loaders.sizing``): the pillow backend's active workers follow the
consumer's demand, and the batches, their pixels and a resume do not know the count."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from imgprep import World
from loaders import DemandSizing, LoaderOptions
from loaders.sizing import Look, Sizer
from tests.support.backends import loader

SLOW_S = 0.1  # the slow consumer's time per batch (a decode of a batch here: ~5 ms of CPU)


def same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) and torch.equal(lx, ly)
                                    for (x, lx), (y, ly) in zip(a, b, strict=True))


def consume(ld: Any, epoch: int, pace: float, stop: int | None = None) -> tuple[list[Any], int]:
    """``epoch``'s batches (the first ``stop``), ``pace`` seconds on each; and the active
    count at the end."""
    ld.set_epoch(epoch)
    out = []
    for batch in ld:
        out.append(batch)
        time.sleep(pace)
        if len(out) == stop:
            break
    return out, ld.active_workers


def test_the_count_follows_a_slow_then_a_fast_consumer_and_the_batches_do_not(
        shards: Path) -> None:
    """3 workers at most, a look every 3 batches: a consumer slower than one worker brings the
    count down to one within an epoch, one that never stops brings it back up; every batch,
    pixels and labels, is the one a fixed count of workers makes."""
    sizing = DemandSizing(every=3, wait=0.1)
    sized = loader(shards, "train", World.single(), "pillow", workers=3, sizing=sizing)
    fixed = loader(shards, "train", World.single(), "pillow", workers=2)
    assert sized.active_workers == 3
    slow, after_slow = consume(sized, 0, SLOW_S)
    fast, after_fast = consume(sized, 1, 0.0)
    assert (after_slow, after_fast) == (1, 3)
    assert same(slow, consume(fixed, 0, 0.0)[0]) and same(fast, consume(fixed, 1, 0.0)[0])


def test_a_sized_loaders_state_resumes_on_a_fixed_count(shards: Path) -> None:
    sized = loader(shards, "train", World.single(), "pillow", workers=3,
                   sizing=DemandSizing(every=2, wait=0.1))
    head, active = consume(sized, 4, SLOW_S, stop=9)
    assert active < 3  # a change happened within the part taken
    fixed = loader(shards, "train", World.single(), "pillow", workers=1)
    fixed.load_state_dict(sized.state_dict())
    whole = consume(loader(shards, "train", World.single(), "pillow", workers=1), 4, 0.0)[0]
    assert same(head + list(fixed), whole)


def look(waited: float, busy: float) -> Look:
    """A look of 10 batches over a second, ``waited`` of it waiting, the workers' ``busy``
    CPU seconds for the 10 they made."""
    return Look(batches=10, wall_s=1.0, waited_s=waited, busy_s=busy, made=10)


@pytest.mark.parametrize(("count", "seen", "after"), [
    (4, look(0.0, 0.1), 1),  # idle workers, a consumer that never waits: fewer
    (2, look(0.5, 2.0), 5),  # 20 batches/s wanted x 0.2 s each x 1.25: more
    (2, look(0.5, 9.0), 8),  # ... at most the loader's workers
    (2, look(0.5, 0.1), 2),  # a wait the workers' pace does not explain: no more
    (3, look(0.0, 2.0), 3),  # busy, but the consumer does not wait: as many
    (1, look(0.0, 0.0), 1),  # at least one
])
def test_the_sizer_asks_for_the_workers_the_demand_needs(count: int, seen: Look,
                                                         after: int) -> None:
    sizer = Sizer(DemandSizing(), most=8)
    sizer.count = count
    assert sizer.decide(seen) == after


@pytest.mark.parametrize("given", [{"backend": "nvjpeg"}, {"workers": 0}])
def test_demand_sizing_wants_the_pillow_backends_workers(given: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="sizing"):
        LoaderOptions(batch_size=2, sizing=DemandSizing(), **given)
    for bad in ({"every": 1}, {"margin": 0.5}, {"least": 0}, {"wait": 1.0}):
        with pytest.raises(ValueError):
            DemandSizing(**bad)
