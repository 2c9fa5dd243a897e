"""A full-size rehearsal of the whole pipeline on this machine: ILSVRC2012's real layout and
counts (1,281,167 train images in 1,000 class tars, 50,000 val images with devkit ground
truth), small images (48-96 px, converted to 64 px) so that it fits in an hour.

    python -m harness.rehearsal.run                      # full size (make rehearsal)
    python -m harness.rehearsal.run --images 100000 --json-out /tmp/rehearsal-100k.json
    python -m harness.rehearsal.run --compare /tmp/rehearsal-100k.json   # the 1.3x rule
    python -m harness.rehearsal.run --record full.json --compare /tmp/rehearsal-100k.json
    python -m harness.rehearsal.run --images 20000       # a short check of the script

The input (``harness.rehearsal.dataset``) is made once per image count under ``--out`` and reused.
The steps, each timed in child processes whose peak RSS (``VmRSS`` summed over the process
tree, sampled from /proc every 0.1 s), open file descriptors (summed over the tree, sampled)
and CPU time (``RUSAGE_CHILDREN``) are recorded, with the disk the work folder holds after it
(``harness.rehearsal.measure``):

1. ``imgprep convert`` of the train tar and of the val tar with its devkit ground truth,
   ``--size 64``, ``--workers`` left at its default, which is ``auto``: the cores this
   process may use (the command takes no literal ``auto``);
2. ``imgprep verify`` of both splits (every image decoded; workers: the same default);
3. ``imgprep index``, with each split's sample index moved aside first: rebuilt from the tar
   headers and compared byte for byte with the one convert wrote (DALI indexes by sha256,
   manifests unchanged);
4. ``imgprep stage-to-node`` as 4 process-nodes under torchrun's variables (RANK,
   WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE=1, GROUP_RANK, MASTER_ADDR=127.0.0.1 and a free
   MASTER_PORT; no namespaces): ``--fanout`` (replicate, both splits), then ``--mode
   partition --split train`` (the val split has too few shards for 4 nodes at small sizes,
   so it is left out at every size, for runs to compare); every node's files compared byte
   for byte with the source's. Fan-out nodes 1-3 and the
   partition nodes are removed once checked (node 0 feeds the next steps), so the disk holds
   at most the input, the conversion and five node folders at once;
5. the shard loader (``harness.rehearsal.loaderstep``): every rank's epoch plan for 16 nodes x 8
   ranks x batch 256 from the counts (one rank's time is reported), then one rank on this
   machine loading the first ``--slice`` samples of an epoch (the whole epoch when the set is
   smaller) from fan-out node 0 in ``pad`` mode, its pages dropped from the cache first (a
   cold first epoch at every size), its labels checked against the plan and,
   over a whole epoch, every sample seen once;
6. ``scripts/train_imagenet.py --arch tiny --image-size 64`` for ``--train-steps`` steps on
   fan-out node 0, timed by the trainer's own images/s over its last logged steps (it
   trains the same images at every size; its start-up is in ``process_s``).

It prints a Markdown table (per step: time, rate, per-image cost, peak RSS, descriptors,
disk), a projection to a 16-core node and to 16 nodes with each assumption
(``harness.rehearsal.report``), with ``--compare`` each step's per-image cost against an earlier
run's, and then one JSON record as the last line (also written to ``--json-out``). The run
stops at ``--timeout`` minutes, killing the running step; the work folder is removed at the
end unless ``--keep`` (the input stays, for the next run; ``--drop-input`` removes it too).
Exit 0 when every step ran and every check held, else 1.

``--shape in21k`` rehearses ImageNet-21k's shape instead (``harness.rehearsal.in21k``): one
plain ``winter21_whole.tar`` of 19,167 class tars at skewed counts (13,153,500 images at full
size; ``--images`` counts the whole archive), converted by one ``imgprep convert
--holdout-per-class 10``, which writes the train split and a val split held out of it (the
step ``convert train+val``; its check: each split's count, the class table of the 19,167
wnids present, the holdout recorded in both manifests). The later steps are those above, on
the train and val splits it wrote; the projection is to 13,153,500 images, and ``--compare``
against an ILSVRC-shape record sets this step against that run's ``convert train``, cost per
image.

    python -m harness.rehearsal.run --shape in21k --images 100000 \
        --compare bench-out/rehearsal-100k.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import REPO, free_port
from harness.checks import clean_env
from harness.rehearsal import checks, in21k
from harness.rehearsal.checks import SPLITS
from harness.rehearsal.dataset import (
    DEVKIT_MAP,
    FULL_TRAIN,
    GROUND_TRUTH,
    MIN_IMAGES,
    TRAIN_TAR,
    VAL_TAR,
    make_input,
)
from harness.rehearsal.measure import Deadline, Proc, disk_bytes, retime, run_step
from harness.rehearsal.report import compare, compare_table, table

TRAIN = REPO / "scripts" / "train_imagenet.py"
NODES = 4
SIZE = 64
SHAPES = ("ilsvrc", in21k.SHAPE)
STEP_COUNT = {"ilsvrc": 9, in21k.SHAPE: 8}  # every step of a finished run


@dataclass
class Run:
    """One rehearsal: its options, folders, deadline and the record it builds."""

    args: argparse.Namespace
    inp: Path
    work: Path
    deadline: Deadline
    images: int  # what the input holds: the train tar's (ilsvrc), the archive's (in21k)
    train: int
    val: int
    shape: str = "ilsvrc"
    steps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def src(self) -> Path:
        return self.work / "src"

    def node(self, kind: str, k: int | str) -> Path:
        return self.work / f"{kind}-node{k}"


def imgprep(*args: object) -> list[str]:
    return [sys.executable, "-m", "imgprep", *(str(a) for a in args)]


def finish(run: Run, step: dict[str, Any], procs: list[Proc], check: dict[str, Any],
           ok: bool) -> bool:
    """Record ``step`` with its check; ok when every process exited 0 and the check held."""
    failed = [f"exit {p.rc}: {p.err[-300:]}" for p in procs if p.rc != 0]
    step.update(check=check, errors=failed, ok=ok and not failed and not step["timed_out"],
                disk_bytes=disk_bytes(run.work))
    run.steps.append(step)
    print(f"rehearsal: {step['step']}: {step['seconds']:.1f} s, {step['rate']:.0f} images/s, "
          f"{'ok' if step['ok'] else 'FAILED ' + json.dumps(check)[:300] + str(failed)}",
          file=sys.stderr, flush=True)
    return bool(step["ok"])


def convert_steps(run: Run) -> bool:
    jobs: list[tuple[str, int, list[object]]] = [
        ("convert train", run.images, [run.inp / TRAIN_TAR]),
        ("convert val", run.val, [run.inp / VAL_TAR, "--labels", run.inp / GROUND_TRUTH,
                                  "--labels", run.inp / DEVKIT_MAP])]
    for name, n, args in jobs:
        cmd = imgprep("convert", *args, "-o", run.src, "--size", SIZE, "--json", "-q")
        step, procs = run_step(name, n, [(cmd, clean_env())], run.deadline)
        s = procs[0].last
        check = {"samples": s.get("samples"), "complete": s.get("complete"),
                 "workers": s.get("workers"), "expected": n}
        if not finish(run, step, procs, check, s.get("samples") == n and bool(s.get("complete"))):
            return False
    return True


def holdout_convert_step(run: Run) -> bool:
    """The in21k archive in one command, its val split held out of its train split."""
    cmd = imgprep("convert", run.inp / in21k.ARCHIVE, "-o", run.src, "--size", SIZE,
                  "--holdout-per-class", in21k.HOLDOUT, "--json", "-q")
    step, procs = run_step(in21k.CONVERT_STEP, run.images, [(cmd, clean_env())], run.deadline)
    s = procs[0].last
    parts = s.get("splits", [])
    want = {"val": run.val, "train": run.train}
    check: dict[str, Any] = {
        "samples": {p.get("split"): p.get("samples") for p in parts},
        "complete": s.get("complete"), "workers": [p.get("workers") for p in parts],
        "expected": want}
    if procs[0].rc == 0:
        check.update(checks.holdout_manifests(run.src))
    ok = (check["samples"] == want and bool(s.get("complete"))
          and check.get("classes") == in21k.SYNSETS and bool(check.get("same_classes"))
          and check.get("holdout_images") == {"val": run.val, "train": run.val})
    return finish(run, step, procs, check, ok)


def verify_step(run: Run) -> bool:
    n = run.train + run.val
    step, procs = run_step("verify", n, [(imgprep("verify", run.src, "--json", "-q"),
                                          clean_env())], run.deadline)
    s = procs[0].last
    check = {"ok": s.get("ok"), "samples": s.get("samples"), "problems": s.get("problems"),
             "expected": n}
    return finish(run, step, procs, check, bool(s.get("ok")) and s.get("samples") == n)


def index_step(run: Run) -> bool:
    state = checks.before_index(run.src)
    step, procs = run_step("index", run.train + run.val,
                           [(imgprep("index", run.src, "--json", "-q"), clean_env())],
                           run.deadline)
    check = checks.after_index(run.src, state) if procs[0].rc == 0 else {}
    return finish(run, step, procs, check, bool(check.get("index_identical")))


def stage_step(run: Run, kind: str, options: list[str]) -> bool:
    """4 process-nodes under torchrun's variables, one rank each; then every node checked."""
    env = {"WORLD_SIZE": NODES, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1,
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port()}
    cmd = imgprep("stage-to-node", "--src", run.src, "--dst", run.node(kind, "{node}"),
                  *options, "--timeout", max(60, int(run.deadline.left())), "--json", "-q")
    jobs = [(cmd, clean_env(**env, RANK=k, GROUP_RANK=k)) for k in range(NODES)]
    mode, splits = ("partition", ("train",)) if kind == "partition" else ("replicate", SPLITS)
    name = f"stage {'fan-out' if kind == 'fanout' else 'partition'} {NODES} nodes"
    images = run.train + (run.val if "val" in splits else 0)
    step, procs = run_step(name, images, jobs, run.deadline)
    step["bytes_written"] = sum(int(p.last.get("bytes_written", 0)) for p in procs)
    step["bytes_read"] = sum(int(p.last.get("bytes_read", 0)) for p in procs)
    dsts = [run.node(kind, k) for k in range(NODES)]
    ok = all(p.rc == 0 for p in procs)
    check = checks.staged_nodes(run.src, dsts, mode, splits) if ok else {}
    check["roles"] = sorted(str(p.last.get("role")) for p in procs)
    check["bytes_read_from_source"] = step["bytes_read"]
    ok = finish(run, step, procs, check, bool(check.get("identical")))
    for k in range(1 if kind == "fanout" else 0, NODES):  # node 0 of fan-out feeds the rest
        shutil.rmtree(dsts[k], ignore_errors=True)
    return ok


