"""Programs the cluster benchmark runs inside a node (or, for the peer, outside any).

    python probe.py loader --data DIR --rank K --world N
        builds ``loaders.make_loader(DIR, "train", World(rank K of N, one per node), ...)``
        and prints ``ready``; then, for each ``go`` line on stdin, reads one whole epoch (the
        next) and prints one JSON line: images, seconds, images_per_s. Whole epochs, since
        the train loader's shuffle buffer (1000 samples) reads ahead of what it yields: over
        a shorter window, images yielded are not images read. Any other line, or the end of
        stdin, ends it.
    python probe.py p2p --addr A --port P --rank R --mb M --reps K
        Gloo send (rank 0) / recv (rank 1) of an M MB tensor, K times; rank 1 prints the median
        rate in MB/s as JSON.

Started by ``harness.cluster.bench`` with a timeout; each probe also dies with its parent.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import timedelta


def loader_rates(args: argparse.Namespace) -> None:
    from imgprep import World
    from loaders import LoaderOptions, make_loader

    world = World(rank=args.rank, world_size=args.world, node_rank=args.rank,
                  num_nodes=args.world)
    loader = make_loader(args.data, "train", world, LoaderOptions(
        batch_size=args.batch_size, workers=args.workers, seed=args.seed))
    print("ready", flush=True)
    for epoch in itertools.count():
        if sys.stdin.readline().strip() != "go":
            return
        loader.set_epoch(epoch)
        images, t0 = 0, time.perf_counter()
        for _, labels in loader:
            images += len(labels)
        elapsed = time.perf_counter() - t0
        print(json.dumps({"epoch": epoch, "images": images, "seconds": round(elapsed, 3),
                          "images_per_s": round(images / elapsed, 1)}), flush=True)


def p2p_rate(args: argparse.Namespace) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://{args.addr}:{args.port}",
                            rank=args.rank, world_size=2, timeout=timedelta(seconds=60))
    t = torch.zeros(args.mb * 1_000_000, dtype=torch.uint8)
    rates = []
    for _ in range(args.reps + 1):  # the first round warms the connection up
        dist.barrier()
        t0 = time.perf_counter()
        if args.rank == 0:
            dist.send(t, 1)
        else:
            dist.recv(t, 0)
        rates.append(t.numel() / (time.perf_counter() - t0) / 1e6)
    dist.barrier()
    dist.destroy_process_group()
    return {"mb_per_s": round(statistics.median(rates[1:]), 1), "mb": args.mb,
            "reps": args.reps}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="probe", required=True)
    lo = sub.add_parser("loader")
    lo.add_argument("--data", required=True)
    lo.add_argument("--rank", type=int, default=0)
    lo.add_argument("--world", type=int, default=1)
    lo.add_argument("--batch-size", type=int, default=32)
    lo.add_argument("--workers", type=int, default=1)
    lo.add_argument("--seed", type=int, default=0)
    pp = sub.add_parser("p2p")
    pp.add_argument("--addr", required=True)
    pp.add_argument("--port", type=int, required=True)
    pp.add_argument("--rank", type=int, choices=[0, 1], required=True)
    pp.add_argument("--mb", type=int, default=32)
    pp.add_argument("--reps", type=int, default=5)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.probe == "loader":
        loader_rates(args)
    elif (res := p2p_rate(args)) and args.rank == 1:
        print(json.dumps(res), flush=True)
    os._exit(0)  # loader workers and process groups need no orderly goodbye here


if __name__ == "__main__":
    sys.exit(main())
