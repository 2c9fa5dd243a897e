"""The Slurm run of the cluster benchmark (``harness.cluster.bench --slurm``): one batch job.

The box (a file server and N nodes) with a real Slurm on it (harness/cluster/slurm.py); the raw
images go onto the file server as one tar; ``harness/cluster/imagenet.sbatch`` is submitted
from the head over N nodes x T tasks, as a user would, and waited for (bounded). Its steps
print a mark when they start (``step NAME EPOCH``); the harness reads the server's SFTP byte
counters as each mark appears, so every step's server bytes are the server's own count, not
the programs' reports. Then every node's staged copy is checked against the manifest's sha256,
and the trainer's time split is read from its log. With ``--mpirun-steps``, a second job
(``harness/cluster/mpirun.sbatch``) trains again from the same copies under ``mpirun``
inside the allocation.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.scaling import summarise
from harness.cluster.box import Box
from harness.cluster.measure import shards_match
from harness.cluster.netns import ClusterError, Topology, link_bytes
from harness.cluster.procs import child_env, last_json
from harness.cluster.slurm import BOX_ENV, Job, Slurm, node_name
from harness.cluster.sshfs import served_io
from imgprep import read_manifest

HERE = Path(__file__).resolve().parent
JOB = HERE / "imagenet.sbatch"
MPIRUN_JOB = HERE / "mpirun.sbatch"
# What the harness's own environment must not hand the job: another launcher's variables
# (this may itself run inside a Slurm job, or under torchrun or mpirun).
FOREIGN = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "OMPI_", "PMIX_", "PRTE_", "PMI_",
           "TORCHELASTIC_")
FOREIGN_NAMES = {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                 "LOCAL_WORLD_SIZE", "GROUP_RANK"}


class Marks:
    """The job's step marks, each with the server's counters read when it was seen: the bytes
    its SFTP processes read (files, and the data of write requests), and the bytes its link
    received and sent."""

    def __init__(self, box: Box) -> None:
        if box.server is None:
            raise ClusterError("the box is not open")
        self.topo, self.sshd = box.topo, box.server.proc.pid  # sshd lives in the server's netns
        self.at: dict[str, tuple[float, int, int, int]] = {}  # step -> epoch, rchar, rx, tx
        self.lag = 0.0  # the longest a mark waited to be seen, seconds

    def see(self, line: str) -> None:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "step":
            rx, tx = link_bytes(self.sshd)
            self.at[parts[1]] = (float(parts[2]), served_io(self.topo)[0], rx, tx)
            self.lag = max(self.lag, time.time() - float(parts[2]))

    def between(self, a: str, b: str) -> dict[str, Any]:
        """Seconds; bytes the server's SFTP processes read; bytes its link sent (to the nodes)
        and received (from them); from mark ``a`` to mark ``b``."""
        if a not in self.at or b not in self.at:
            raise ClusterError(f"the job's output lacks the marks of step {a!r} or {b!r}")
        (t0, r0, rx0, tx0), (t1, r1, rx1, tx1) = self.at[a], self.at[b]
        return {"seconds": round(t1 - t0, 2), "server_read": r1 - r0,
                "link_sent": tx1 - tx0, "link_received": rx1 - rx0}


def job_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment sbatch runs with (and so the job: Slurm exports it): this one, the
    virtualenv first on PATH, without another launcher's variables, with the box's quirks."""
    env = {k: v for k, v in child_env().items()
           if not k.startswith(FOREIGN) and k not in FOREIGN_NAMES}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return {**env, **BOX_ENV, **extra}


def raw_tar(images: Path, dst: Path) -> Path:
    """The raw images as one flat tar on the file server (convert reads it in place)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "cf", str(dst), "-C", str(images), "."], check=True, timeout=300)
    return dst


def per_task(log: Path, step: str, tasks: int) -> list[dict[str, Any]]:
    """Each task's JSON summary of ``step`` (``srun --output=$LOG/STEP-%t.json``)."""
    return [last_json((log / f"{step}-{t}.json").read_text()) for t in range(tasks)]


