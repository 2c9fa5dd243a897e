"""Benchmark ``imgprep stage-to-node`` against ``cp -r`` on >= 1 GB of real shards.

What it measures, in one run:

- source: the real ILSVRC2012 sample images (``<repo>/../shared/data/imagenet-sample/images``,
  ``--images`` to point elsewhere) converted once to webdataset shards, then repeated under new
  shard names until the set holds at least ``--gb`` GB (default 1), with a manifest; all of it
  in a scratch folder, removed afterwards.
- the peer: ``cp -r`` of the node's shards, followed by ``sync -f`` on the destination, since
  stage-to-node fsyncs every shard before it names it (``cp -r`` alone is reported too);
- stage-to-node (replicate, one node) with sha256 verification, and with size-only checks,
  each into a fresh destination, ``--jobs`` streams;
- bytes read from the source per node, for replicate (every node reads everything) and
  partition over 2 and 4 simulated nodes (each node reads exactly its share): the summaries'
  ``bytes_read`` and, independently, the kernel's count of bytes this process read
  (``rchar`` in /proc/self/io) around each call;
- fan-out (replicate ``--fanout``) over 2 and 4 nodes run as processes on this machine,
  meeting on 127.0.0.1: each node's ``bytes_read`` (its partition share) and ``rchar`` (the
  kernel counts file reads, not the network's), ``bytes_received`` from the other nodes, and
  the rate at which the nodes received. On one machine the "network" is loopback and every
  node shares the same cores and disk: this row shows correctness and bytes, not the speed a
  cluster gets (``harness/cluster/bench.py`` measures that).

Before each timed copy the page cache is dropped when the machine allows it (root,
/proc/sys/vm/drop_caches), so the source is read from disk, as from a file server; otherwise
every copy reads a warm cache and the output says so. Targets: size-only staging >= 0.9 x the
peer's throughput; with sha256 >= 0.6 x; bytes read = exactly the node's share. A table goes to
stdout and the last line is one JSON object with every figure.

Run from the repository root, in the project's environment::

    python -m bench.stage            # >= 1 GB, a few minutes on 2 cores
    python -m bench.stage --gb 0.2   # a quick look (below the issue's 1 GB)
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
from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import DEFAULT_IMAGES, REPO, free_port, rchar, repeated_shards, run_main
from imgprep import (
    ShardEntry,
    StageOptions,
    World,
    node_shards,
    read_manifest,
    stage_to_node,
)
from imgprep.stage.fanout_net import IN_FLIGHT, NET_CHUNK

TARGETS = {"size_only_over_cp": 0.9, "sha256_over_cp": 0.6}
BASE_SHARDS = 1  # all 1000 images in one ~26 MB shard, near the ~40 MB of real shards
MB = 1e6
FANOUT_TIMEOUT = 600  # seconds for one fan-out run of all nodes
def drop_caches() -> bool:
    """Drop the page cache (so the source is read from disk); False when not allowed."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def timed(fn: Callable[[], Any], cold: bool) -> tuple[float, Any]:
    if cold:
        drop_caches()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def cp_peer(src: Path, dst: Path, sync: bool) -> None:
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    if sync:
        subprocess.run(["sync", "-f", str(dst)], check=True)


def stage_once(src: Path, dst: Path, world: World, mode: str, verify: str,
               jobs: int) -> dict[str, Any]:
    before = rchar()
    summary = asdict(stage_to_node(StageOptions(src=src, dst=dst, mode=mode, verify=verify,
                                                jobs=jobs), world))
    summary["rchar"] = rchar() - before
    return summary


# One side of a Gloo point-to-point stream over loopback, in the chunks and window fan-out uses
# (NET_CHUNK bytes a message, IN_FLIGHT posted ahead, given as arguments): rank 0 sends MB
# megabytes to rank 1, which prints the rate it received at.
P2P = """
import sys, time, datetime, torch, torch.distributed as dist
rank, port, mb, NET_CHUNK, IN_FLIGHT = map(int, sys.argv[1:6])
store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, datetime.timedelta(seconds=60))
g = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=60))
n, works = mb * 2**20 // NET_CHUNK, []
bufs = [torch.ones(NET_CHUNK, dtype=torch.uint8) for _ in range(IN_FLIGHT)]
g.barrier().wait()
t0 = time.perf_counter()
for i in range(n):
    b = bufs[i % IN_FLIGHT]
    works.append(g.send([b], 1, 0) if rank == 0 else g.recv([b], 0, 0))
    if len(works) >= IN_FLIGHT:
        works.pop(0).wait()
for w in works:
    w.wait()
if rank == 1:
    print(n * NET_CHUNK / (time.perf_counter() - t0) / 1e6)
"""


