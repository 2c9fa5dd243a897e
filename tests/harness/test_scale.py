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

from harness.reliability import Figure, Trial, scale
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


def test_a_size_short_of_the_throughput_bound_is_converted_again_and_its_faster_run_judged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def run(images: int, wall: float, rss: float) -> dict[str, float]:
        return {"images": images, "wall_s": wall, "rss_mb": rss, "pss_mb": rss,
                "rate": images / wall, "cpu_rate": images / wall, "foreign_cores": 0.0,
                "listing_us": 1.0, "listing_us_1w": 1.0, "manifest_bytes": 100,
                "manifest_read_s": 0.001}

    passes = iter([[run(100, 1.0, 50), run(400, 8.0, 52)],  # 400 at 0.5x: short
                   [run(100, 1.1, 51), run(400, 3.9, 60)]])
    calls = []

    def sizes(*args: object) -> tuple[list[dict[str, float]], list[Trial]]:
        calls.append(args)
        return next(passes), []

    monkeypatch.setattr(scale, "_convert_sizes", sizes)
    figures, trials = scale.convert_scale(tmp_path, sizes=(100, 400))
    assert len(calls) == 2
    judged = {t.kind: t for t in trials}
    assert judged["convert: throughput within 10 %"].ok  # 102.6 / 100: the faster runs
    assert "100 / 103" in judged["convert: throughput within 10 %"].detail
    assert "51 / 60 MB" in judged["convert: peak RSS flat"].detail  # the higher of the two


def test_a_size_short_twice_fails_the_throughput_bound(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    slow = [{"images": n, "wall_s": w, "rss_mb": 50.0, "pss_mb": 50.0, "rate": n / w,
             "cpu_rate": n / w, "foreign_cores": 0.0, "listing_us": 1.0, "listing_us_1w": 1.0,
             "manifest_bytes": 100, "manifest_read_s": 0.001} for n, w in ((100, 1.0), (400, 8.0))]
    monkeypatch.setattr(scale, "_convert_sizes", lambda *args: (slow, []))
    _, trials = scale.convert_scale(tmp_path, sizes=(100, 400))
    assert not {t.kind: t for t in trials}["convert: throughput within 10 %"].ok
