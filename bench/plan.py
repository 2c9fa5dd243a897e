"""What an epoch's plan costs one rank, from sample counts alone (no images are read).

Shard sets shaped as ``imgprep convert`` writes them at three sizes: 100,000, 1,281,167
(ILSVRC2012 train) and 13,153,500 samples (ImageNet-21k winter21), cut into 1,024-sample
shards (the last shorter). A 16-node x 8-rank World (128 ranks) in replicate mode, batch 256
a rank, 8 workers, ``tail="drop"``: for each size and each epoch order version
(``loaders.order``), the plan of the first and the last rank (``loaders.plan_epoch``), timed
in rounds (every case once a round, the median kept) and, in a pass of its own, the peak
memory the plan allocates (``tracemalloc``: numpy's arrays included).

Printed per case: the rank's share (samples), milliseconds per plan, microseconds per sample
of the share and the peak. The figure: version 2's microseconds per sample at the largest
size over the smallest (the plan costs the rank's share, not the set: target <= 1.3), and
version 1 over version 2 at the largest. Last line: one JSON object.

Run: ``python -m bench.plan`` (``--totals 100000,1281167,13153500 --repeats 5``)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence
from typing import Any

from bench.common import machine_busy_s, verdict
from imgprep import World
from loaders import plan_epoch

TOTALS = (100_000, 1_281_167, 13_153_500)
SHARD = 1024  # samples a shard
NODES, LOCAL, BATCH, WORKERS = 16, 8, 256, 8
VERSIONS = (1, 2)
TARGET = 1.3  # version 2: us per sample at the largest size / at the smallest


def shard_counts(total: int) -> list[int]:
    """``total`` samples in 1,024-sample shards, the last one shorter."""
    full, rest = divmod(total, SHARD)
    return [SHARD] * full + ([rest] if rest else [])


def ranks() -> list[World]:
    """The first and the last rank of the job."""
    n = NODES * LOCAL
    return [World(rank=r, world_size=n, local_rank=r % LOCAL, local_world_size=LOCAL,
                  node_rank=r // LOCAL, num_nodes=NODES) for r in (0, n - 1)]


def plan_once(samples: Sequence[int], world: World, version: int) -> tuple[float, int]:
    """One rank's plan of epoch 1: seconds, and the samples of its share."""
    t0 = time.perf_counter()
    plan = plan_epoch(samples, world, "replicate", 0, 1, BATCH, WORKERS, "drop",
                      order_version=version)
    return time.perf_counter() - t0, int(plan.table.size)


def peak_bytes(samples: Sequence[int], world: World, version: int) -> int:
    """The peak of what one plan allocates (``tracemalloc``)."""
    tracemalloc.start()
    try:
        plan_epoch(samples, world, "replicate", 0, 1, BATCH, WORKERS, "drop",
                   order_version=version)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def measure(totals: Sequence[int], repeats: int) -> dict[str, Any]:
    sets = {t: shard_counts(t) for t in totals}
    worlds = ranks()
    times: dict[tuple[int, int], list[float]] = {(t, v): [] for t in totals for v in VERSIONS}
    share: dict[int, int] = {}
    busy0, wall0 = machine_busy_s(), time.perf_counter()
    for v in VERSIONS:  # warm the imports and the caches once
        plan_once(sets[totals[0]], worlds[0], v)
    for _ in range(repeats):
        for t in totals:
            for v in VERSIONS:
                runs = [plan_once(sets[t], w, v) for w in worlds]
                times[(t, v)].append(statistics.mean(s for s, _ in runs))
                share[t] = runs[0][1]
    rows = []
    for (t, v), secs in times.items():
        s = statistics.median(secs)
        peak = max(peak_bytes(sets[t], w, v) for w in worlds)
        rows.append({"total": t, "shards": len(sets[t]), "version": v, "share": share[t],
                     "ms": round(1e3 * s, 3), "us_per_sample": round(1e6 * s / share[t], 4),
                     "peak_kb": round(peak / 1024)})
    busy = machine_busy_s() - busy0
    wall = time.perf_counter() - wall0
    per = {(r["total"], r["version"]): r["us_per_sample"] for r in rows}
    small, big = min(totals), max(totals)
    ratio = per[(big, 2)] / per[(small, 2)]
    return {"benchmark": "plan", "world": f"{NODES}x{LOCAL}", "batch": BATCH,
            "workers": WORKERS, "repeats": repeats, "results": rows,
            "v2_ratio_largest_over_smallest": round(ratio, 3), "target": TARGET,
            "verdict": verdict(ratio, TARGET, below=True),
            "v1_over_v2_largest": round(per[(big, 1)] / per[(big, 2)], 1),
            "machine_cores_busy": round(busy / wall, 2)}


def print_table(res: dict[str, Any]) -> None:
    print(f"{'samples':>11s} {'shards':>7s} {'order':>5s} {'share':>7s} {'ms/plan':>9s} "
          f"{'us/sample':>10s} {'peak kB':>9s}")
    for r in res["results"]:
        print(f"{r['total']:11,d} {r['shards']:7,d} {'v' + str(r['version']):>5s} "
              f"{r['share']:7,d} {r['ms']:9.3f} {r['us_per_sample']:10.4f} {r['peak_kb']:9,d}")
    print(f"v2 us/sample, largest / smallest set: {res['v2_ratio_largest_over_smallest']:.3f} "
          f"(target <= {res['target']}) {res['verdict']}; v1 / v2 at the largest: "
          f"{res['v1_over_v2_largest']}x; machine cores busy: {res['machine_cores_busy']}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--totals", default=",".join(str(t) for t in TOTALS),
                    help="comma-separated sample counts (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=5, help="rounds (default: %(default)s)")
    args = ap.parse_args(argv)
    totals = sorted({int(t) for t in args.totals.split(",")})
    if len(totals) < 2 or totals[0] < NODES * LOCAL * BATCH or args.repeats < 1:
        ap.error(f"--totals needs two sizes of at least {NODES * LOCAL * BATCH} samples (a "
                 "step of the job) and --repeats at least 1")
    res = measure(totals, args.repeats)
    print_table(res)
    print(json.dumps(res, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
