"""``python -m bench.feed``: what the loader's workers leave the process that launches the
GPU's work, and what demand sizing and a change of the worker count cost.

- The stand-in: the loader's own process runs, between batches, a CPU-bound Python loop of
  known length (``spin``: what launching a compiled model's kernels is to the CPU: one thread,
  the GIL held) and measures its rate, loop iterations per second of the time it spent
  looping (the waits for batches left out); the consumer asks for batches faster than the
  workers make them, so they decode all the time beside it. ``alone``: the loop with no
  loader, pinned to the CPU the plan keeps for the process (``World.cpu_plan``). Each
  configuration's rate over ``alone``'s, paired by round (``--repeat`` rounds, configurations
  interleaved, a fresh loader each pass, its first batches left out):

  ``today``        ``workers="auto"`` as before (the cores less one), nothing pinned
  ``nice``         as ``today``, the workers at nice 10
  ``pinned``       ``pin_cpus=True, worker_nice=0``: the process on its core, the workers
                   on the rest
  ``new``          ``pin_cpus=True``: pinned, and the workers at its default nice 10
                   (``PINNED_NICE``): what ``workers="auto"`` does on a GPU machine
  ``over``         one worker a core (the process's threads beside as many workers as
                   cores, as CUDA's threads and the pin-memory copy make it on a GPU node),
                   nothing pinned
  ``over_new``     the same count, pinned and niced as ``new``

  Target: ``new`` >= 0.95 x ``alone``.
- Demand sizing (``loaders.sizing``): a loader of ``cores`` workers with
  ``DemandSizing(every=8)`` fed to a slow consumer (a sleep per batch) then a fast one: the
  active count after each, and the batches against a fixed-count loader's (equal, byte for
  byte); and what a change costs the consumer: its longest wait for a batch across a change.

On the real ILSVRC2012 sample (``--images``), converted once in a scratch folder; batches of
``--batch`` random-resized-crops at ``--size`` px.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import machine_busy_s, run_main
from imgprep import CpuPlan, World, pin_threads, unpin_threads
from loaders import DemandSizing, LoaderOptions, ShardLoader, TrainTransform

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "imagenet-sample" / \
    "images"
SPIN = 100_000  # loop iterations the stand-in runs per batch (a few ms)
TARGET = 0.95  # new / alone


def spin(n: int) -> int:
    """The stand-in's work: ``n`` iterations of a Python loop."""
    x = 0
    for i in range(n):
        x += i & 7
    return x


def stand_in(batches: Iterable[Any] | None, steps: int, warm: int = 2) -> dict[str, float]:
    """The loop's rate over ``steps`` batches after ``warm`` (``batches`` None: alone)."""
    looped = waited = 0.0
    it = iter(batches) if batches is not None else None
    for k in range(warm + steps):
        t0 = time.perf_counter()
        if it is not None:
            next(it)
        t1 = time.perf_counter()
        spin(SPIN)
        t2 = time.perf_counter()
        if k >= warm:
            waited, looped = waited + t1 - t0, looped + t2 - t1
    return {"rate": steps * SPIN / looped, "waited_s": waited, "looped_s": looped}


def configs(cores: int) -> dict[str, dict[str, Any] | None]:
    """Each configuration's loader options (None: no loader)."""
    return {"alone": None,
            "today": {"workers": "auto", "pin_cpus": False, "worker_nice": 0},
            "nice": {"workers": "auto", "pin_cpus": False, "worker_nice": 10},
            "pinned": {"workers": "auto", "pin_cpus": True, "worker_nice": 0},
            "new": {"workers": "auto", "pin_cpus": True},
            "over": {"workers": cores, "pin_cpus": False, "worker_nice": 0},
            "over_new": {"workers": cores, "pin_cpus": True}}


def one_pass(data: Path, given: dict[str, Any] | None, batch: int, size: int, steps: int,
             epoch: int) -> dict[str, float]:
    """One configuration's pass, with a fresh loader (gone, and the process unpinned, after)."""
    b0, t0 = machine_busy_s(), time.perf_counter()
    if given is None:
        plan = World.single().cpu_plan()
        if isinstance(plan, CpuPlan):
            pin_threads(plan.main)
        try:
            res = stand_in(None, steps)
        finally:
            unpin_threads()
    else:
        options = LoaderOptions(batch_size=batch, transform=TrainTransform(size=size), **given)
        loader = ShardLoader(data, "train", World.single(), options)
        loader.set_epoch(epoch)
        try:
            res = stand_in(forever(loader, epoch), steps) | {"workers": loader.options.workers}
        finally:
            del loader
            gc.collect()
            unpin_threads()
    dt = time.perf_counter() - t0
    return res | {"busy_cores": (machine_busy_s() - b0) / dt}


def forever(loader: ShardLoader, epoch: int) -> Iterable[Any]:
    """The loader's batches in place, epoch after epoch."""
    while True:
        loader.set_epoch(epoch)
        yield from loader.in_place()
        epoch += 1