def loader_step(run: Run, name: str, images: int, argv: list[object]
                ) -> tuple[dict[str, Any], list[Proc]]:
    cmd = [sys.executable, "-m", "harness.rehearsal.loaderstep", *(str(a) for a in argv)]
    step, procs = run_step(name, images, [(cmd, clean_env())], run.deadline)
    return step, procs


def loader_steps(run: Run) -> bool:
    step, procs = loader_step(run, "loader plan 16x8 ranks", run.train,
                              ["plan", run.src, "--nodes", 16, "--local", 8, "--batch", 256])
    p = procs[0].last
    if p:
        retime(step, float(p["plan_rank_s"]), float(p["plan_rank_s"]))
        step["plan_rank_s"] = p["plan_rank_s"]
    if not finish(run, step, procs, p, bool(p.get("every_sample_once"))):
        return False
    want = min(run.train, run.args.slice)
    step, procs = loader_step(run, "loader epoch slice", want,
                              ["slice", run.node("fanout", 0), "--samples", want,
                               "--batch", 256, "--size", SIZE])
    s = procs[0].last
    if s:
        step["images"] = int(s["samples"])
        retime(step, float(s["seconds"]))
    ok = bool(s.get("labels_match_plan")) and bool(s.get("no_sample_twice")) and (
        bool(s.get("every_sample_once")) or not s.get("whole_epoch"))
    return finish(run, step, procs, s, ok)


