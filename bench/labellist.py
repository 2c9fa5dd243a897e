"""Benchmark the label-list loader against its own floor, in one run.

- data: the 1000 real ILSVRC2012 JPEGs of ``<repo>/../shared/data/imagenet-sample/images``
  (``--images`` to point elsewhere) converted once with ``imgprep convert --format list``
  (256 px, the defaults) into a scratch folder: one JPEG file per image and ``train.txt``.
  A second list names those files again and again until it holds ``--samples`` lines (the
  files stay in the page cache, as a node-local copy would be after its first epoch).
- floor: one process doing the loader's work with no loader: read each file of the list in
  the loader's order for that epoch, ``loaders.transforms.apply`` (decode with JPEG draft,
  random-resized-crop 224, flip, uint8 CHW) into a preallocated batch array.
- loader: ``loaders.LabelListLoader(list, World(), LoaderOptions(batch_size, workers=1|2))``
  iterating whole
  epochs through its shared-memory ring; workers are persistent, the first epoch is the
  warm-up.

Every measure runs once per round, ``--repeat`` rounds interleaved; each pass records the CPU
other processes took meanwhile (``foreign_cores``). Rates are medians over all passes, with
the best pass beside them. Target: loader 1 worker >= 0.8 x floor. The last line of stdout
is one JSON object. Linux only.

Run (from the repository root)::

    python -m bench.labellist --samples 2000 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import DEFAULT_IMAGES, TICK, descendants, machine_busy_s, run_main, verdict
from imgprep import ConvertOptions, World, convert_splits
from loaders import LabelListLoader, LoaderOptions, TrainTransform, plan_epoch, read_label_list
from loaders.transforms import apply

TARGET = 0.8  # loader 1 worker over floor
WORKER_COUNTS = (1, 2)
TRAIN = TrainTransform()


def build_list(images: Path, scratch: Path, samples: int) -> Path:
    """Convert ``images`` to a label list once; a list naming its files ``samples`` times."""
    out = scratch / "list"
    summary = convert_splits(ConvertOptions(input=images, out=out, format="list",
                                            workers=os.cpu_count() or 1))[0]
    if not summary.complete or summary.errors:
        raise SystemExit(f"bench_labellist: converting {images} failed: {summary}")
    lines = (out / "train.txt").read_text().splitlines()
    big = out / "bench.txt"
    big.write_text("\n".join(lines[i % len(lines)] for i in range(samples)) + "\n")
    return big


def tree_cpu_s() -> float:
    """CPU seconds this process and its live descendants (the loader's workers) used."""
    t = os.times()
    total = t.user + t.system
    for pid in descendants():
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
        except (OSError, IndexError, ValueError):
            continue  # the process exited meanwhile
    return total


def timed(batches: Iterable[tuple[torch.Tensor, ...]]) -> dict[str, float]:
    """One epoch end to end: images/s, CPU ms per image, and other processes' cores."""
    cpu0, busy0, t0 = tree_cpu_s(), machine_busy_s(), time.perf_counter()
    n = 0
    for images, _ in batches:
        n += images.shape[0]
    wall = time.perf_counter() - t0
    cpu = tree_cpu_s() - cpu0
    return {"rate": n / wall, "images": n, "cpu_ms_per_image": 1e3 * cpu / max(n, 1),
            "foreign_cores": max(0.0, machine_busy_s() - busy0 - cpu) / wall}


def floor_epoch(lst: Path, batch: int, epoch: int) -> Iterable[tuple[torch.Tensor, ...]]:
    """The loader's per-image work in this process: read, decode, crop, flip, into a batch."""
    e = read_label_list(lst)
    plan = plan_epoch([len(e.paths)], World(), "replicate", 0, epoch, batch, 1, "drop")
    out = np.empty((batch, 3, TRAIN.size, TRAIN.size), np.uint8)
    for number in range(plan.batches):
        rng = np.random.default_rng([0, epoch, 0, int(plan.first[number])])
        chunk = plan.table[number].tolist()
        for i, idx in enumerate(chunk):
            apply((e.root / e.paths[idx]).read_bytes(), TRAIN, rng, out[i], "floor")
        yield torch.from_numpy(out), torch.from_numpy(e.labels[chunk])


def loader_epoch(loader: LabelListLoader, epoch: int) -> Iterable[tuple[torch.Tensor, ...]]:
    loader.set_epoch(epoch)
    return loader


def measure(scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    lst = build_list(args.images, scratch, args.samples)
    loaders = {w: LabelListLoader(lst, World(), LoaderOptions(batch_size=args.batch_size,
                                                              workers=w, seed=0))
               for w in WORKER_COUNTS}
    for loader in loaders.values():
        timed(loader_epoch(loader, 0))  # warm-up: workers start, files enter the page cache
    passes: dict[str, list[dict[str, float]]] = {"floor": [], "loader_1w": [], "loader_2w": []}
    for r in range(1, args.repeat + 1):
        passes["floor"].append(timed(floor_epoch(lst, args.batch_size, r)))
        for w, loader in loaders.items():
            passes[f"loader_{w}w"].append(timed(loader_epoch(loader, r)))
    del loaders
    rates = {k: {"median": round(statistics.median(p["rate"] for p in v), 1),
                 "best": round(max(p["rate"] for p in v), 1),
                 "cpu_ms_per_image": round(statistics.median(p["cpu_ms_per_image"]
                                                             for p in v), 3),
                 "foreign_cores": round(statistics.median(p["foreign_cores"] for p in v), 2)}
             for k, v in passes.items()}
    ratio = rates["loader_1w"]["median"] / rates["floor"]["median"]
    return {"samples": args.samples, "batch_size": args.batch_size, "repeat": args.repeat,
            "cores": len(os.sched_getaffinity(0)), "load_average": round(os.getloadavg()[0], 2),
            "rates": rates,
            "labellist_1w_over_floor": round(ratio, 3),
            "labellist_1w_over_floor_best": round(rates["loader_1w"]["best"]
                                                  / rates["floor"]["best"], 3),
            "labellist_2w_over_1w": round(rates["loader_2w"]["median"]
                                          / rates["loader_1w"]["median"], 3),
            "target": TARGET, "verdict": verdict(ratio, TARGET)}


def print_table(res: dict[str, Any]) -> None:
    print(f"label-list loader, {res['samples']} images/epoch, batch {res['batch_size']}, "
          f"{res['repeat']} rounds, {res['cores']} cores, load average {res['load_average']}")
    print(f"{'measure':<12} {'median/s':>9} {'best/s':>8} {'CPU ms/img':>10} {'foreign':>8}")
    for k, v in res["rates"].items():
        print(f"{k:<12} {v['median']:>9} {v['best']:>8} {v['cpu_ms_per_image']:>10} "
              f"{v['foreign_cores']:>8}")
    print(f"loader 1 worker / floor: {res['labellist_1w_over_floor']} (best passes "
          f"{res['labellist_1w_over_floor_best']}; target >= {TARGET}: {res['verdict']}); "
          f"2 workers / 1 worker: {res['labellist_2w_over_1w']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES)
    ap.add_argument("--samples", type=int, default=3000, help="images per epoch")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--out", type=Path, default=None, help="scratch parent (default: /tmp)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    return run_main("bench_labellist", args.images, args.out,
                    lambda scratch: measure(scratch, args), print_table)


if __name__ == "__main__":
    sys.exit(main())
