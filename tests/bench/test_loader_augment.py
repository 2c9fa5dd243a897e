"""``bench.loader --augment NAME``: a policy's cost per image as µs, its ratio over plain RRC
paired by round, the floor's (in wall and in CPU time) and the loader's; a name no policy has
is refused at once."""

from __future__ import annotations

import argparse

import pytest

from bench import loader, loader_augment


def passes(rate: float, rounds: int = 3, cpu_rate: float | None = None
           ) -> list[dict[str, float]]:
    extra = {} if cpu_rate is None else {"cpu_rate": cpu_rate}
    return [{"rate": rate, "foreign_cores": 0.0, "images": 100, **extra}
            for _ in range(rounds)]


def test_costs_are_us_per_image_and_the_ratio_the_policys_cost_over_plain_rrc() -> None:
    runs = {"floor_plain": passes(4000.0, cpu_rate=5000.0),
            "floor_augment": passes(2000.0, cpu_rate=4000.0),
            "loader_plain": passes(3000.0), "loader_augment": passes(2500.0)}
    res = loader_augment.summarise(argparse.Namespace(repeat=3, augment="ta_wide"), runs, 1000,
                                   64, 0.0, (0.0, 0.0, 0.0))
    assert res["us_per_image"] == {"floor_plain": 250.0, "floor_augment": 500.0,
                                   "loader_plain": 333.3, "loader_augment": 400.0,
                                   "floor_cpu_plain": 200.0, "floor_cpu_augment": 250.0}
    assert res["ratios"]["floor_cost_augment_over_plain"] == {"value": 2.0, "target": None,
                                                              "result": "info"}
    assert res["ratios"]["floor_cpu_cost_augment_over_plain"]["value"] == 1.25
    assert res["ratios"]["loader_cost_augment_over_plain"]["value"] == 1.2
    assert res["mode"] == "augment" and res["policy"] == "ta_wide"
    assert res["draw_us_per_image"] > 0


def test_a_name_no_policy_has_is_refused_before_anything_runs(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        loader.parse_args(["--augment", "autoaugment"])
    assert "unknown augmentation policy 'autoaugment'" in capsys.readouterr().err
    assert loader.parse_args(["--augment", "rand-m9-mstd0.5-inc1"]).augment


def test_the_ffcv_pairing_is_the_policys_loader_over_ffcvs_plain_rrc_per_worker_count() -> None:
    runs = {"loader_augment_cl_1w": passes(1500.0), "ffcv_1w": passes(1000.0),
            "loader_augment_cl_2w": passes(2000.0), "ffcv_2w": passes(2000.0)}
    got = loader_augment.vs_ffcv(runs, {"versions": {"ffcv": "1.0.2"}, "beton_mb": 42.0})
    assert got["vs_ffcv_1w"] == {"value": 1.5, "target": 1.1, "result": "PASS"}
    assert got["vs_ffcv_2w"] == {"value": 1.0, "target": 1.1, "result": "SHORT"}
    assert got["us_per_image_1w"] == {"loader_augment_cl": 666.7, "ffcv_plain": 1000.0}
    assert loader_augment.vs_ffcv(runs, {"skipped": "no FFCV"}) == {"skipped": "no FFCV"}