def train_step(run: Run) -> bool:
    steps, batch = run.args.train_steps, 64
    cmd = [sys.executable, str(TRAIN), "--data", run.node("fanout", 0),
           "--arch", "tiny", "--image-size", SIZE, "--batch-size", batch, "--steps", steps,
           "--epochs", 1, "--warmup-epochs", 0, "--no-validate", "--log-every", 10]
    step, procs = run_step("train tiny net", steps * batch,
                           [([str(c) for c in cmd], clean_env())], run.deadline)
    t = procs[0].last
    check = {"steps": t.get("steps", t.get("step")),
             "images_per_s": (t.get("last_log") or {}).get("images_per_s"),
             "replicas_identical": t.get("replicas_identical")}
    if check["images_per_s"]:  # the steps' own rate: the same 1,280 images at every size
        retime(step, step["images"] / float(check["images_per_s"]))
    return finish(run, step, procs, check, bool(t))


def run_all(run: Run) -> None:
    first = holdout_convert_step if run.shape == in21k.SHAPE else convert_steps
    stages = (first, verify_step, index_step,
              lambda r: stage_step(r, "fanout", ["--fanout"]),
              lambda r: stage_step(r, "partition", ["--mode", "partition", "--split", "train"]),
              loader_steps, train_step)
    for stage in stages:
        if run.deadline.left() <= 0 or not stage(run):
            return


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=SHAPES, default="ilsvrc",
                    help="ILSVRC2012's train and val tars, or one ImageNet-21k archive of "
                         "19,167 class tars with val held out of it")
    ap.add_argument("--images", type=int,
                    help=f"ilsvrc: train images (default: the real {FULL_TRAIN:,}; at least "
                         f"{MIN_IMAGES:,}), val scales with it; in21k: the archive's images "
                         f"(default: {in21k.FULL_IMAGES:,}; at least {in21k.MIN_IMAGES:,})")
    ap.add_argument("--out", type=Path, default=REPO / "bench-out" / "rehearsal",
                    help="holds the cached input and, while it runs, the work folder")
    ap.add_argument("--timeout", type=float, default=75.0, help="minutes for the whole run")
    ap.add_argument("--slice", type=int, default=100_000,
                    help="samples the loader step loads (the whole epoch when fewer)")
    ap.add_argument("--train-steps", type=int, default=20)
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--drop-input", action="store_true", help="remove the cached input too")
    ap.add_argument("--json-out", type=Path, help="also write the JSON record here")
    ap.add_argument("--compare", type=Path, metavar="OTHER.json",
                    help="an earlier run's record: per-step per-image cost ratios")
    ap.add_argument("--record", type=Path, metavar="THIS.json",
                    help="run nothing: print this saved record's table (and --compare)")
    args = ap.parse_args(argv)
    full, least = ((in21k.FULL_IMAGES, in21k.MIN_IMAGES) if args.shape == in21k.SHAPE
                   else (FULL_TRAIN, MIN_IMAGES))
    if args.images is None:
        args.images = full
    if args.images < least:
        ap.error(f"--images must be at least {least} at the {args.shape} shape")
    return args


