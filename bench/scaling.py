"""Scaling of the embedded trainer: 1 and 2 processes (more with --procs), same per-process batch.

Runs ``scripts/train_imagenet.py`` under torchrun with each process count, one CPU thread and
one loader worker per process, on shards converted from the real ImageNet sample (or on
``--data``), discards the first log interval (start-up), and reports images/s, scaling
efficiency (images/s at p processes / (p x images/s at 1)), and the per-iteration time split
(data wait, forward+backward, exposed all-reduce, optimizer; mean over ranks). Targets at 2
processes with ResNet-50: exposed all-reduce < 10 % of the step, efficiency >= 0.85.
``--bf16`` goes to the trainer: ``on`` by default, the configuration of the published figures
(docs/benchmarks.md), whatever the CPU; ``auto`` is the trainer's own default.
``--svg FILE`` draws images/s and the split per process count.

    python -m bench.scaling                               # ResNet-50, 1 and 2 processes
    python -m bench.scaling --arch tiny --image-size 64 --steps 60 --svg scaling.svg
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bench.chart import scaling_svg
from bench.common import DEFAULT_IMAGES, REPO, run_main, verdict
from imgprep import ConvertOptions, convert_splits

TRAIN = REPO / "scripts" / "train_imagenet.py"
PHASES = ("data", "compute", "allreduce", "optimizer")
TARGET_EFFICIENCY, TARGET_EXPOSED = 0.85, 0.10


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES,
                    help="real <wnid>_<name>.JPEG files to convert (default: %(default)s)")
    ap.add_argument("--data", type=Path, default=None,
                    help="use these converted shards instead of converting --images")
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch-size", type=int, default=8, help="per process")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--log-every", type=int, default=4)
    ap.add_argument("--allreduce-dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--bf16", default="on", metavar="{on,auto,off}",
                    help="the trainer's --bf16 (autocast), passed on for it to check: on "
                         "(default), auto or off")
    ap.add_argument("--svg", type=Path, default=None, help="write the picture here")
    ap.add_argument("--no-targets", dest="targets", action="store_false",
                    help="show the figures only, without targets and verdicts (the demo's "
                         "tiny net on a small machine is not what the targets are for)")
    ap.add_argument("--out", type=Path, default=None, help="scratch folder")
    return ap.parse_args(argv)


def run_trainer(data: Path, procs: int, args: argparse.Namespace, log: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs),
           "--master-port", str(29500 + procs), str(TRAIN), "--data", str(data),
           "--arch", args.arch, "--batch-size", str(args.batch_size), "--workers", "1",
           "--threads", "1", "--image-size", str(args.image_size), "--steps", str(args.steps),
           "--epochs", "1000", "--log-every", str(args.log_every), "--no-validate",
           "--allreduce-dtype", args.allreduce_dtype, "--bf16", args.bf16,
           "--log-json", str(log)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise SystemExit(f"bench_scaling: the trainer failed with {procs} processes:\n"
                         f"{done.stderr[-2000:]}")


def summarise(log: Path, procs: int) -> dict[str, Any]:
    """Average the log intervals after the first (start-up and warm-up)."""
    recs = [r for r in map(json.loads, log.read_text().splitlines()) if "mean" in r][1:]
    if not recs:
        raise SystemExit(f"bench_scaling: {log} holds too few intervals; raise --steps")
    split = {p: statistics.mean(r["mean"][p] for r in recs) for p in PHASES}
    step = sum(split.values())
    return {
        "procs": procs,
        "images_per_s": statistics.mean(r["images_per_s"] for r in recs),
        "images_per_s_per_process": statistics.mean(r["images_per_s_per_rank"] for r in recs),
        "split_ms": {p: round(v * 1e3, 2) for p, v in split.items()},
        "max_split_ms": {p: round(statistics.mean(r["max"][p] for r in recs) * 1e3, 2)
                         for p in PHASES},
        "step_ms": round(step * 1e3, 2),
        "data_wait_fraction": split["data"] / step if step else 0.0,
        "exposed_allreduce_fraction": split["allreduce"] / step if step else 0.0,
        "intervals": len(recs),
    }


def measure(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    data = args.data
    if data is None:
        tar = scratch / "images.tar"
        subprocess.run(["tar", "cf", str(tar), "-C", str(args.images), "."], check=True)
        data = scratch / "shards"
        convert_splits(ConvertOptions(input=tar, out=data, num_shards=8,
                                      workers=os.cpu_count() or 1))
    rows = []
    for p in args.procs:
        log = scratch / f"log-{p}.jsonl"
        run_trainer(data, p, args, log)
        rows.append(summarise(log, p))
    base = rows[0]["images_per_s"] / rows[0]["procs"]
    for r in rows:
        r["efficiency"] = round(r["images_per_s"] / (r["procs"] * base), 3) if base else 0.0
    two = next((r for r in rows if r["procs"] == 2), None)
    checks = {}
    if two is not None and args.targets:
        checks = {
            "efficiency_2": {"value": two["efficiency"], "target": f">= {TARGET_EFFICIENCY}",
                             "result": verdict(two["efficiency"], TARGET_EFFICIENCY)},
            "exposed_allreduce_2": {
                "value": round(two["exposed_allreduce_fraction"], 4),
                "target": f"< {TARGET_EXPOSED}",
                "result": verdict(two["exposed_allreduce_fraction"], TARGET_EXPOSED, below=True)},
        }
    if args.svg is not None:
        args.svg.parent.mkdir(parents=True, exist_ok=True)
        args.svg.write_text(scaling_svg(rows, f"{args.arch}, batch {args.batch_size}/process, "
                                        f"{args.allreduce_dtype} all-reduce (Gloo, CPU)"))
    return {"benchmark": "scaling", "arch": args.arch, "batch_size": args.batch_size,
            "image_size": args.image_size, "allreduce_dtype": args.allreduce_dtype,
            "bf16": args.bf16,
            "cpus": os.cpu_count(), "rows": rows, "checks": checks,
            "svg": str(args.svg) if args.svg else None}


def print_table(res: dict[str, Any]) -> None:
    print(f"trainer scaling: {res['arch']}, batch {res['batch_size']} per process, "
          f"{res['image_size']} px, --bf16 {res['bf16']}, {res['allreduce_dtype']} all-reduce, "
          f"{res['cpus']} CPUs, "
          "1 thread + 1 loader worker per process")
    print(f"{'procs':>5} {'img/s':>8} {'/proc':>7} {'eff':>5}  ms per iteration (mean over "
          "ranks): data  fwd+bwd  exposed-allreduce  optimizer")
    for r in res["rows"]:
        s = r["split_ms"]
        print(f"{r['procs']:5d} {r['images_per_s']:8.2f} {r['images_per_s_per_process']:7.2f} "
              f"{r['efficiency']:5.2f}  {s['data']:8.1f} {s['compute']:8.1f} "
              f"{s['allreduce']:8.1f} ({r['exposed_allreduce_fraction']:.1%}) "
              f"{s['optimizer']:8.1f}")
    for k, v in res["checks"].items():
        print(f"  {k:22s} {v['value']:8} target {v['target']:>7}  {v['result']}")
    if res["svg"]:
        print(f"  picture: {res['svg']}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.data is not None:
        scratch = Path(tempfile.mkdtemp(prefix="bench_scaling-", dir=args.out))
        try:
            res = measure(args, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        print_table(res)
        print(json.dumps(res, sort_keys=True))
        return 0
    return run_main("bench_scaling", args.images, args.out, partial(measure, args),
                    print_table)


if __name__ == "__main__":
    sys.exit(main())