def gloo_p2p_mb_s(mb: int = 512) -> float:
    """The floor for node-to-node moves here: one Gloo stream between two processes."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", P2P, str(r), str(port), str(mb),
                               str(NET_CHUNK), str(IN_FLIGHT)],
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    try:
        out = [p.communicate(timeout=FANOUT_TIMEOUT)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return float(out[1])


def fanout_once(src: Path, scratch: Path, nodes: int, jobs: int, samples: list[int],
                shards: Sequence[ShardEntry]) -> dict[str, Any]:
    """Fan-out over ``nodes`` processes on this machine; per node: bytes read (summary and
    rchar), received; in all: seconds (from all nodes joined to all finished: process start-up
    and imports left out) and the rate at which the nodes received."""
    port, share = free_port(), node_shards(samples, nodes, "partition", 0)
    cmd = [sys.executable, "-m", "bench.rchar", "stage-to-node", "--src", str(src), "--dst",
           str(scratch / "fan-{node}"), "--fanout", "--rendezvous", f"127.0.0.1:{port}",
           "--num-nodes", str(nodes), "--jobs", str(jobs), "--json", "-q", "--node-rank"]
    procs = [subprocess.Popen([*cmd, str(k)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=REPO) for k in range(nodes)]
    rows, seconds, received = [], 0.0, 0
    try:
        for k, p in enumerate(procs):
            out, err = p.communicate(timeout=FANOUT_TIMEOUT)
            if p.returncode != 0:
                raise SystemExit(f"bench_stage: fan-out node {k} failed: {err.strip()}")
            s = json.loads(out)
            expected = sum(shards[i].bytes for i in share[k])
            rows.append({"mode": "fanout", "nodes": nodes, "node": k,
                         "bytes_read": s["bytes_read"], "bytes_received": s["bytes_received"],
                         "rchar": int(err.strip().splitlines()[-1].split()[1]),
                         "expected": expected, "exact": s["bytes_read"] == expected})
            seconds = max(seconds, s["fanout_seconds"])  # all joined .. all finished
            received += s["bytes_received"]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for k in range(nodes):
        shutil.rmtree(scratch / f"fan-{k}", ignore_errors=True)
    return {"nodes_count": nodes, "seconds": round(seconds, 2),
            "received_mb_s": round(received / seconds / MB, 1) if seconds else 0.0,
            "nodes": rows}


def source_reads(src: Path, scratch: Path, jobs: int
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Bytes read from the source per node: replicate and partition in this process, fan-out
    over processes. Returns the per-node rows and the fan-out runs."""
    m = read_manifest(src, "train")
    reads: list[dict[str, Any]] = []
    samples = [s.samples for s in m.shards]
    for mode, nodes in (("replicate", 2), ("partition", 2), ("partition", 4)):
        share = node_shards(samples, nodes, mode, 0)
        for k in range(nodes):
            dst = scratch / f"node-{mode}-{k}"
            s = stage_once(src, dst, World().with_nodes(nodes, k), mode, "size", jobs)
            expected = sum(m.shards[i].bytes for i in share[k])
            reads.append({"mode": mode, "nodes": nodes, "node": k, "bytes_read": s["bytes_read"],
                          "rchar": s["rchar"], "expected": expected,
                          "exact": s["bytes_read"] == expected})
            shutil.rmtree(dst)
    fanout = [fanout_once(src, scratch, nodes, jobs, samples, m.shards) for nodes in (2, 4)]
    reads += [r for f in fanout for r in f.pop("nodes")]
    return reads, fanout


