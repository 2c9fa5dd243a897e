"""``python -m bench.loader --augment NAME``: what an augmentation policy adds to the loader's
cost per image, against plain random-resized-crop in the same run, on the shard set
``bench.loader`` builds from the real ILSVRC2012 sample (256 px, quality 90).

Two transforms, ``TrainTransform()`` (RRC 224 + flip) and ``TrainTransform(augment=
loaders.augment_policy(NAME))`` (the same, then the policy's ops, ``imgprep.augment``), each
measured as the floor (``loaders.SampleDecoder`` on preloaded bytes in this process, one
core) and as ``ShardLoader`` with 1 worker (whole epochs, end to end, after a warm-up epoch;
one loader alive at a time), ``--repeat`` rounds interleaved, medians over the quiet passes
(as ``bench.loader``; the two kinds take turns going first). Reported: µs per image of each,
and the policy's cost over plain RRC (each round's own ratio, the median over rounds); the
floor also in its thread's CPU time (``floor_cpu``: what a loaded machine's other processes
disturb least); the draws alone (``policy.draw`` for 224 px, µs per image). No target: the
ratios are information.

With ``--ffcv-python`` (``bench.ffcv_peer``), also the policy's loader at 1 and 2 workers
with ``memory_format="channels_last"`` (NHWC, as FFCV's batches), against FFCV 1.0.2's plain
random-resized-crop and flip over a .beton of the same JPEG bytes (the pipeline FFCV's own
ImageNet example trains with; FFCV has no automatic augmentation): ``vs_ffcv_<w>w``, the
policy's loader over FFCV's plain one, target >= 1.1, paired per round as ``bench.loader``.
These rows go first in each round, then a pause of ``SETTLE_S``: run last, right before the
next round's plain floor, they made that floor slower in its own thread's CPU time (a
policy/plain ratio of 0.91, against 1.1-1.2 in runs without FFCV).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench import ffcv_peer
from bench.common import QUIET_FOREIGN_CORES, paired_ratio, verdict
from bench.loader_sizes import loader_epoch
from bench.loader_stores import loader_pass
from imgprep import World, read_manifest
from loaders import LoaderOptions, SampleDecoder, ShardLoader, TrainTransform
from loaders import augment_policy as policy

KINDS = ("plain", "augment")
FFCV_WORKERS = (1, 2)
VS_FFCV_TARGET = 1.1  # the policy's loader over FFCV's plain RRC, at as many workers
SPLIT = "train"
SETTLE_S = 2.0  # after the FFCV rows, before the floors


def transforms(name: str) -> dict[str, TrainTransform]:
    return {"plain": TrainTransform(), "augment": TrainTransform(augment=policy(name))}


def floor_pass(blobs: list[bytes], n: int, batch: int, t: TrainTransform) -> dict[str, float]:
    """The loader's per-sample work with ``t`` on preloaded bytes, one process."""
    decode = SampleDecoder(t)
    out = np.empty((batch, 3, t.size, t.size), dtype=np.uint8)
    rng = np.random.default_rng(0)
    t0, c0 = time.perf_counter(), time.thread_time()
    for i in range(n):
        decode(blobs[i % len(blobs)], rng, out[i % batch])
    cpu = time.thread_time() - c0
    return {"rate": n / (time.perf_counter() - t0), "cpu_rate": n / cpu, "images": n}


def draw_us(name: str, n: int = 20_000) -> float:
    """The policy's draws alone: µs per image for a 224 px crop."""
    p, rng = policy(name), np.random.default_rng(0)
    t0 = time.perf_counter()
    for _ in range(n):
        p.draw(224, rng)
    return (time.perf_counter() - t0) / n * 1e6


EpochRows = dict[str, Callable[[int], dict[str, float]]]  # a row -> one timed epoch (number)


