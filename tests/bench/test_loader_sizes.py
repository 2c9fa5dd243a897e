"""``bench.loader --sizes``: per-size costs as µs per image, each size's cost over 224 px's
paired by round, the 160 px target judged below 0.7, and the restart figure."""

from __future__ import annotations

import argparse

from bench import loader_sizes


def passes(rate: float, rounds: int = 3) -> list[dict[str, float]]:
    return [{"rate": rate, "foreign_cores": 0.0, "first_batch_s": 0.01, "images": 100}
            for _ in range(rounds)]


def result(rates: dict[int, float], store: int | None = None) -> dict:
    sizes = tuple(rates)
    runs = {f"{k}_{s}": passes(r) for s, r in rates.items() for k in ("floor", "loader")}
    cold = {s: {"first_batch_s": 0.11} for s in sizes}
    return loader_sizes.summarise(argparse.Namespace(repeat=3, store_size=store), sizes, runs,
                                  cold, 64, 0.0, (0.0, 0.0, 0.0), 1000)


def test_costs_are_us_per_image_and_ratios_costs_over_224_px() -> None:
    res = result({128: 5000.0, 160: 4000.0, 192: 3000.0, 224: 2000.0})
    assert res["us_per_image"]["loader_160"] == 250.0
    assert res["ratios"]["loader_cost_160_over_224"]["value"] == 0.5
    assert res["ratios"]["loader_cost_160_over_224"]["result"] == "PASS"
    assert res["ratios"]["loader_cost_128_over_224"]["result"] == "info"
    assert res["worker_restart_s"][160] == 0.1 and res["all_pass"]
    assert res["ring_mb_per_worker"][224] == round(4 * 64 * 3 * 224 * 224 / 1e6, 1)
    assert res["store"] == "256 px centre crop"


def test_the_store_is_named_when_the_shards_keep_a_larger_short_side() -> None:
    assert result({160: 2500.0, 224: 2000.0}, store=384)["store"] == "short side 384 px"


def test_160_px_costing_more_than_0_7_of_224_px_falls_short() -> None:
    res = result({160: 2500.0, 224: 2000.0})
    assert res["ratios"]["loader_cost_160_over_224"] == {"value": 0.8, "target": 0.7,
                                                         "result": "SHORT"}
    assert not res["all_pass"]
