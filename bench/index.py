"""Benchmark ``imgprep index`` with 1 and 2 workers, in one run.

- data: a synthetic conversion of ``--shards`` shards of ``--samples`` tiny samples each
  (a ``.jpg`` of 64-400 bytes and a ``.cls``: indexing reads tar headers only, so the images
  need not decode), written with the project's shard writer, with a manifest and no sample
  index (an older conversion). ``--keep`` keeps it in ``--out`` and reuses it next time.
- index, 1 worker and 2 workers: ``imgprep.index_folder`` over the folder (every shard's tar
  headers read, the sample index and the manifest written; with ``--dali`` each shard's DALI
  index too), warm page cache.

Target: 2 workers / 1 worker >= 1.8 (on a 2-core machine). Rounds are interleaved
(``--repeat``), each pass records the CPU other processes took meanwhile (``foreign_cores``),
and the ratio is the median of each round's own ratio (``bench.common.paired_ratio``: rounds
another process disturbed are set aside unless all were). Each pass's CPU time (this process
and its workers, and this process's alone: ``main``) is reported too: 2 workers / 1 worker
near 1.0 means the pool adds no work, and ``main`` with 2 workers bounds the part that does
not run in parallel, whatever the machine's load. The index of every pass is checked to be
byte-identical to the first. A table goes to stdout,
then one JSON line with every figure.

Run (from the repository root, in the project's environment)::

    python -m bench.index                    # about a minute
    python -m bench.index --keep --repeat 5  # the folder kept in bench-out/ and reused
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import REPO, machine_busy_s, paired_ratio, verdict
from imgprep import (
    Manifest,
    ManifestOptions,
    ShardEntry,
    imagenet_classes,
    index_folder,
    read_manifest,
)
from imgprep.shards.manifest import index_name, write_manifest
from imgprep.shards.writers import ShardWriter

TARGET_2W_OVER_1W = 1.8
WORKER_COUNTS = (1, 2)


def sample_bytes(i: int) -> bytes:
    """A stand-in image of 64-400 bytes (never decoded)."""
    return bytes([i % 251]) * (64 + i * 37 % 337)


def build_folder(folder: Path, shards: int, samples: int) -> None:
    """``shards`` shards of ``samples`` samples in ``folder`` with their manifest, no index."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for k in range(shards):
        with ShardWriter(folder / f"train-{k:06d}.tar") as w:
            for j in range(samples):
                i = k * samples + j
                w.add(f"n01440764_{i:08d}", {"jpg": sample_bytes(i),
                                              "cls": str(i % 1000).encode()})
        entries.append(ShardEntry(w.path.name, w.samples, w.bytes, w.sha256))
    write_manifest(folder, Manifest(
        split="train", format="shards", total_samples=shards * samples,
        classes=imagenet_classes().to_json(), mean=[0.485, 0.456, 0.406],
        std=[0.229, 0.224, 0.225], options=ManifestOptions(format="shards", split="train"),
        tool_version="bench", shards=entries))


def reusable(folder: Path, shards: int, samples: int) -> bool:
    """Whether a kept ``folder`` holds the set asked for, every shard at its size."""
    try:
        m = read_manifest(folder, "train")
    except (OSError, ValueError):
        return False
    return (len(m.shards) == shards and m.total_samples == shards * samples
            and all((folder / s.name).is_file()
                    and (folder / s.name).stat().st_size == s.bytes for s in m.shards))


def own_cpu_s() -> tuple[float, float]:
    """CPU seconds of this process, and of its children waited for (the pool's workers)."""
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system


def timed_index(folder: Path, workers: int, dali: bool) -> dict[str, Any]:
    """One ``imgprep index`` of ``folder``: samples/s, other processes' cores, index sha256."""
    cpu0, busy0, t0 = own_cpu_s(), machine_busy_s(), time.perf_counter()
    done = index_folder(folder, "train", dali=dali, workers=workers)
    wall = time.perf_counter() - t0
    (main1, kids1), (main0, kids0) = own_cpu_s(), cpu0
    cpu = main1 - main0 + kids1 - kids0
    digest = hashlib.sha256((folder / index_name("train")).read_bytes()).hexdigest()
    return {"rate": done[0].samples / wall, "seconds": wall, "cpu_s": cpu,
            "main_cpu_s": main1 - main0,
            "foreign_cores": max(0.0, machine_busy_s() - busy0 - cpu) / wall, "sha256": digest}