def ffcv_rows(args: argparse.Namespace, folder: Path, scratch: Path, batch: int
              ) -> tuple[Any, EpochRows, dict[str, Any]]:
    """FFCV's plain loaders at 1 and 2 workers (none without ``--ffcv-python``), and the
    policy's channels-last loaders they are paired with, each warmed up."""
    peer, theirs, info = ffcv_peer.setup(getattr(args, "ffcv_python", None), folder, SPLIT,
                                         scratch, batch, FFCV_WORKERS)
    if peer is None:
        return None, {}, info
    rows: EpochRows = {}
    policy_t = transforms(args.augment)["augment"]
    for w in FFCV_WORKERS:
        loader = ShardLoader(folder, SPLIT, World(), LoaderOptions(
            batch_size=batch, workers=w, seed=0, transform=policy_t,
            memory_format="channels_last"))
        loader_pass(loader, 0)  # the warm-up
        rows[f"loader_augment_cl_{w}w"] = partial(loader_pass, loader)
    for name, row in theirs.items():
        row()  # the warm-up: numba compiles FFCV's pipeline
        rows[name] = partial(_any_epoch, row)
    return peer, rows, info


def _any_epoch(row: Callable[[], dict[str, float]], epoch: int) -> dict[str, float]:
    return row()  # FFCV's loader draws its own order each epoch


def run_augment(args: argparse.Namespace, folder: Path, blobs: list[bytes],
                measured: Any, scratch: Path | None = None) -> dict[str, Any]:
    """Both transforms' floor and 1-worker loader, interleaved, and with FFCV its rows;
    ``measured`` wraps a pass with the machine's load (``bench.loader.measured``)."""
    start, load0 = time.perf_counter(), os.getloadavg()
    ts = transforms(args.augment)
    batch, n = args.batch_size, read_manifest(folder, SPLIT).total_samples
    peer, extra, info = ffcv_rows(args, folder, scratch or folder.parent, batch)
    names = [f"{where}_{k}" for k in KINDS for where in ("floor", "loader")] + list(extra)
    passes: dict[str, list[dict[str, float]]] = {k: [] for k in names}
    try:
        for r in range(args.repeat):
            for k, row in extra.items():  # first, then a pause: FFCV's threads wind down
                passes[k].append(measured(partial(row, r + 1)))
            if extra:
                time.sleep(SETTLE_S)
            for k in KINDS if r % 2 == 0 else KINDS[::-1]:  # each kind first every other round
                passes[f"floor_{k}"].append(measured(partial(floor_pass, blobs, min(n, 2000),
                                                             batch, ts[k])))
                loader = ShardLoader(folder, SPLIT, World(), LoaderOptions(
                    batch_size=batch, workers=1, seed=0, transform=ts[k]))
                loader_epoch(loader, 0)  # the warm-up: worker start-up, page cache
                passes[f"loader_{k}"].append(measured(partial(loader_epoch, loader, r + 1)))
                del loader
                gc.collect()
    finally:
        if peer is not None:
            peer.close()
    return summarise(args, passes, n, batch, start, load0) | {"ffcv": vs_ffcv(passes, info)}


def vs_ffcv(passes: dict[str, list[dict[str, float]]], info: dict[str, Any]
            ) -> dict[str, Any]:
    """The policy's channels-last loader over FFCV's plain RRC at each worker count, or the
    line that says why there is no FFCV row."""
    if "skipped" in info:
        return {"skipped": info["skipped"]}
    out: dict[str, Any] = {"versions": info["versions"], "beton_mb": info["beton_mb"]}
    for w in FFCV_WORKERS:
        ours, theirs = (passes[f"loader_augment_cl_{w}w"], passes[f"ffcv_{w}w"])
        v = paired_ratio([(p["rate"], p["foreign_cores"]) for p in ours],
                         [(p["rate"], p["foreign_cores"]) for p in theirs])
        out[f"us_per_image_{w}w"] = {"loader_augment_cl": round(1e6 / _quiet_median(ours), 1),
                                     "ffcv_plain": round(1e6 / _quiet_median(theirs), 1)}
        out[f"vs_ffcv_{w}w"] = {"value": round(v, 3), "target": VS_FFCV_TARGET,
                                "result": verdict(v, VS_FFCV_TARGET)}
    return out