def stand_in_ratios(data: Path, names: Sequence[str], rounds: int, batch: int, size: int,
                    steps: int) -> dict[str, Any]:
    """``alone`` and ``names`` in interleaved rounds: each one's passes, and its rate over
    ``alone``'s paired by round (median)."""
    table = configs(len(os.sched_getaffinity(0)))
    order = ["alone", *[n for n in names if n != "alone"]]
    passes: dict[str, list[dict[str, float]]] = {n: [] for n in order}
    for r in range(rounds):
        for name in order:
            passes[name].append(one_pass(data, table[name], batch, size, steps, r))
    ratios = {n: statistics.median(p["rate"] / a["rate"]
                                   for p, a in zip(passes[n], passes["alone"], strict=True))
              for n in order[1:]}
    return {"passes": passes, "ratios": ratios}


def sizing_run(data: Path, batch: int, size: int, every: int = 8) -> dict[str, Any]:
    """Demand sizing beside a slow then a fast consumer (module docstring)."""
    cores = len(os.sched_getaffinity(0))
    most = max(2, cores)
    base: dict[str, Any] = {"batch_size": batch, "transform": TrainTransform(size=size),
                            "pin_cpus": False}
    sized = ShardLoader(data, "train", World.single(), LoaderOptions(
        workers=most, sizing=DemandSizing(every=every), **base))
    fixed = ShardLoader(data, "train", World.single(), LoaderOptions(workers=1, **base))
    out: dict[str, Any] = {"most": most, "same": True}
    for epoch, (pace, name) in enumerate(((0.25, "slow"), (0.0, "fast"))):
        sized.set_epoch(epoch)
        fixed.set_epoch(epoch)
        waits, got = [], []
        t0 = time.perf_counter()
        for images, labels in sized:
            waits.append(time.perf_counter() - t0)
            got.append((images, labels))
            time.sleep(pace)
            t0 = time.perf_counter()
        want = list(fixed)
        out["same"] &= len(got) == len(want) and all(
            torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(got, want,
                                                                             strict=True))
        out[name] = {"active_after": sized.active_workers, "batches": len(got),
                     "longest_wait_s": max(waits[1:] or [0.0]),
                     "median_wait_s": statistics.median(waits[1:] or [0.0])}
    return out


def convert(images: Path, scratch: Path, limit: int) -> Path:
    """``limit`` of ``images`` converted (256 px shards) into ``scratch/data``."""
    from bench.loader import build_shards

    data, _ = build_shards(images, scratch, limit, limit)
    return data


def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    data = convert(args.images, scratch, args.limit)
    cores = len(os.sched_getaffinity(0))
    names = list(configs(cores))
    res = stand_in_ratios(data, names, args.repeat, args.batch, args.size, args.steps)
    sizing = sizing_run(data, args.batch, args.size)
    new = res["ratios"]["new"]
    return {"bench": "feed", "cores": cores, "batch": args.batch, "size": args.size,
            "steps": args.steps, "rounds": args.repeat,
            "workers": {n: res["passes"][n][0].get("workers", 0) for n in names},
            "ratios": {n: round(v, 3) for n, v in res["ratios"].items()},
            "busy_cores": {n: round(statistics.median(p["busy_cores"] for p in res["passes"][n]),
                                    2) for n in names},
            "target": {"new_over_alone": round(new, 3), "target": TARGET,
                       "result": "PASS" if new >= TARGET else "SHORT"},
            "sizing": sizing}


def print_table(res: dict[str, Any]) -> None:
    print(f"feed: {res['cores']} cores, batch {res['batch']} at {res['size']} px, "
          f"{res['steps']} batches a pass, {res['rounds']} rounds")
    print(f"{'configuration':<14} {'workers':>7} {'rate / alone':>12} {'machine cores':>13}")
    for name, ratio in {"alone": 1.0, **res["ratios"]}.items():
        print(f"{name:<14} {res['workers'][name]:>7} {ratio:>12.3f} "
              f"{res['busy_cores'][name]:>13.2f}")
    t = res["target"]
    print(f"new / alone: {t['new_over_alone']:.3f} (target >= {t['target']}: "
          f"{t['result']})")
    s = res["sizing"]
    print(f"demand sizing, {s['most']} workers at most: after a slow consumer "
          f"{s['slow']['active_after']}, after a fast one {s['fast']['active_after']}; "
          f"batches equal to a fixed count's: {s['same']}; longest wait across a change "
          f"{s['fast']['longest_wait_s'] * 1e3:.0f} ms (median "
          f"{s['fast']['median_wait_s'] * 1e3:.0f} ms)")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.feed", description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=Path, default=REAL)
    ap.add_argument("--limit", type=int, default=400, help="images converted (default 400)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--steps", type=int, default=40, help="timed batches a pass")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--out", type=Path, default=None, help="scratch under this folder")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main("bench_feed", args.images, args.out, lambda s: run(args, s), print_table)


if __name__ == "__main__":
    raise SystemExit(main())