def rehearse(args: argparse.Namespace) -> dict[str, Any]:
    """Make or reuse the input, run every step within the deadline, clean up; the record."""
    t0, load_before = time.perf_counter(), loadavg()
    deadline = Deadline(args.timeout * 60)
    ilsvrc = args.shape == "ilsvrc"
    inp = make_input(args.out, args.images) if ilsvrc else in21k.make_input(args.out,
                                                                             args.images)
    work = args.out / (f"work-{args.images}" if ilsvrc else f"work-{args.shape}-{args.images}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    val = int(inp["val"])
    run = Run(args=args, inp=Path(inp["folder"]), work=work, deadline=deadline,
              images=args.images, train=args.images if ilsvrc else args.images - val,
              val=val, shape=args.shape)
    try:
        run_all(run)
    finally:
        peak = max((s.get("disk_bytes", 0) for s in run.steps), default=0)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        left = disk_bytes(work)
        input_bytes = disk_bytes(run.inp)
        if args.drop_input:
            shutil.rmtree(run.inp, ignore_errors=True)
    done = [s["step"] for s in run.steps]
    shape = {} if ilsvrc else {"shape": args.shape, "train": run.train,
                               "holdout_per_class": in21k.HOLDOUT}
    return {
        **shape, "images": args.images, "val": run.val, "command": " ".join(sys.argv),
        "cores": os.cpu_count(), "load_before": load_before, "load_after": loadavg(),
        "input": {k: v for k, v in inp.items() if k != "folder"},
        "steps": run.steps,
        "ok": all(s["ok"] for s in run.steps) and len(done) == STEP_COUNT[args.shape],
        "timed_out": deadline.left() <= 0, "wall_s": time.perf_counter() - t0,
        "disk": {"input_bytes": input_bytes, "work_peak_bytes": peak, "work_left_bytes": left,
                 "kept": args.keep, "input_dropped": args.drop_input}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.record is not None:  # a saved run: its table (and comparison) only
        record: dict[str, Any] = json.loads(args.record.read_text())
    else:
        record = rehearse(args)
    print(table(record))
    if args.compare is not None:
        record["compare"] = compare(record, json.loads(args.compare.read_text()))
        print("\n" + compare_table(record["compare"]))
    line = json.dumps(record, sort_keys=True)
    if args.json_out is not None:
        args.json_out.write_text(line + "\n")
    print(line)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