def check(job: Job, log: Path) -> None:
    """A ClusterError unless ``job`` completed, with its output's end and, for the step it
    was in, the last lines each task wrote."""
    if job.state == "COMPLETED":
        return
    steps = [line.split()[1] for line in job.output.splitlines()
             if line.startswith("step ") and len(line.split()) == 3]
    tails = []
    for f in sorted(log.glob(f"{steps[-1]}-*")) if steps else []:
        lines = [x for x in f.read_text(errors="replace").splitlines() if x.strip()]
        tails.append(f"--- {f.name}: " + " | ".join(lines[-4:]))
    raise ClusterError(f"job {job.job_id} ended {job.state} (exit {job.exit_code}); its "
                       f"output ends: {job.output[-1500:]}\n" + "\n".join(tails))


@dataclass
class Run:
    """What the jobs left to read: the jobs, their marks, and where their files are."""

    scratch: Path
    raw: Path
    disks: list[Path]
    up_s: float = 0.0
    version: str = ""
    job: Job | None = None
    marks: Marks | None = None
    mpirun: Job | None = None
    mpirun_marks: Marks | None = None
    leftovers: list[str] = field(default_factory=list)  # what a killed run had left

    @property
    def export(self) -> Path:
        return self.scratch / "server"

    @property
    def log(self) -> Path:
        return self.scratch / "job"


def run_jobs(args: argparse.Namespace, run: Run) -> None:
    """Box, Slurm on it, the job, then (``--mpirun-steps``) the mpirun job; all torn down
    before this returns, whatever happens."""
    n, tpn = max(args.nodes), args.tasks_per_node
    topo = Topology(args.prefix, n, args.server_mbit, args.node_mbit)
    opts = ["--nodes", str(n), "--ntasks-per-node", str(tpn)]
    shared, local = run.scratch / "mnt" / "shared", run.scratch / "mnt" / "local"
    common = {"SHARED": str(shared), "LOCAL": str(local), "LOG": str(run.log)}
    with Box(topo, run.export) as box:
        run.leftovers = box.leftovers
        t0 = time.perf_counter()
        with Slurm(box, box.scratch / "slurm", shared, local, run.disks,
                   lifetime=6 * args.timeout) as slurm:
            run.up_s = time.perf_counter() - t0
            run.version = slurm.run(["sinfo", "-V"]).strip()
            run.marks = Marks(box)
            env = job_env({**common, "RAW": str(shared / "raw" / run.raw.name),
                           "SHARDS": str(args.shards), "STEPS": str(args.train_steps)})
            run.job = slurm.sbatch(JOB, opts, env, run.log / "job.out", 3 * args.timeout,
                                   run.marks.see)
            check(run.job, run.log)
            if args.mpirun_steps > 0:
                run.mpirun_marks = Marks(box)
                env = job_env({**common, "STEPS": str(args.mpirun_steps)})
                run.mpirun = slurm.sbatch(MPIRUN_JOB, opts, env, run.log / "mpirun.out",
                                          2 * args.timeout, run.mpirun_marks.see)
                check(run.mpirun, run.log)


