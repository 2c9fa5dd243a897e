"""``python -m bench.loader --sizes``: the loader's cost per image at each output size of a
resolution schedule (128, 160, 192 and 224 px; ``--size-list`` for others), on the shard set
``bench.loader`` builds from the real ILSVRC2012 sample.

At each size: the floor (``loaders.SampleDecoder`` on preloaded bytes in this process, one
core) and ``ShardLoader`` with 1 worker (whole epochs, end to end, after a warm-up epoch; one
loader alive at a time, built afresh for each pass), ``--repeat`` rounds interleaved across
the sizes, medians over the quiet passes (as ``bench.loader``). ``--store-size PX`` builds
the shards with the images' short side at PX instead of the 256 px centre crop. Reported:
µs per image at each size, each size's cost over the 224 px cost (target: 160 px <= 0.7 x
224 px, 1 worker), and what a size change would cost if the
workers were restarted for it (their start-up: the warm-up epoch's first-batch latency less
a later epoch's) against what the ring's slots sized for the largest size cost instead
(memory, MB a worker).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import QUIET_FOREIGN_CORES, paired_ratio, timed_epoch, verdict
from imgprep import World, read_manifest
from loaders import LoaderOptions, SampleDecoder, ShardLoader, TrainTransform

SIZES = (128, 160, 192, 224)
REFERENCE = 224  # every size's cost is compared with this one's
TARGET = ("160", 0.7)  # 160 px costs at most 0.7 x 224 px, 1 worker
MB = 1e6


def floor_pass(blobs: list[bytes], n: int, batch: int, size: int) -> dict[str, float]:
    """The loader's per-sample work at ``size`` on preloaded bytes, one process."""
    decode = SampleDecoder(TrainTransform(size=size))
    out = np.empty((batch, 3, size, size), dtype=np.uint8)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for i in range(n):
        decode(blobs[i % len(blobs)], rng, out[i % batch])
    return {"rate": n / (time.perf_counter() - t0), "images": n}


def loader_epoch(loader: ShardLoader, epoch: int) -> dict[str, float]:
    size = loader.plan(epoch).size

    def problem(images: torch.Tensor) -> str | None:
        shape = tuple(images.shape[1:])
        return None if shape == (3, size, size) else f"{shape}, not 3 x {size} x {size}"

    loader.set_epoch(epoch)
    return timed_epoch(loader, problem)


def run_sizes(args: argparse.Namespace, folder: Path, blobs: list[bytes],
              measured: Any) -> dict[str, Any]:
    """Every size's floor and 1-worker loader, interleaved; ``measured`` wraps a pass with
    the machine's load (``bench.loader.measured``)."""
    start, load0 = time.perf_counter(), os.getloadavg()
    sizes = tuple(args.size_list)
    batch, n = args.batch_size, read_manifest(folder, "train").total_samples

    def fresh(size: int) -> ShardLoader:
        return ShardLoader(folder, "train", World(), LoaderOptions(
            batch_size=batch, workers=1, seed=0, transform=TrainTransform(size=size)))

    cold: dict[int, dict[str, float]] = {}
    passes: dict[str, list[dict[str, float]]] = {
        f"{kind}_{s}": [] for s in sizes for kind in ("floor", "loader")}
    for r in range(args.repeat):
        for s in sizes:
            passes[f"floor_{s}"].append(measured(partial(floor_pass, blobs, min(n, 2000),
                                                         batch, s)))
            # one loader (and its worker) alive at a time: a warm-up epoch, then the timed one
            loader = fresh(s)
            warm = loader_epoch(loader, 0)
            cold.setdefault(s, warm)
            passes[f"loader_{s}"].append(measured(partial(loader_epoch, loader, r + 1)))
            del loader
            gc.collect()
    return summarise(args, sizes, passes, cold, batch, start, load0, n)


def _quiet_median(passes: list[dict[str, float]], key: str = "rate") -> float:
    quiet = [p for p in passes if p["foreign_cores"] < QUIET_FOREIGN_CORES] or passes
    return statistics.median(p[key] for p in quiet)


def summarise(args: argparse.Namespace, sizes: tuple[int, ...],
              passes: dict[str, list[dict[str, float]]], cold: dict[int, dict[str, float]],
              batch: int, start: float, load0: tuple[float, ...], n: int) -> dict[str, Any]:
    pairs = {k: [(p["rate"], p["foreign_cores"]) for p in v] for k, v in passes.items()}
    us = {k: round(1e6 / _quiet_median(v), 1) for k, v in passes.items()}
    ref = REFERENCE if REFERENCE in sizes else max(sizes)
    ratios: dict[str, dict[str, Any]] = {}
    for kind in ("loader", "floor"):
        for s in sizes:
            value = paired_ratio(pairs[f"{kind}_{ref}"], pairs[f"{kind}_{s}"])  # cost ratio
            target = TARGET[1] if kind == "loader" and str(s) == TARGET[0] else None
            ratios[f"{kind}_cost_{s}_over_{ref}"] = {
                "value": round(value, 3), "target": target,
                "result": "info" if target is None else verdict(value, target + 1e-12,
                                                                below=True)}
    restart = {s: round(cold[s]["first_batch_s"] - _quiet_median(
        passes[f"loader_{s}"], "first_batch_s"), 3) for s in sizes}
    slot_mb = {s: round((2 + 2) * batch * 3 * s * s / MB, 1) for s in sizes}  # prefetch 2 + 2
    return {
        "benchmark": "loader", "mode": "sizes", "sizes": list(sizes), "samples": n,
        "store": (f"short side {args.store_size} px" if args.store_size
                  else "256 px centre crop"),
        "batch_size": batch, "repeat": args.repeat, "workers": 1,
        "us_per_image": us, "ratios": ratios,
        "worker_restart_s": restart, "ring_mb_per_worker": slot_mb,
        "quiet_passes": {k: sum(1 for p in v if p["foreign_cores"] < QUIET_FOREIGN_CORES)
                         for k, v in passes.items()},
        "loadavg_start": [round(x, 2) for x in load0],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count() or 1,
        "all_pass": all(v["result"] == "PASS" for v in ratios.values() if v["target"]),
        "seconds": round(time.perf_counter() - start, 1),
    }


def print_sizes(res: dict[str, Any]) -> None:
    print(f"loader cost per image by output size: {res['samples']:,} samples stored at "
          f"{res['store']}, batch "
          f"{res['batch_size']}, 1 worker, {res['repeat']} interleaved rounds; load average "
          f"{res['loadavg_start']} -> {res['loadavg_end']}")
    print(f"{'size':>6s} {'floor us':>9s} {'loader us':>10s} {'loader/224':>11s} "
          f"{'restart s':>10s} {'ring MB/worker':>15s}")
    ref = REFERENCE if REFERENCE in res["sizes"] else max(res["sizes"])
    for s in res["sizes"]:
        r = res["ratios"][f"loader_cost_{s}_over_{ref}"]
        mark = f"  (target <= {r['target']}: {r['result']})" if r["target"] else ""
        print(f"{s:6d} {res['us_per_image'][f'floor_{s}']:9.1f} "
              f"{res['us_per_image'][f'loader_{s}']:10.1f} {r['value']:11.3f} "
              f"{res['worker_restart_s'][s]:10.3f} {res['ring_mb_per_worker'][s]:15.1f}{mark}")
    print("(restart s: what restarting the workers at a size change would cost, their "
          "start-up; ring MB: one worker's slots at that size, prefetch 2)")