def measure(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    src = repeated_shards(args.images, scratch, args.gb * 1e9, 8, BASE_SHARDS)  # 8: 4 nodes
    m = read_manifest(src, "train")
    total = m.total_bytes
    cold = drop_caches()
    rates: dict[str, list[float]] = {"cp": [], "cp_sync": [], "stage_sha256": [],
                                     "stage_size": []}
    single = World()
    for _ in range(args.repeat):
        for name in rates:
            dst = scratch / f"dst-{name}"
            shutil.rmtree(dst, ignore_errors=True)
            if name.startswith("cp"):
                dt, _ = timed(partial(cp_peer, src, dst, name == "cp_sync"), cold)
            else:
                verify = "sha256" if name == "stage_sha256" else "size"
                dt, summary = timed(partial(stage_once, src, dst, single, "replicate", verify,
                                            args.jobs), cold)
                if summary["bytes_read"] != total:
                    raise SystemExit(f"bench_stage: {name} read {summary['bytes_read']} bytes, "
                                     f"expected {total}")
            rates[name].append(total / dt / MB)
            shutil.rmtree(dst, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratios = {
        "size_only_over_cp": med["stage_size"] / med["cp_sync"],
        "sha256_over_cp": med["stage_sha256"] / med["cp_sync"],
    }
    reads, fanout = source_reads(src, scratch, args.jobs)
    p2p = gloo_p2p_mb_s()
    for f in fanout:  # each node's receiving rate against one Gloo stream's
        f["per_node_over_p2p"] = round(f["received_mb_s"] / f["nodes_count"] / p2p, 3)
    for mode, nodes in (("partition", 2), ("partition", 4), ("fanout", 2), ("fanout", 4)):
        got = sum(r["bytes_read"] for r in reads if (r["mode"], r["nodes"]) == (mode, nodes))
        if got != total:
            raise SystemExit(f"bench_stage: {mode} over {nodes} nodes read {got} bytes in all, "
                             f"expected exactly {total}")
    return {
        "benchmark": "stage",
        "source_bytes": total,
        "shards": len(m.shards),
        "cold_cache": cold,
        "jobs": args.jobs,
        "repeat": args.repeat,
        "rates_mb_s": {k: [round(x, 1) for x in v] for k, v in rates.items()},
        "median_mb_s": {k: round(v, 1) for k, v in med.items()},
        "ratios": {k: {"value": round(v, 3), "target": TARGETS[k],
                       "result": "PASS" if v >= TARGETS[k] else "SHORT"}
                   for k, v in ratios.items()},
        "source_reads": reads,
        "fanout": fanout,
        "gloo_p2p_mb_s": round(p2p, 1),
        "reads_exact": all(r["exact"] for r in reads),
        "all_pass": all(v >= TARGETS[k] for k, v in ratios.items())
        and all(r["exact"] for r in reads),
    }


def print_table(res: dict[str, Any]) -> None:
    cache = "dropped before each copy" if res["cold_cache"] else "WARM (cannot drop it here)"
    print(f"stage-to-node benchmark: {res['shards']} shards, {res['source_bytes'] / 1e9:.2f} GB "
          f"of real shards; page cache {cache}; --jobs {res['jobs']}; median of {res['repeat']}")
    labels = {"cp": "cp -r", "cp_sync": "cp -r + sync (the peer)",
              "stage_sha256": "stage-to-node, sha256 verified",
              "stage_size": "stage-to-node, size only"}
    for k, label in labels.items():
        runs = " ".join(f"{x:.0f}" for x in res["rates_mb_s"][k])
        print(f"  {label:34s} {res['median_mb_s'][k]:8.1f} MB/s   ({runs})")
    for k, v in res["ratios"].items():
        print(f"  {k:34s} {v['value']:8.3f}   target >= {v['target']}  {v['result']}")
    print("  bytes read from the source per node (summary / kernel rchar / the node's share"
          " / received from other nodes):")
    for r in res["source_reads"]:
        print(f"    {r['mode']:9s} {r['nodes']} nodes, node {r['node']}: {r['bytes_read']:>12d} "
              f"/ {r['rchar']:>12d} / {r['expected']:>12d} / {r.get('bytes_received', 0):>12d}"
              f"  {'exact' if r['exact'] else 'WRONG'}")
    print(f"  one Gloo stream between two processes (loopback): {res['gloo_p2p_mb_s']:.0f} MB/s")
    for f in res["fanout"]:
        print(f"  fan-out over {f['nodes_count']} processes on this machine: {f['seconds']:.1f} s, "
              f"nodes received {f['received_mb_s']:.0f} MB/s in all, per node "
              f"{f['per_node_over_p2p']:.2f} x one Gloo stream (loopback, shared cores)")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES,
                    help="folder of real <wnid>_<name>.JPEG files (default: %(default)s)")
    ap.add_argument("--gb", type=float, default=1.0, help="source size in GB (default 1)")
    ap.add_argument("--repeat", type=int, default=3, help="timed copies of each kind (median)")
    ap.add_argument("--jobs", type=int, default=2, help="stage-to-node --jobs (default 2)")
    ap.add_argument("--out", type=Path, default=None,
                    help="scratch folder (default: a temporary folder, removed afterwards)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main("bench_stage", args.images, args.out, partial(measure, args), print_table)


if __name__ == "__main__":
    sys.exit(main())