def measure(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved rounds of every worker count over ``folder``, after one warm-up pass."""
    first = timed_index(folder, 2, args.dali)  # warm-up: the shards enter the page cache
    passes: dict[int, list[dict[str, Any]]] = {w: [] for w in WORKER_COUNTS}
    for _ in range(args.repeat):
        for w in WORKER_COUNTS:
            passes[w].append(timed_index(folder, w, args.dali))
    identical = all(p["sha256"] == first["sha256"] for v in passes.values() for p in v)
    rates = {f"index_{w}w": {"median": round(statistics.median(p["rate"] for p in v), 1),
                             "best": round(max(p["rate"] for p in v), 1),
                             "seconds": round(statistics.median(p["seconds"] for p in v), 3),
                             "cpu_s": round(statistics.median(p["cpu_s"] for p in v), 3),
                             "main_cpu_s": round(statistics.median(p["main_cpu_s"]
                                                                   for p in v), 3),
                             "foreign_cores": round(statistics.median(p["foreign_cores"]
                                                                      for p in v), 2)}
             for w, v in passes.items()}
    pairs = {w: [(p["rate"], p["foreign_cores"]) for p in v] for w, v in passes.items()}
    ratio = paired_ratio(pairs[2], pairs[1])
    cpu = {w: statistics.median(p["cpu_s"] for p in v) for w, v in passes.items()}
    m = read_manifest(folder, "train")
    return {"shards": len(m.shards), "samples": m.total_samples,
            "bytes": sum(s.bytes for s in m.shards), "dali": args.dali,
            "repeat": args.repeat, "cores": len(os.sched_getaffinity(0)),
            "load_average": round(os.getloadavg()[0], 2), "rates_samples_per_s": rates,
            "index_2w_over_1w": round(ratio, 3), "target_2w_over_1w": TARGET_2W_OVER_1W,
            "cpu_2w_over_1w": round(cpu[2] / max(cpu[1], 1e-6), 3),
            "verdict": verdict(ratio, TARGET_2W_OVER_1W), "identical": identical}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build (or reuse, with ``--keep``) the folder, measure, and remove it unless kept."""
    args.out.mkdir(parents=True, exist_ok=True)
    if args.keep:
        folder = args.out / f"index-{args.shards}x{args.samples}"
        if not reusable(folder, args.shards, args.samples):
            shutil.rmtree(folder, ignore_errors=True)
            build_folder(folder, args.shards, args.samples)
        return measure(folder, args)
    folder = Path(tempfile.mkdtemp(prefix="bench_index-", dir=args.out))
    try:
        build_folder(folder, args.shards, args.samples)
        return measure(folder, args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def print_table(r: dict[str, Any]) -> None:
    print(f"imgprep index of {r['shards']} shards, {r['samples']} samples, "
          f"{r['bytes'] / 1e6:.0f} MB{' (+ DALI indexes)' if r['dali'] else ''}; "
          f"{r['repeat']} rounds, {r['cores']} cores, load average {r['load_average']}")
    print(f"  {'measure':<10} {'median/s':>10} {'best/s':>10} {'seconds':>8} {'CPU s':>7} "
          f"{'main s':>7} {'foreign':>8}")
    for k, v in r["rates_samples_per_s"].items():
        print(f"  {k:<10} {v['median']:>10} {v['best']:>10} {v['seconds']:>8} "
              f"{v['cpu_s']:>7} {v['main_cpu_s']:>7} {v['foreign_cores']:>8}")
    print(f"  2 workers / 1 worker  {r['index_2w_over_1w']:.3f} (target >= "
          f"{TARGET_2W_OVER_1W}) {r['verdict']}; same index bytes every pass: "
          f"{r['identical']}")
    print(f"  CPU time, 2 workers / 1 worker  {r['cpu_2w_over_1w']:.3f} (the pool's own cost)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=200, help="shards in the set")
    ap.add_argument("--samples", type=int, default=1000, help="samples a shard")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--dali", action="store_true", help="write the DALI indexes too")
    ap.add_argument("--out", type=Path, default=REPO / "bench-out",
                    help="where the set is made (default: %(default)s)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the set in --out and reuse it on the next run")
    args = ap.parse_args(argv)
    if min(args.shards, args.samples, args.repeat) < 1:
        ap.error("--shards, --samples and --repeat must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    res = run(args)
    print_table(res)
    print(json.dumps(res, sort_keys=True))
    return 0 if res["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
