"""The rehearsal's loader steps, each run in a child process of its own (so the sampler sees
its memory and descriptors alone):

    python -m harness.rehearsal.loaderstep plan  FOLDER [--nodes 16 --local 8 --batch 256 ...]
    python -m harness.rehearsal.loaderstep slice FOLDER --samples 100000 [--batch 256 --size 64]

``plan``: from the train manifest's shard counts alone, ``loaders.job_summary`` of the
job and every rank's ``plan_epoch`` of epoch 0 in ``pad`` mode (replicate, seed 0), timed;
checks that the ranks' plans together hold every sample exactly once. ``slice``: one rank on
this machine (``World()``, ``workers="auto"``) iterates a ``ShardLoader`` over the folder's
train split from a cold page cache (the folder's pages are dropped first, as on a node
whose set is larger than its memory, so that runs of every size measure the same thing)
in ``pad`` mode (train transform at ``--size``) for the first batches that hold
``--samples`` samples (the whole epoch when the set is that small), and checks that each batch
holds exactly the labels of the samples its plan names (padding ``PAD_LABEL``), no sample
twice, and, over a whole epoch, every sample once. Each prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from imgprep import World, read_manifest
from loaders import (
    PAD,
    PAD_LABEL,
    LoaderOptions,
    ShardLoader,
    TrainTransform,
    job_summary,
    plan_epoch,
    worker_count,
)
from loaders.shards import ShardSet, open_shards


def plan_job(folder: Path, nodes: int, local: int, batch: int, workers: int) -> dict[str, Any]:
    samples = [s.samples for s in read_manifest(folder, "train").shards]
    total, ranks = sum(samples), nodes * local
    t0 = time.perf_counter()
    summary = job_summary(samples, nodes, local, workers, batch, tail="pad")
    summary_s = time.perf_counter() - t0
    times, tables = [], []
    for r in range(ranks):
        world = World(rank=r, world_size=ranks, local_rank=r % local, local_world_size=local,
                      node_rank=r // local, num_nodes=nodes, launcher="explicit")
        t1 = time.perf_counter()
        plan = plan_epoch(samples, world, "replicate", 0, 0, batch, workers, "pad")
        times.append(time.perf_counter() - t1)
        tables.append(plan.table[plan.table != PAD])
    ids = np.sort(np.concatenate(tables))
    once = len(ids) == total and bool((ids == np.arange(total)).all())
    return {"what": "plan", "ranks": ranks, "nodes": nodes, "local": local, "batch": batch,
            "workers": workers, "samples": total, "shards": len(samples),
            "steps": summary.steps, "seen": summary.seen,
            "busy_workers": summary.busy_workers, "summary_s": summary_s,
            "plan_rank_s": statistics.median(times), "plan_rank_max_s": max(times),
            "plan_all_ranks_s": sum(times), "every_sample_once": once}


def labels_of(shards: ShardSet, ids: np.ndarray) -> np.ndarray:
    """The ``.cls`` label of each sample id (``PAD_LABEL`` for padding), read by offset."""
    where = shards.where
    out = np.full(len(ids), PAD_LABEL, np.int64)
    real = np.flatnonzero(ids != PAD)
    shard = where.shard_of(ids[real])
    off, size = where.cls
    for k in np.unique(shard).tolist():
        fd = os.open(where.folder / where.names[k], os.O_RDONLY)
        try:
            for pos in real[shard == k].tolist():
                i = int(ids[pos])
                out[pos] = int(os.pread(fd, int(size[i]), int(off[i])))
        finally:
            os.close(fd)
    return out


def evict(folder: Path) -> int:
    """Drop the cached pages of every file in ``folder`` (``POSIX_FADV_DONTNEED``: no root
    needed; the files are fsynced first, since dirty pages cannot be dropped). Its bytes."""
    total = 0
    for path in sorted(folder.iterdir()):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return total


def slice_epoch(folder: Path, want: int, batch: int, size: int) -> dict[str, Any]:
    evicted = evict(folder)
    world = World()
    workers = worker_count("auto", world)
    t0 = time.perf_counter()
    loader = ShardLoader(folder, "train", world, LoaderOptions(
        batch_size=batch, workers=workers, seed=0, tail="pad",
        transform=TrainTransform(size=size)))
    plan = loader.plan(0)
    batches = min(plan.batches, math.ceil(want / batch))
    got, first, shape = [], 0.0, None
    for b, (images, labels) in enumerate(loader):
        if b == 0:
            first, shape = time.perf_counter() - t0, tuple(images.shape)
        got.append(labels.numpy().astype(np.int64))
        if b + 1 == batches:
            break
    seconds = time.perf_counter() - t0
    del loader  # its workers exit before the checks read the shards
    table = plan.table[:batches]
    ids = table[table != PAD]
    shards = open_shards(folder, "train")
    want_labels = labels_of(shards, table.reshape(-1))
    whole, total = batches == plan.batches, sum(shards.samples)
    return {"what": "slice", "workers": workers, "batch": batch, "batches": batches,
            "evicted_bytes": evicted,
            "epoch_batches": plan.batches, "samples": int(len(ids)),
            "padding": int((table == PAD).sum()), "whole_epoch": whole, "seconds": seconds,
            "first_batch_s": first, "shape": shape,
            "labels_match_plan": len(got) == batches and bool(
                (np.concatenate(got) == want_labels).all()),
            "no_sample_twice": len(np.unique(ids)) == len(ids),
            "every_sample_once": whole and len(ids) == total and bool(
                (np.sort(ids) == np.arange(total)).all())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["plan", "slice"])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--local", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=64)
    a = ap.parse_args()
    if a.what == "plan":
        out = plan_job(a.folder, a.nodes, a.local, a.batch, a.workers)
    else:
        out = slice_epoch(a.folder, a.samples, a.batch, a.size)
    print(json.dumps(out, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
