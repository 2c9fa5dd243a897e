"""``imgprep convert --workers 1``: this checkout against another (``--peer``), under each
interpreter given (``--python``: the project's environment with pillow-simd, and one with stock
Pillow), in interleaved rounds on the same machine.

Each pass is a child process started with ``PYTHONPATH`` set to one checkout: it converts a
tar of the sample images (built once) into a fresh folder with one worker, after a warm-up
conversion of a few of them, and reports the rate of the timed ``convert_splits`` call alone
(the interpreter's start and the imports are not in it) and its CPU time. A round runs every
(checkout, interpreter) pair once; each ratio (this checkout over the peer, per interpreter)
is the median over rounds of that round's own ratio, with the passes that other processes
disturbed set aside when enough are quiet (as in ``bench.convert``).

The peer is any other checkout with its C extension built, for instance the main branch at
a commit::

    git archive 2565772 | tar -x -C /tmp/main
    (cd /tmp/main && python setup.py build_ext --inplace)
    python -m bench.convert_versions --peer /tmp/main \\
        --python .venv/bin/python --python /path/to/stock-pillow-venv/bin/python

Targets: this checkout over the peer >= 1.3 under stock Pillow and >= 0.95 under
pillow-simd (an interpreter whose PIL version ends in ``.postN`` is taken as pillow-simd).
Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    DEFAULT_IMAGES,
    QUIET_FOREIGN_CORES,
    REPO,
    machine_busy_s,
    paired_ratio,
    run_main,
    verdict,
)
from bench.convert import build_tar, list_images

TARGETS = {"stock": 1.3, "simd": 0.95}
WARMUP_IMAGES = 50
CHILD = Path(__file__).with_name("convert_once.py")  # run by path: see its docstring


def one_pass(python: Path, checkout: Path, tar: Path, warm: Path, out: Path
             ) -> tuple[dict[str, Any], float]:
    """One child's result, and how many cores other processes kept busy meanwhile."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    b0, t0 = machine_busy_s(), os.times()
    run = subprocess.run([str(python), str(CHILD), str(tar), str(warm), str(out)], env=env,
                         capture_output=True, text=True, timeout=1800, cwd=checkout)
    t1 = os.times()
    if run.returncode != 0:
        raise SystemExit(f"convert_versions: {checkout} under {python} failed:\n{run.stderr}")
    res = json.loads(run.stdout.strip().splitlines()[-1])
    wall = t1.elapsed - t0.elapsed
    own = t1.children_user + t1.children_system - t0.children_user - t0.children_system
    return res, max(0.0, (machine_busy_s() - b0 - own) / wall)


def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    paths = list_images(args.images, args.limit)
    tar, warm = scratch / "sample.tar", scratch / "warm.tar"
    build_tar(paths, tar)
    build_tar(paths[:WARMUP_IMAGES], warm)
    checkouts = {"this": REPO, "peer": args.peer.resolve()}
    pythons = [p.absolute() for p in args.python] or [Path(sys.executable)]
    passes: dict[tuple[str, str], list[tuple[float, float]]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    pil: dict[str, str] = {}
    load0 = os.getloadavg()
    for _ in range(args.repeat):
        for py in pythons:
            for name, checkout in checkouts.items():
                res, foreign = one_pass(py, checkout, tar, warm, scratch / "out")
                passes.setdefault((str(py), name), []).append((res["rate"], foreign))
                cpu.setdefault((str(py), name), []).append(res["cpu_us"])
                pil[str(py)] = res["pil"]
    envs = []
    for py in map(str, pythons):
        kind = "simd" if ".post" in pil[py] else "stock"
        ratio = paired_ratio(passes[(py, "this")], passes[(py, "peer")])
        cpu_ratio = statistics.median(p / t for t, p in zip(cpu[(py, "this")],
                                                            cpu[(py, "peer")], strict=True))
        envs.append({
            "python": py, "pil": pil[py], "kind": kind,
            "this_rates": [round(r, 1) for r, _ in passes[(py, "this")]],
            "peer_rates": [round(r, 1) for r, _ in passes[(py, "peer")]],
            "this_cpu_us": [round(c) for c in cpu[(py, "this")]],
            "peer_cpu_us": [round(c) for c in cpu[(py, "peer")]],
            "foreign_cores": [round(f, 2) for _, f in passes[(py, "this")] + passes[(py, "peer")]],
            "this_over_peer": round(ratio, 3), "this_over_peer_cpu": round(cpu_ratio, 3),
            "target": TARGETS[kind], "result": verdict(ratio, TARGETS[kind]),
        })
    return {"benchmark": "convert-versions", "images": len(paths), "repeat": args.repeat,
            "peer": str(checkouts["peer"]), "loadavg_start": [round(x, 2) for x in load0],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "quiet_foreign_cores": QUIET_FOREIGN_CORES, "envs": envs}


def print_table(res: dict[str, Any]) -> None:
    print(f"convert --workers 1, {res['images']} images: this checkout against {res['peer']}, "
          f"{res['repeat']} interleaved rounds; load average {res['loadavg_start']} -> "
          f"{res['loadavg_end']}")
    print(f"{'PIL':22s} {'this img/s':>24s} {'peer img/s':>24s} {'ratio':>6s} {'(CPU)':>6s}"
          f" {'target':>7s}  result")
    for e in res["envs"]:
        this = " ".join(f"{r:.0f}" for r in e["this_rates"])
        peer = " ".join(f"{r:.0f}" for r in e["peer_rates"])
        print(f"{e['pil'] + ' (' + e['kind'] + ')':22s} {this:>24s} {peer:>24s} "
              f"{e['this_over_peer']:6.3f} {e['this_over_peer_cpu']:6.3f} "
              f"{'>= ' + str(e['target']):>7s}  {e['result']}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer", type=Path, required=True,
                    help="another imgprep checkout with its C extension built")
    ap.add_argument("--python", type=Path, action="append", default=[],
                    help="an interpreter to run both under (repeatable; default: this one)")
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES,
                    help="folder of <wnid>_<name>.JPEG files (default: %(default)s)")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N images")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--out", type=Path, default=None, help="scratch folder (default: temporary)")
    args = ap.parse_args(argv)
    if args.repeat < 1 or (args.limit is not None and args.limit <= WARMUP_IMAGES):
        ap.error(f"--repeat must be >= 1 and --limit > {WARMUP_IMAGES}")
    return run_main("convert_versions", args.images, args.out, lambda s: run(args, s),
                    print_table)


if __name__ == "__main__":
    sys.exit(main())
