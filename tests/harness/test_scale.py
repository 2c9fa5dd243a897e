"""The scale part of the reliability suite (``harness/reliability/scale.py``), reduced.

The same functions the reliability report runs at full size (convert 10k/50k/200k images,
8 x 4 stage-to-node processes over 64 shards, 4 loader ranks x 2 workers over 2000 shards),
here small enough for CI: convert 2,500 and 10,000 images, 8 x 4 stage-to-node processes over
16 shards, 4 ranks x 2 workers over 200 shards for 3 epochs. Every Trial must hold; the
figures are printed when one does not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.reliability import Figure, Trial
from harness.reliability.scale import convert_scale, loader_scale, stage_scale


def check(result: tuple[list[Figure], list[Trial]], group: str) -> None:
    """Every trial ok, every figure of ``group`` within its bound (when it has one)."""
    figures, trials = result
    report = "\n".join([f"{f.name}: {f.value} {f.unit} {f.bound} {f.ok}" for f in figures]
                       + [f"{'ok  ' if t.ok else 'FAIL'} {t.kind}: {t.detail}" for t in trials])
    assert figures and trials, report
    assert {f.group for f in figures} == {group}, report
    assert {t.group for t in trials} == {"scale"}, report
    assert all(t.ok for t in trials), report
    assert all(f.ok is not False for f in figures), report


@pytest.mark.slow
@pytest.mark.serial  # throughput and listing cost at two sizes, compared
def test_convert_memory_throughput_and_listing_scale(tmp_path: Path) -> None:
    check(convert_scale(tmp_path, sizes=(2_500, 10_000)), "convert")


@pytest.mark.slow
def test_stage_to_node_one_copier_per_node_at_8x4(tmp_path: Path) -> None:
    check(stage_scale(tmp_path, nodes=8, local_ranks=4, shards=16, per_shard=8, size=64),
          "stage-to-node")


@pytest.mark.slow
def test_loaders_equal_batches_and_flat_memory_over_epochs(tmp_path: Path) -> None:
    check(loader_scale(tmp_path, ranks=4, workers=2, shards=200, epochs=3), "loaders")
