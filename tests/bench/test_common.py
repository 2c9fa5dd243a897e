"""What the benchmarks share: an epoch timed end to end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from bench.common import timed_epoch


def batches(sizes: list[int], shape: tuple[int, ...] = (3, 4, 4)) -> Iterator[tuple[Any, Any]]:
    for n in sizes:
        yield np.zeros((n, *shape), np.uint8), np.zeros(n, np.int64)


def test_an_epoch_counts_every_image_and_times_the_first_batch_apart() -> None:
    out = timed_epoch(batches([8, 8, 5]), lambda images: None)
    assert out["images"] == 21
    assert 0 <= out["first_batch_s"] <= out["seconds"]
    assert out["rate"] == pytest.approx(21 / out["seconds"])
    assert set(out) == {"rate", "images", "first_batch_s", "seconds", "rate_after_first_batch"}


def test_a_wrong_first_batch_stops_the_run_saying_what_is_wrong() -> None:
    def problem(images: Any) -> str | None:
        return None if images.shape[1] == 3 else f"shape {images.shape}"

    with pytest.raises(SystemExit, match=r"unexpected batch: shape \(8, 4, 4, 3\)"):
        timed_epoch(batches([8], (4, 4, 3)), problem)
