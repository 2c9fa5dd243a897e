"""A cluster in a box: what file-server contention costs a loader, and what staging saves.

Builds, on this one machine, a file server and N nodes as Linux network namespaces joined
through a bridge (itself in a namespace), each link a veth pair shaped with tc tbf: the
server's link slow (``--server-mbit``), the nodes' faster (``--node-mbit``), as on real
clusters. The server exports real converted shards (the ImageNet sample in 4 shards, repeated
to ``--mb`` MB) over sshfs; each node mounts it and has a local folder. Then, for each N in
``--nodes``:

- the same loader (``loaders.make_loader``, node k = rank k of N, 1 worker, batch 32) on every
  node at once, one whole epoch each: reading straight from the sshfs mount (direct), from the
  node's staged local copy inside its namespace (staged), and on the same local folder with no
  server and no namespace in the path (the peer); staged and peer alternate ``--rounds`` times;
- ``imgprep stage-to-node`` on every node at once, in partition, replicate and fan-out mode
  (``--mode replicate --fanout``, when this imgprep has it): seconds, bytes the server read
  (kernel rchar of its SFTP processes) against the set and against the nodes' JSON reports,
  bytes moved between nodes, and a sha256 check of every node's shards against the manifest;
- the same set served by an S3 endpoint (moto's S3 server) in the file server's namespace,
  behind the same link: ``imgprep stage-to-node --src s3://BUCKET/PREFIX/`` on every node at
  once, with fan-out and in replicate mode: seconds, the bytes the store sent (the server
  link's tx counter, headers included) against the set, and every node's shards checked
  (``--no-s3``: not);
- fan-out once more over the partition copies (every node already holds its own share, so
  only the node-to-node exchange runs): the rate a node receives at, from its link's byte
  counter while it receives, against a Gloo send/recv between two nodes in the same run.

Plus a 2-node training run (torchrun, c10d rendezvous on node 0, one process per node, the
tiny net at 64 px) from fan-out-staged data, with its time split. A table goes to stdout, the
last line is one JSON object, and ``--svg`` draws per-node images/s and staging seconds
against N. Progress lines go to stderr.

Ratios, in one run, against their targets: direct at N=4 / direct at N=1 <= 0.35; staged /
peer >= 0.9 at every N; fan-out server bytes = 1.00x the set at every N; fan-out staging time
at N=4 <= 0.4x replicate's; fan-out's node-to-node rate (N=2) >= 0.7x the Gloo point-to-point
rate.

With ``--slurm``, a real Slurm cluster runs on the box instead (harness/cluster/slurm.py,
slurmbench.py): one batch job (harness/cluster/imagenet.sbatch) over N nodes x T tasks converts
the raw images onto the file server, stages them onto every node with fan-out and trains the
tiny net from the staged copies; then, with ``--mpirun-steps``, a second job trains under
mpirun inside the allocation. The last line is one JSON object (job, stage, train).

Needs root (namespaces, FUSE, tc); installs sshfs and openssh-server (with ``--slurm``: Slurm,
munge and the PMIx library) with apt-get when missing; otherwise prints one line saying why it
skipped (exit 0, JSON with "skipped"). The machine's own network namespace is never touched
(see harness/cluster/netns.py) and everything is torn down on every exit path, SIGINT and
SIGTERM included.

    python -m harness.cluster.bench --svg docs/cluster.svg      # N = 1, 2, 4 (make cluster)
    python -m harness.cluster.bench --nodes 1 2 4 8
    python -m harness.cluster.bench --slurm --nodes 2 --json     # one Slurm job, 2 x 2 tasks
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import DEFAULT_IMAGES, repeated_shards, run_main, verdict
from bench.scaling import summarise
from harness.cluster import measure
from harness.cluster.box import Box
from harness.cluster.chart import cluster_svg
from harness.cluster.netns import ClusterError, Topology, run
from harness.cluster.packages import FILE_SERVER, SLURM, ensure
from harness.cluster.procs import child_env
from harness.cluster.s3store import S3Store
from harness.cluster.slurmbench import measure_slurm, print_slurm
from imgprep import Manifest, index_folder, read_manifest

TARGETS = {"direct_4_over_1": 0.35, "staged_over_peer": 0.9, "fanout_server_over_set": 1.00,
           "fanout_over_replicate_4": 0.4, "fanout_over_p2p": 0.7}
BYTES_TOLERANCE = 0.01
BASE_SHARDS, MIN_SHARDS = 4, 16  # ~250 real images a shard; 16: 4 a node at N=4
PORTS = {"stage": 29631, "p2p": 29632, "train": 29633, "s3": 29634}
T0 = time.perf_counter()


def note(what: str) -> None:
    """A progress line on stderr (the table and the JSON line go to stdout)."""
    print(f"[{time.perf_counter() - T0:6.1f} s] {what}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES,
                    help="real <wnid>_<name>.JPEG files to convert (default: %(default)s)")
    ap.add_argument("--nodes", type=int, nargs="+", default=None,
                    help="node counts (default: 1 2 4; with --slurm: 2)")
    ap.add_argument("--mb", type=float, default=100, help="size of the served set, MB")
    ap.add_argument("--server-mbit", type=int, default=50, help="file server link, Mbit/s")
    ap.add_argument("--node-mbit", type=int, default=1000, help="each node's link, Mbit/s")
    ap.add_argument("--rounds", type=int, default=4, help="staged/peer loader rounds")
    ap.add_argument("--train-steps", type=int, default=40, help="2-node training (0: none)")
    ap.add_argument("--no-s3", action="store_true",
                    help="skip staging from the S3 endpoint on the file server")
    ap.add_argument("--prefix", default="ipc-", help="namespace name prefix")
    ap.add_argument("--timeout", type=float, default=300.0, help="per step, seconds")
    ap.add_argument("--svg", type=Path, default=None, help="write the picture here")
    ap.add_argument("--out", type=Path, default=None, help="scratch folder (default: /tmp)")
    sl = ap.add_argument_group("Slurm (--slurm)")
    sl.add_argument("--slurm", action="store_true",
                    help="run one Slurm job on the box instead (convert, stage, train)")
    sl.add_argument("--tasks-per-node", type=int, default=2, help="Slurm tasks per node")
    sl.add_argument("--shards", type=int, default=8, help="shards the job converts into")
    sl.add_argument("--mpirun-steps", type=int, default=20,
                    help="then train under mpirun in a second job (0: not)")
    sl.add_argument("--keep-logs", type=Path, default=None,
                    help="copy the job's logs (every task's output) to this folder")
    sl.add_argument("--json", action="store_true",
                    help="accepted for symmetry: the last line is always the JSON result")
    args = ap.parse_args(argv)
    if args.nodes is None:
        args.nodes = [2] if args.slurm else [1, 2, 4]
    return args


def preflight(prefix: str, slurm: bool = False) -> str | None:
    """None when a cluster (with ``slurm``, and Slurm on it) can be built here, else the
    one-line reason it cannot."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, FUSE mounts, tc)"
    for tool in ("ip", "tc", "nsenter", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is absent (no FUSE in this machine or container)"
    why = ensure({**FILE_SERVER, **SLURM} if slurm else FILE_SERVER)
    if why:
        return why
    probe = f"{prefix}probe"
    try:
        run(["ip", "netns", "add", probe])
        run(["ip", "-n", probe, "link", "set", "lo", "up"])
    except ClusterError as e:
        return f"cannot create a network namespace: {e}"
    finally:
        run(["ip", "netns", "del", probe], check=False)
    return None


def build_set(images: Path, scratch: Path, mb: float) -> Path:
    """Real shards (``images`` converted to BASE_SHARDS shards) repeated under new names to
    >= ``mb`` MB and >= MIN_SHARDS shards, with a manifest and its sample index."""
    src = repeated_shards(images, scratch, mb * 1e6, MIN_SHARDS, BASE_SHARDS)
    index_folder(src, "train")  # the loaders read samples by offset through it
    return src


def has_fanout() -> bool:
    """Whether this imgprep's stage-to-node offers --fanout."""
    done = subprocess.run([sys.executable, "-m", "imgprep", "stage-to-node", "--help"],
                          capture_output=True, text=True, timeout=60, env=child_env())
    return "--fanout" in done.stdout


def loader_row(box: Box, n: int, mounts: Sequence[Path], staged: Sequence[Path],
               args: argparse.Namespace) -> dict[str, Any]:
    """Per-node images/s: direct from sshfs, then staged and peer in alternating order
    (ABBA...); staged/peer is the median of the rounds' ratios, so slow drifts in what else
    runs on the machine cancel. Each kind's loaders start once and wait between rounds."""
    group = partial(measure.loaders, box, timeout=args.timeout)
    rounds: dict[str, list[list[float]]] = {"direct": [], "staged": [], "peer": []}
    with group(mounts, True) as direct, group(staged, True) as local, \
            group(staged, False) as peer:
        rounds["direct"].append(direct.rates())
        for i in range(args.rounds):
            pair = [("staged", local), ("peer", peer)]
            for kind, g in pair if i % 2 == 0 else pair[::-1]:
                rounds[kind].append(g.rates())
    row: dict[str, Any] = {}
    for kind, runs in rounds.items():
        row[kind] = [round(statistics.median(r[k] for r in runs), 1) for k in range(n)]
        row[f"{kind}_mean"] = round(statistics.median(statistics.mean(r) for r in runs), 1)
    row["staged_over_peer"] = round(statistics.median(
        statistics.mean(a) / statistics.mean(b)
        for a, b in zip(rounds["staged"], rounds["peer"], strict=True)), 3)
    return row


def node_dirs(scratch: Path, mode: str, n: int) -> list[Path]:
    return [scratch / f"n{n}-{mode}" / f"node{k}" for k in range(n)]


def one_n(box: Box, n: int, m: Manifest, scratch: Path, args: argparse.Namespace,
          fanout: bool) -> dict[str, Any]:
    """Everything measured with N = ``n`` nodes. Partition first; with fan-out, a fan-out
    over the partition copies follows (every node already holds its own share, so only the
    node-to-node exchange runs: the peer rate), then replicate with the loaders, then a fresh
    fan-out. The 2-node copies the trainer reads are kept (fan-out's, else replicate's)."""
    def stage(mode: str, dirs: list[Path]) -> dict[str, Any]:
        note(f"N={n}: staging, {mode}")
        s = measure.stage(box, n, dirs, mode, m, PORTS["stage"], args.timeout)
        s["server_over_set"] = round(s["server_bytes"] / m.total_bytes, 4)
        return s

    dirs = node_dirs(scratch, "partition", n)
    staging = {"partition": stage("partition", dirs)}
    if fanout and n > 1:
        staging["exchange"] = stage("fanout", dirs)
    shutil.rmtree(dirs[0].parent)
    dirs = node_dirs(scratch, "replicate", n)
    staging["replicate"] = stage("replicate", dirs)
    note(f"N={n}: loaders, direct, then staged and without server x {args.rounds}")
    with box.mounts(n) as phase:
        row = loader_row(box, n, phase.paths, dirs, args)
    if fanout or n != 2:
        shutil.rmtree(dirs[0].parent)
    if fanout:
        dirs = node_dirs(scratch, "fanout", n)
        staging["fanout"] = stage("fanout", dirs)
        if n != 2:
            shutil.rmtree(dirs[0].parent)
    return {"nodes": n, **row, "staging": staging}


def s3_row(box: Box, store: S3Store, n: int, m: Manifest, scratch: Path,
           args: argparse.Namespace, fanout: bool) -> dict[str, Any]:
    """Staging from the S3 store onto N = ``n`` nodes: fan-out (when this imgprep has it)
    at the top level, replicate under "replicate"."""
    out: dict[str, Any] = {}
    for mode in (["fanout"] if fanout else []) + ["replicate"]:
        note(f"N={n}: staging from S3, {mode}")
        dirs = node_dirs(scratch, f"s3-{mode}", n)
        out[mode] = measure.stage_s3(box, store, n, dirs, mode, m, PORTS["stage"],
                                     args.timeout)
        shutil.rmtree(dirs[0].parent)
    top = out.get("fanout", out["replicate"])
    return {"mode": top["mode"], "seconds": top["seconds"],
            "store_bytes_over_set": top["store_bytes_over_set"],
            "nodes_identical": top["nodes_identical"], **out}


def train_row(box: Box, scratch: Path, rows: Sequence[dict[str, Any]],
              args: argparse.Namespace) -> dict[str, Any] | None:
    """The 2-node training run from the 2-node copies kept by :func:`one_n`."""
    two = next((r for r in rows if r["nodes"] == 2), None)
    if two is None or args.train_steps <= 0 or box.topo.nodes < 2:
        return None
    mode = "fanout" if "fanout" in two["staging"] else "replicate"
    log = scratch / "train.jsonl"
    note(f"training on 2 nodes from {mode}-staged data")
    wall = measure.train(box, node_dirs(scratch, mode, 2), log, args.train_steps,
                         PORTS["train"], args.timeout)
    s = summarise(log, 2)
    return {"data": mode, "steps": args.train_steps, "stage_s": two["staging"][mode]["seconds"],
            "train_wall_s": round(wall, 2), "images_per_s": round(s["images_per_s"], 1),
            "split_ms": s["split_ms"], "step_ms": s["step_ms"],
            "data_wait_fraction": round(s["data_wait_fraction"], 4)}


def fanout_peer_rate(row: dict[str, Any]) -> float | None:
    """MB/s a node received from its peers while receiving, in the exchange-only fan-out
    (mean over nodes); None without fan-out or peers."""
    x = row["staging"].get("exchange")
    return statistics.mean(x["peer_mb_per_s"]) if x is not None else None


def checks(rows: Sequence[dict[str, Any]], p2p: float | None) -> dict[str, dict[str, Any]]:
    """The ratios against their targets (only those this run could measure)."""
    by_n = {r["nodes"]: r for r in rows}
    out: dict[str, dict[str, Any]] = {}

    def put(name: str, value: float, target: float, below: bool = False) -> None:
        out[name] = {"value": round(value, 3), "target": f"{'<=' if below else '>='} {target}",
                     "result": "PASS" if (value <= target if below else value >= target)
                     else "SHORT"}

    if 1 in by_n and 4 in by_n:
        put("direct_4_over_1", by_n[4]["direct_mean"] / by_n[1]["direct_mean"],
            TARGETS["direct_4_over_1"], below=True)
    for n, r in by_n.items():
        put(f"staged_over_peer_{n}", r["staged_over_peer"], TARGETS["staged_over_peer"])
        f = r["staging"].get("fanout")
        if f is not None:
            v = f["server_over_set"]
            out[f"fanout_server_over_set_{n}"] = {
                "value": v, "target": f"= 1.00 (+-{BYTES_TOLERANCE:.0%})",
                "result": verdict(-abs(v - 1.0), -BYTES_TOLERANCE)}
    if 4 in by_n and "fanout" in by_n[4]["staging"]:
        s = by_n[4]["staging"]
        put("fanout_over_replicate_4", s["fanout"]["seconds"] / s["replicate"]["seconds"],
            TARGETS["fanout_over_replicate_4"], below=True)
    rate = fanout_peer_rate(by_n[2]) if 2 in by_n else None
    if rate is not None and p2p:
        put("fanout_over_p2p_2", rate / p2p, TARGETS["fanout_over_p2p"])
    return out


def measure_all(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    src = build_set(args.images, scratch, args.mb)
    m = read_manifest(src, "train")
    fanout = has_fanout()
    topo = Topology(args.prefix, max(args.nodes), args.server_mbit, args.node_mbit)
    rows: list[dict[str, Any]] = []
    note(f"set ready: {m.total_bytes / 1e6:.0f} MB; building the cluster")
    with Box(topo, src) as box:
        note("cluster up; Gloo send/recv between nodes 0 and 1")
        p2p = measure.p2p_rate(box, PORTS["p2p"], 32, args.timeout) if topo.nodes > 1 else None
        for n in args.nodes:
            rows.append(one_n(box, n, m, scratch, args, fanout))
        train = train_row(box, scratch, rows, args)
        s3: dict[int, dict[str, Any]] | None = None
        if not args.no_s3:
            note("S3 store on the file server: uploading the set")
            with S3Store(box, src, PORTS["s3"], args.timeout) as store:
                s3 = {n: s3_row(box, store, n, m, scratch, args, fanout) for n in args.nodes}
        leftovers = box.leftovers
    res = {"benchmark": "cluster", "server_mbit": args.server_mbit,
           "node_mbit": args.node_mbit, "set_bytes": m.total_bytes, "shards": len(m.shards),
           "index_bytes": m.index.bytes if m.index is not None else 0,
           "images": m.total_samples, "fanout": fanout, "p2p_mb_per_s": p2p, "rows": rows,
           "train": train, "stage_s3": s3, "checks": checks(rows, p2p), "cpus": os.cpu_count(),
           "cleaned_leftovers": leftovers, "seconds": round(time.perf_counter() - t0, 1),
           "svg": str(args.svg) if args.svg else None}
    for r in rows:
        r["fanout_peer_mb_per_s"] = fanout_peer_rate(r)
    if args.svg is not None:
        write_svg(res, args.svg)
    return res


def write_svg(res: dict[str, Any], path: Path) -> None:
    rows = res["rows"]
    ns = [r["nodes"] for r in rows]
    rates = [("direct (sshfs)", "#d7301f", [r["direct_mean"] for r in rows]),
             ("staged (local)", "#2b7bba", [r["staged_mean"] for r in rows])]
    staging = [(label, colour, [r["staging"][mode]["seconds"] if mode in r["staging"] else None
                                for r in rows])
               for label, colour, mode in (("replicate", "#d7301f", "replicate"),
                                           ("partition", "#999999", "partition"),
                                           ("fan-out", "#2b7bba", "fanout"))]
    title = (f"cluster in a box: file server {res['server_mbit']} Mbit/s, node links "
             f"{res['node_mbit']} Mbit/s, {res['set_bytes'] / 1e6:.0f} MB set")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cluster_svg(ns, rates, staging, title))


def print_table(res: dict[str, Any]) -> None:
    p2p = res["p2p_mb_per_s"]
    print(f"cluster in a box: file server link {res['server_mbit']} Mbit/s, node links "
          f"{res['node_mbit']} Mbit/s, set {res['shards']} shards / {res['set_bytes'] / 1e6:.0f}"
          f" MB / {res['images']} images, {res['cpus']} CPUs; Gloo send/recv node to node "
          f"{p2p if p2p is not None else '-'} MB/s")
    print("loader images/s per node (mean over nodes; node k = rank k of N, 1 worker, batch 32,"
          " whole epochs)")
    print(f"{'N':>3} {'direct (sshfs)':>15} {'staged (local)':>15} {'same folder, no server':>23}"
          f" {'staged/no-server':>17}")
    for r in res["rows"]:
        print(f"{r['nodes']:3d} {r['direct_mean']:15.1f} {r['staged_mean']:15.1f} "
              f"{r['peer_mean']:23.1f} {r['staged_over_peer']:17.3f}")
    print("staging the set onto N nodes (stage-to-node on every node at once)")
    print(f"{'N':>3} {'mode':10} {'seconds':>8} {'server bytes':>13} {'x set':>6} "
          f"{'JSON bytes_read':>16} {'from peers':>11} {'peer MB/s':>10}  shards ok")
    for r in res["rows"]:
        for mode, s in r["staging"].items():
            peer = statistics.mean(s["peer_mb_per_s"]) if mode == "exchange" else None
            print(f"{r['nodes']:3d} {mode:10} {s['seconds']:8.2f} {s['server_bytes']:13d} "
                  f"{s['server_over_set']:6.3f} {sum(s['bytes_read']):16d} "
                  f"{sum(s['bytes_received']):11d} "
                  f"{f'{peer:.1f}' if peer is not None else '-':>10}  {s['identical']}")
    if res["fanout"]:
        print("  exchange: fan-out over the partition copies (each node holds its own share): "
              "node to node only; peer MB/s = received while receiving, per node")
    else:
        print("  fan-out: not run (this imgprep's stage-to-node has no --fanout)")
    if res["stage_s3"] is not None:
        print("staging from the S3 store on the file server (same link; store bytes = the "
              "server link's tx, headers included)")
        print(f"{'N':>3} {'mode':12} {'seconds':>8} {'store bytes':>13} {'x set':>6}  shards ok")
        for n, row in res["stage_s3"].items():
            for mode in ("fanout", "replicate"):
                if mode in row:
                    s = row[mode]
                    print(f"{int(n):3d} {'s3 ' + mode:12} {s['seconds']:8.2f} "
                          f"{s['store_bytes']:13d} {s['store_bytes_over_set']:6.3f}  "
                          f"{s['nodes_identical']}")
    t = res["train"]
    if t is not None:
        sp = t["split_ms"]
        print(f"training, 2 nodes x 1 process, tiny net, 64 px, {t['steps']} steps, from "
              f"{t['data']}-staged data: staging {t['stage_s']:.1f} s, training "
              f"{t['train_wall_s']:.1f} s wall, {t['images_per_s']:.1f} img/s; ms per step: "
              f"data {sp['data']:.1f}, fwd+bwd {sp['compute']:.1f}, exposed all-reduce "
              f"{sp['allreduce']:.1f}, optimizer {sp['optimizer']:.1f}")
    for k, v in res["checks"].items():
        print(f"  {k:28s} {v['value']:8} target {v['target']:>16}  {v['result']}")
    print(f"  whole run {res['seconds']:.0f} s" + (f"; picture: {res['svg']}" if res["svg"]
                                                  else ""))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if sorted(set(args.nodes)) != args.nodes or args.nodes[0] < 1:
        raise SystemExit("bench_cluster: --nodes takes increasing node counts, such as 1 2 4")
    if args.slurm and len(args.nodes) != 1:
        raise SystemExit("bench_cluster: --slurm runs one job: give one node count (--nodes 2)")
    why = preflight(args.prefix, args.slurm)
    if why is not None:
        print(f"bench_cluster: skipped: {why}")
        print(json.dumps({"benchmark": "cluster-slurm" if args.slurm else "cluster",
                          "skipped": why}))
        return 0
    try:
        if args.slurm:
            return run_main("bench_cluster", args.images, args.out,
                            partial(measure_slurm, args), print_slurm)
        return run_main("bench_cluster", args.images, args.out, partial(measure_all, args),
                        print_table)
    except ClusterError as e:
        print(f"bench_cluster: error: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
