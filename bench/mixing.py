"""What random erasing, mixup and cutmix add to ``DeviceLoader``'s work a batch, on the CPU.

A uint8 batch laid out as the trainer's loader hands it over (channels_last, 224 px; 64 and
256 images), taken by ``DeviceLoader`` to the CPU as float32, in five cases:

- ``normalise``: the batch alone, ``(images, labels)``: DeviceLoader's plain conversion, the
  measure every other case is divided by;
- ``erase``: timm's default random erasing (``RandomErasing()``: a quarter of the rows, one
  rectangle each, zeros);
- ``mixup``: timm's mixup and cutmix (``Mixup()``: one draw a batch, cutmix half the time,
  soft targets of 1,000 classes);
- ``erase+mixup``: both, as a recipe sets them;
- ``pixel+elem``: erasing with per-pixel noise and mixing drawn per row (``mode="elem"``):
  the costliest forms.

Each case's draws are made beforehand, one record per batch (``loaders.draw_batch``, a
generator seeded per batch), so only the work ``DeviceLoader`` does is timed. Every round
times each case over ``--batches`` batches, in turn; the figure is a case's time a batch
(the median over rounds) and its ratio to ``normalise`` in the same round (the median of
those ratios). torch runs on ``--threads`` threads (default 1: one core's cost). Last line:
one JSON object.

    python -m bench.mixing                 # ~1 min on one core
    python -m bench.mixing --batch 64 --rounds 3 --batches 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from bench.common import machine_busy_s
from loaders import DeviceLoader, Mixup, RandomErasing, draw_batch

SIZE = 224
CLASSES = 1000
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CASES: dict[str, dict[str, Any]] = {
    "normalise": {},
    "erase": {"erase": RandomErasing()},
    "mixup": {"mixup": Mixup(num_classes=CLASSES)},
    "erase+mixup": {"erase": RandomErasing(), "mixup": Mixup(num_classes=CLASSES)},
    "pixel+elem": {"erase": RandomErasing(mode="pixel"),
                   "mixup": Mixup(mode="elem", num_classes=CLASSES)},
}


def batches(batch: int, count: int, draws: dict[str, Any]) -> list[tuple[torch.Tensor, ...]]:
    """``count`` batches of one random uint8 image set (channels_last), with a draws record
    each where the case has draws."""
    rng = np.random.default_rng(batch)
    rows = torch.from_numpy(rng.integers(0, 256, (batch, SIZE, SIZE, 3), dtype=np.uint8))
    images, labels = rows.permute(0, 3, 1, 2), torch.arange(batch) % CLASSES
    if not draws:
        return [(images, labels)] * count
    out: list[tuple[torch.Tensor, ...]] = []
    for i in range(count):
        d = draw_batch(labels.numpy(), SIZE, SIZE, np.random.default_rng([batch, i]), **draws)
        out.append((images, labels, torch.frombuffer(bytearray(d.pack()), dtype=torch.uint8)))
    return out


def seconds_a_batch(items: list[tuple[torch.Tensor, ...]]) -> float:
    t0 = time.perf_counter()
    for _images, _targets in DeviceLoader(items, "cpu", MEAN, STD):
        pass
    return (time.perf_counter() - t0) / len(items)


def measure(sizes: Sequence[int], rounds: int, count: int, threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    busy0, wall0 = machine_busy_s(), time.perf_counter()
    rows = []
    for batch in sizes:
        made = {name: batches(batch, count, draws) for name, draws in CASES.items()}
        for items in made.values():
            seconds_a_batch(items[:1])  # warm the allocator and the code paths
        times: dict[str, list[float]] = {name: [] for name in CASES}
        for _ in range(rounds):
            for name, items in made.items():
                times[name].append(seconds_a_batch(items))
        plain = times["normalise"]
        for name, secs in times.items():
            ratio = statistics.median(s / p for s, p in zip(secs, plain, strict=True))
            rows.append({"batch": batch, "case": name, "ms": round(1e3 * statistics.median(secs),
                                                                   2),
                         "ratio": round(ratio, 3)})
    wall = time.perf_counter() - wall0
    return {"benchmark": "mixing", "size": SIZE, "dtype": "float32", "threads": threads,
            "rounds": rounds, "batches": count, "results": rows,
            "machine_cores_busy": round((machine_busy_s() - busy0) / wall, 2)}


def print_table(res: dict[str, Any]) -> None:
    print(f"DeviceLoader on the CPU, {res['size']} px, {res['dtype']}, {res['threads']} "
          f"thread(s): ms a batch, and / normalise alone")
    print(f"{'batch':>5s} {'case':<12s} {'ms':>9s} {'ratio':>7s}")
    for r in res["results"]:
        print(f"{r['batch']:5d} {r['case']:<12s} {r['ms']:9.2f} {r['ratio']:7.3f}")
    print(f"machine cores busy: {res['machine_cores_busy']}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, action="append",
                    help="batch size, repeatable (default: 64 and 256)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (default: %(default)s)")
    ap.add_argument("--batches", type=int, default=8,
                    help="batches a case a round (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default: %(default)s)")
    args = ap.parse_args(argv)
    sizes = args.batch or [64, 256]
    if min(sizes) < 2 or args.rounds < 1 or args.batches < 1 or args.threads < 1:
        ap.error("--batch needs at least 2 images; --rounds, --batches, --threads at least 1")
    res = measure(sizes, args.rounds, args.batches, args.threads)
    print_table(res)
    print(json.dumps(res, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