def measure_slurm(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    n = max(args.nodes)
    run = Run(scratch, raw_tar(args.images, scratch / "server" / "raw" / "train.tar"),
              [scratch / "disks" / node_name(k) for k in range(n)])
    run.log.mkdir()
    try:
        run_jobs(args, run)
    finally:
        if args.keep_logs is not None:  # the job's logs, for a look after the run
            shutil.copytree(run.log, args.keep_logs, dirs_exist_ok=True)
    return {**results(run, n * args.tasks_per_node, args),
            "seconds": round(time.perf_counter() - t0, 1)}


def results(run: Run, ranks: int, args: argparse.Namespace) -> dict[str, Any]:
    """The JSON result, from the jobs' marks and files and the nodes' disks."""
    assert run.job is not None and run.marks is not None
    m = read_manifest(run.export / "imagenet", "train")
    leaders = [s for s in per_task(run.log, "stage", ranks) if s.get("role") == "copier"]
    st = run.marks.between("stage", "train")
    read = sum(int(s["bytes_read"]) for s in leaders)
    mp = run.mpirun
    return {
        "benchmark": "cluster-slurm", "server_mbit": args.server_mbit,
        "node_mbit": args.node_mbit, "cpus": os.cpu_count(),
        "slurm": {"job_id": run.job.job_id, "state": run.job.state, "nodes": run.job.nodes,
                  "tasks_per_node": args.tasks_per_node, "version": run.version,
                  "up_s": round(run.up_s, 2), "job_s": run.job.seconds,
                  "marks_seen_within_s": round(run.marks.lag, 2)},
        "cleaned_leftovers": run.leftovers,
        "set": {"bytes": m.total_bytes, "shards": len(m.shards), "images": m.total_samples,
                "index_bytes": m.index.bytes if m.index is not None else 0,
                "manifest_bytes": (run.export / "imagenet" / "train.json").stat().st_size,
                "raw_bytes": run.raw.stat().st_size},
        "convert": {**run.marks.between("convert", "stage"), **{
            k: v for k, v in per_task(run.log, "convert", ranks)[0].items()
            if k in ("mode", "world_size", "tasks", "samples", "images_per_s")}},
        "stage": {**st, "server_bytes": st["server_read"],
                  "server_bytes_over_set": round(st["server_read"] / m.total_bytes, 4),
                  "copiers_read_over_set": round(read / m.total_bytes, 4),
                  "nodes_identical": shards_match([d / "imagenet" for d in run.disks], m,
                                                  "replicate"),
                  "copiers": len(leaders),
                  "bytes_read": [int(s["bytes_read"]) for s in leaders],
                  "bytes_received": [int(s.get("bytes_received", 0)) for s in leaders],
                  "copier_seconds": [s.get("seconds") for s in leaders]},
        "train": train_summary(run.log / "train.jsonl", run.marks.between("train", "end"),
                               args.train_steps, ranks),
        "mpirun": None if mp is None or run.mpirun_marks is None else {
            "job_id": mp.job_id, "state": mp.state, **train_summary(
                run.log / "mpirun-train.jsonl", run.mpirun_marks.between("train", "end"),
                args.mpirun_steps, ranks)},
    }


def train_summary(log: Path, span: dict[str, Any], steps: int, ranks: int) -> dict[str, Any]:
    s = summarise(log, ranks)
    return {"steps": steps, "ranks": ranks, "wall_s": span["seconds"],
            "images_per_s": round(s["images_per_s"], 1), "split_ms": s["split_ms"],
            "step_ms": s["step_ms"], "data_wait_fraction": round(s["data_wait_fraction"], 4)}


def print_slurm(res: dict[str, Any]) -> None:
    sl, st, tr, cv = res["slurm"], res["stage"], res["train"], res["convert"]
    print(f"Slurm in a box ({sl['version']}): job {sl['job_id']} {sl['state']} on "
          f"{', '.join(sl['nodes'])} x {sl['tasks_per_node']} tasks; cluster up in "
          f"{sl['up_s']:.1f} s, job {sl['job_s']:.1f} s from submission; file server link "
          f"{res['server_mbit']} Mbit/s, node links {res['node_mbit']} Mbit/s, "
          f"{res['cpus']} CPUs")
    s = res["set"]
    print(f"  convert: {cv['seconds']:.1f} s; {s['images']} images into {s['shards']} shards "
          f"({s['bytes']:,} bytes); the server's link sent {cv['link_sent']:,} (the raw tar "
          f"is {s['raw_bytes']:,}) and received {cv['link_received']:,}")
    print(f"  stage (fan-out): {st['seconds']:.1f} s; {st['copiers']} copiers; server read "
          f"{st['server_bytes']:,} = {st['server_bytes_over_set']:.3f} x the set; JSON "
          f"bytes_read {st['bytes_read']}, from peers {st['bytes_received']}; every node's "
          f"shards match the manifest: {st['nodes_identical']}")
    for name in ("train", "mpirun"):
        t = tr if name == "train" else res["mpirun"]
        if t is None:
            continue
        sp = t["split_ms"]
        print(f"  {'srun' if name == 'train' else 'mpirun'} train: {t['steps']} steps, "
              f"{t['ranks']} ranks, {t['wall_s']:.1f} s wall, {t['images_per_s']:.1f} img/s; "
              f"ms per step: data {sp['data']:.1f}, fwd+bwd {sp['compute']:.1f}, exposed "
              f"all-reduce {sp['allreduce']:.1f}, optimizer {sp['optimizer']:.1f} (data wait "
              f"{t['data_wait_fraction']:.1%})")
    print(f"  whole run {res['seconds']:.0f} s")