def _quiet_median(passes: list[dict[str, float]]) -> float:
    quiet = [p for p in passes if p["foreign_cores"] < QUIET_FOREIGN_CORES] or passes
    return statistics.median(p["rate"] for p in quiet)


def summarise(args: argparse.Namespace, passes: dict[str, list[dict[str, float]]], n: int,
              batch: int, start: float, load0: tuple[float, ...]) -> dict[str, Any]:
    pairs = {k: [(p["rate"], p["foreign_cores"]) for p in v] for k, v in passes.items()}
    us = {k: round(1e6 / _quiet_median(v), 1) for k, v in passes.items()}
    ratios = {f"{where}_cost_augment_over_plain": {
        "value": round(paired_ratio(pairs[f"{where}_plain"], pairs[f"{where}_augment"]), 3),
        "target": None, "result": "info"} for where in ("floor", "loader")}
    cpu = {k: [p["cpu_rate"] for p in passes[f"floor_{k}"]] for k in KINDS}
    for k in KINDS:  # the floor's thread CPU time: what other processes' load leaves alone
        us[f"floor_cpu_{k}"] = round(1e6 / statistics.median(cpu[k]), 1)
    ratios["floor_cpu_cost_augment_over_plain"] = {"value": round(statistics.median(
        a / b for a, b in zip(cpu["plain"], cpu["augment"], strict=True)), 3),
        "target": None, "result": "info"}
    return {
        "benchmark": "loader", "mode": "augment", "policy": args.augment, "samples": n,
        "size": 224, "batch_size": batch, "repeat": args.repeat, "workers": 1,
        "us_per_image": us, "ratios": ratios, "draw_us_per_image": round(draw_us(args.augment), 1),
        "quiet_passes": {k: sum(1 for p in v if p["foreign_cores"] < QUIET_FOREIGN_CORES)
                         for k, v in passes.items()},
        "loadavg_start": [round(x, 2) for x in load0],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count() or 1,
        "seconds": round(time.perf_counter() - start, 1),
    }


def print_augment(res: dict[str, Any]) -> None:
    print(f"augmentation cost: policy {res['policy']}, {res['samples']:,} samples (256 px, "
          f"q90), RRC {res['size']}, batch {res['batch_size']}, 1 worker, {res['repeat']} "
          f"interleaved rounds; load average {res['loadavg_start']} -> {res['loadavg_end']}")
    print(f"{'':9s} {'plain us':>9s} {'policy us':>10s} {'policy/plain':>13s}")
    for where in ("floor", "floor_cpu", "loader"):
        r = res["ratios"][f"{where}_cost_augment_over_plain"]
        print(f"{where:9s} {res['us_per_image'][f'{where}_plain']:9.1f} "
              f"{res['us_per_image'][f'{where}_augment']:10.1f} {r['value']:13.3f}")
    print(f"(the draws alone: {res['draw_us_per_image']:.1f} us per image)")
    ffcv = res.get("ffcv", {})
    if "skipped" in ffcv:
        print(ffcv["skipped"])
    for w in FFCV_WORKERS:
        if f"vs_ffcv_{w}w" in ffcv:
            us, r = ffcv[f"us_per_image_{w}w"], ffcv[f"vs_ffcv_{w}w"]
            print(f"{w} worker{'s' if w > 1 else ''}: loader with {res['policy']} "
                  f"(channels_last) {us['loader_augment_cl']:.1f} us, FFCV plain RRC "
                  f"{us['ffcv_plain']:.1f} us: {r['value']:.3f} x FFCV (target >= "
                  f"{r['target']}) {r['result']}")
