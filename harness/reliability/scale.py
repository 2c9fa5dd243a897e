"""Scale runs: do convert, stage-to-node and the loaders keep their promises at size?

Three functions, each given a scratch folder and sizes, each returning ``(figures, trials)``
(``Trial.group`` "scale"; ``Figure.group`` "convert", "stage-to-node" or "loaders"):

- ``convert_scale``: memory, throughput and listing cost of ``imgprep convert`` against the
  number of images (should be flat, flat and linear);
- ``stage_scale``: many ``imgprep stage-to-node`` processes at once on simulated nodes (one
  copier per node, every node complete, the source read exactly once per node share);
- ``loader_scale``: several ranks of ``ShardLoader`` over thousands of shards for several
  epochs (start-up time, equal batch counts, worker memory that does not grow), and the
  sample-granular plans of ILSVRC2012-sized jobs up to 256 x 8 ranks computed from counts
  (set seen per epoch, every worker busy, no refusal).

The data are synthetic (small JPEGs in the real nested-tar layout) and made in the scratch
folder; nothing is read from ``../shared``. Every command runs as a subprocess with the
launcher variables of the calling environment removed (``harness.checks.clean_env``, which
the tests use too), so a run inside a job is not mistaken for a rank of it; from the
repository root, so that this checkout's packages are the ones imported.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import REPO, TreePeaks, descendants, machine_busy_s, proc_kb
from harness.checks import clean_env, tmp_leftovers
from harness.reliability import Figure, Trial
from imgprep import (
    ConvertOptions,
    ImgprepError,
    TransformOptions,
    World,
    convert_splits,
    imagenet_classes,
    manifest_path,
    node_shards,
    read_manifest,
    verify,
)
from imgprep.inputs.fakeset import jpeg_pool, pick_classes
from imgprep.inputs.sources import list_source
from imgprep.shards.writers import BLOCK, RECORD, header_bytes

GROUP = "scale"
MB = 1e6
KB = 1024
SAMPLE_EVERY_S = 0.05
POOL_SIDES = (64, 96)  # the synthetic JPEGs' sides, px
RUN_TIMEOUT_S = 1800.0

# Bounds (see each function's docstring).
RSS_FACTOR, RSS_SLACK_MB = 1.25, 30.0
# The columnar listing: ~75 B per image at rest, but mapped by the parent and by each forked
# worker (RSS counts it in every one), and ~415 B per image while it is built (measured).
RSS_PER_IMAGE_B = 400
THROUGHPUT_MIN_RATIO = 0.90
LISTING_MAX_RATIO = 1.5
WORKER_GROWTH_MB = 10.0
QUIET_CORES = 0.2  # a run is undisturbed when other processes used fewer cores than this


# ---------------------------------------------------------------------------- synthetic data


def _member(name: str, data: bytes) -> bytes:
    """One tar member: header, data, zero padding to the block."""
    return header_bytes(name, len(data)) + data + bytes(-len(data) % BLOCK)


def write_train_tar(path: Path, images: int, pool: Sequence[bytes], classes: int = 1000) -> Path:
    """``ILSVRC2012_img_train.tar`` in the real layout: an outer tar of per-class
    ``<wnid>.tar`` holding ``<wnid>_<j>.JPEG``, ``images`` in all over ``classes`` real wnids.

    Streamed one class at a time (memory holds one inner tar), headers built by
    ``imgprep.shards.writers.header_bytes``: 200,000 members take a few seconds.
    """
    wnids = pick_classes(imagenet_classes(), max(1, min(classes, images)))
    base, extra = divmod(images, len(wnids))
    path.parent.mkdir(parents=True, exist_ok=True)
    done = 0
    with open(path, "wb") as f:
        for k, wnid in enumerate(wnids):
            count = base + (k < extra)
            inner = b"".join(_member(f"{wnid}_{j + 1}.JPEG", pool[(done + j) % len(pool)])
                             for j in range(count)) + bytes(2 * BLOCK)
            f.write(_member(f"{wnid}.tar", inner))
            done += count
        end = f.tell() + 2 * BLOCK
        f.write(bytes(2 * BLOCK + (-end % RECORD)))
    return path


def make_shards(work: Path, shards: int, per_shard: int, size: int) -> Path:
    """A converted shard set of ``shards`` x ``per_shard`` synthetic images at ``size`` px
    (in-process convert, 2 workers); returns its folder (the source tar is removed)."""
    tar = write_train_tar(work / "raw" / "ILSVRC2012_img_train.tar", shards * per_shard,
                          jpeg_pool(64, POOL_SIDES))
    out = work / "shards"
    summary = convert_splits(ConvertOptions(input=tar, out=out, num_shards=shards, workers=2,
                                            transform=TransformOptions(size=size)))[0]
    shutil.rmtree(tar.parent)
    if not summary.complete or summary.samples != shards * per_shard:
        raise RuntimeError(f"making {shards} shards in {out} failed: {summary}")
    return out


# ---------------------------------------------------------------------------- processes


def imgprep_cmd(*args: object) -> list[str]:
    return [sys.executable, "-m", "imgprep", *(str(a) for a in args)]


def start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO)


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects among ``text``'s lines (other lines are ignored)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def finish(procs: Sequence[subprocess.Popen[str]], timeout: float = RUN_TIMEOUT_S
           ) -> list[tuple[int, list[dict[str, Any]], str]]:
    """Wait for every process: (exit code, JSON lines of its stdout, the tail of stderr)."""
    deadline = time.monotonic() + timeout
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
            stderr += f"\nkilled after {timeout:.0f} s"
        out.append((p.returncode, json_lines(stdout), stderr.strip()[-400:]))
    return out


def children_cpu_s() -> float:
    """CPU seconds of this process's reaped children (with the children they reaped)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def best_of(fn: Callable[[], object], repeats: int = 3, budget_s: float = 3.0) -> float:
    """The shortest of up to ``repeats`` timed calls of ``fn`` (seconds); no new call once
    ``budget_s`` is spent (a long call is steady enough to be timed once)."""
    times: list[float] = []
    while len(times) < repeats and sum(times) < budget_s:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _ok_all(group: str, kind: str, failures: Iterable[str], passed: str) -> Trial:
    """One Trial: ok when ``failures`` is empty, else the first few of them as detail."""
    bad = list(failures)
    return Trial(GROUP, f"{group}: {kind}", not bad, "; ".join(bad[:4]) if bad else passed)


# ---------------------------------------------------------------------------- convert


def _convert_run(tar: Path, out: Path, images: int, workers: int, size: int
                 ) -> tuple[dict[str, Any], list[Trial]]:
    """One ``imgprep convert`` subprocess under the memory sampler, then its verification."""
    cmd = imgprep_cmd("convert", tar, "-o", out, "--workers", workers, "--size", size,
                      "--json", "-q")
    busy, cpu, t0 = machine_busy_s(), children_cpu_s(), time.perf_counter()
    proc = start(cmd, clean_env())
    with TreePeaks([proc.pid], SAMPLE_EVERY_S, pss=True) as peak:
        (rc, lines, err), = finish([proc])
    wall = time.perf_counter() - t0
    tree_cpu = children_cpu_s() - cpu
    foreign = max(0.0, machine_busy_s() - busy - tree_cpu) / wall
    summary = lines[-1] if lines else {}
    where = f"convert {images:,} images"
    if rc != 0 or summary.get("samples") != images:
        return {}, [Trial(GROUP, f"{where}: output verified", False,
                          f"exit {rc}, {summary.get('samples')} samples: {err}")]
    check = subprocess.run(imgprep_cmd("verify", out, "-q"), env=clean_env(), cwd=REPO,
                           capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    total = read_manifest(out, "train").total_samples
    ok = check.returncode == 0 and total == images
    detail = (f"imgprep verify exit {check.returncode}, manifest {total:,} samples"
              + ("" if ok else f": {check.stderr.strip()[-300:]}"))
    mpath = manifest_path(out, "train")
    run = {"images": images, "wall_s": wall, "rss_mb": peak.rss_kb * KB / MB,
           "pss_mb": peak.pss_kb * KB / MB, "rate": float(summary["images_per_s"]),
           "cpu_rate": images / tree_cpu, "foreign_cores": foreign,
           "manifest_bytes": mpath.stat().st_size,
           "manifest_read_s": best_of(partial(read_manifest, mpath))}
    return run, [Trial(GROUP, f"{where}: output verified", ok, detail)]


def _convert_figures(runs: list[dict[str, Any]], workers: int) -> list[Figure]:
    """Per-size figures, then the ratios to the smallest size with their bounds."""
    figs: list[Figure] = []
    for r in runs:
        n = f"{r['images']:,} images"
        figs += [
            Figure("convert", f"peak RSS, process tree, {n}", round(r["rss_mb"], 1), "MB"),
            Figure("convert", f"peak PSS, process tree, {n}", round(r["pss_mb"], 1), "MB"),
            Figure("convert", f"throughput, {workers} workers, {n}", round(r["rate"], 1),
                   "img/s"),
            Figure("convert", f"throughput per CPU second of the tree, {n}",
                   round(r["cpu_rate"], 1), "img/CPU-s"),
            Figure("convert", f"cores other processes used meanwhile, {n}",
                   round(r["foreign_cores"], 2), "cores"),
            Figure("convert", f"wall time, {n}", round(r["wall_s"], 2), "s"),
            Figure("convert", f"listing cost, {workers} workers, {n}", round(r["listing_us"], 2),
                   "µs/img"),
            Figure("convert", f"listing cost, 1 worker, {n}", round(r["listing_us_1w"], 2),
                   "µs/img"),
            Figure("convert", f"manifest size per sample, {n}",
                   round(r["manifest_bytes"] / r["images"], 2), "B/sample"),
            Figure("convert", f"manifest read, {n}", round(r["manifest_read_s"] * 1e3, 2),
                   "ms"),
        ]
    first, last = runs[0], runs[-1]
    slope = (last["rss_mb"] - first["rss_mb"]) * MB / (last["images"] - first["images"])
    figs.append(Figure("convert", f"peak RSS growth per image, {first['images']:,} -> "
                       f"{last['images']:,}", round(slope, 1), "B/img"))
    key, measure = judged_rate(runs)
    for r in runs[1:]:
        ratio = r[key] / first[key]
        figs.append(Figure("convert", f"throughput {r['images']:,} / {first['images']:,} "
                           f"images ({measure})", round(ratio, 3), "ratio",
                           f">= {THROUGHPUT_MIN_RATIO}", ratio >= THROUGHPUT_MIN_RATIO))
    ratio = last["listing_us"] / first["listing_us"]
    figs.append(Figure("convert", f"listing cost per image {last['images']:,} / "
                       f"{first['images']:,}", round(ratio, 3), "ratio",
                       f"<= {LISTING_MAX_RATIO}", ratio <= LISTING_MAX_RATIO))
    return figs


def judged_rate(runs: list[dict[str, Any]]) -> tuple[str, str]:
    """Which throughput the 10 % bound judges: images per wall second when no run was
    disturbed, else images per CPU second of the convert's process tree (which other
    processes on the machine do not change). Returns (run key, what it is)."""
    if all(r["foreign_cores"] < QUIET_CORES for r in runs):
        return "rate", "img/s"
    return "cpu_rate", "img per CPU-s: other processes were busy"


def rss_limit(smallest: dict[str, Any], images: int) -> float:
    """The peak RSS (MB) a run of ``images`` may reach given the smallest size's run: x 1.25
    + 30 MB, plus ``RSS_PER_IMAGE_B`` per extra image for the listing (flat otherwise)."""
    extra = (images - smallest["images"]) * RSS_PER_IMAGE_B / MB
    return float(smallest["rss_mb"] * RSS_FACTOR + RSS_SLACK_MB + extra)


def _convert_trials(runs: list[dict[str, Any]]) -> list[Trial]:
    first, last = runs[0], runs[-1]
    limits = [rss_limit(first, r["images"]) for r in runs]
    rss_ok = all(r["rss_mb"] <= lim for r, lim in zip(runs, limits, strict=True))
    key, measure = judged_rate(runs)
    rates = _rate_ratios(runs)
    listing = last["listing_us"] / first["listing_us"]
    sizes = " / ".join(f"{r['images']:,}" for r in runs)
    rss = " / ".join(f"{r['rss_mb']:.0f}" for r in runs)
    rate = " / ".join(f"{r[key]:.0f}" for r in runs)
    cost = " / ".join(f"{r['listing_us']:.1f}" for r in runs)
    return [
        Trial(GROUP, "convert: peak RSS flat", rss_ok,
              f"peak RSS of the process tree {rss} MB for {sizes} images; bound: every "
              f"size <= smallest x {RSS_FACTOR} + {RSS_SLACK_MB:.0f} MB + {RSS_PER_IMAGE_B} B "
              f"per image beyond the smallest's (the listing) = "
              f"{' / '.join(f'{x:.0f}' for x in limits)} MB"),
        Trial(GROUP, "convert: throughput within 10 %", min(rates) >= THROUGHPUT_MIN_RATIO,
              f"{rate} ({measure}) for {sizes} images; bound: every size >= "
              f"{THROUGHPUT_MIN_RATIO} x the smallest's (lowest ratio {min(rates):.3f})"),
        Trial(GROUP, "convert: listing linear", listing <= LISTING_MAX_RATIO,
              f"{cost} µs per image for {sizes} images; bound: largest / smallest "
              f"per-image cost <= {LISTING_MAX_RATIO} (got {listing:.3f})"),
    ]


def convert_scale(work: Path, sizes: Sequence[int] = (10_000, 50_000, 200_000),
                  workers: int = 2, size: int = 64, classes: int = 1000
                  ) -> tuple[list[Figure], list[Trial]]:
    """``imgprep convert`` of synthetic train tars of ``sizes`` images (real nested layout,
    ``classes`` real wnids, 64-96 px JPEGs converted to ``size`` px shards), one subprocess
    ``python -m imgprep convert SRC -o OUT --workers N --size S --json -q`` per size.

    Measures, per size: the peak RSS (and PSS) summed over the command's whole process tree,
    sampled every 50 ms; wall time and images/s (convert's own summary); the listing cost
    per image (convert does not report it: ``imgprep.inputs.sources.list_source`` of the same tar
    in this process with the run's worker count and with 1, best of up to 3 calls within
    3 s each); the manifest's bytes per sample and
    its read time.

    Trials and bounds: peak RSS flat (every size <= the smallest's x 1.25 + 30 MB + 400 B
    per image beyond the smallest's: the columnar listing is ~75 B per image at rest but
    mapped by the parent and by each forked worker, whose RSS each count it, and ~415 B per
    image while it is built; anything held per converted image would break it); throughput
    within 10 % (every size >= 0.90 x the smallest's images/s; when other processes used
    0.2 cores or more during a run, images per CPU second of the tree instead; when a size
    falls short, every size is converted once more and each size's faster run judged); listing
    linear (largest / smallest per-image listing cost <= 1.5); each output verified
    (``imgprep verify OUT -q`` exits 0 and the manifest holds exactly the size's samples).
    Source tar and output are removed after each size.
    """
    pool = jpeg_pool(256, POOL_SIDES)
    runs, trials = _convert_sizes(work, sorted(sizes), pool, workers, size, classes)
    if len(runs) == len(sizes) >= 2 and not _rates_within_bound(runs):
        # A run of a few seconds can lose a stretch of it to the machine (writeback, another
        # process starting): every size is converted once more and its faster run judged.
        again, more = _convert_sizes(work, sorted(sizes), pool, workers, size, classes)
        trials += more
        if len(again) == len(runs):
            runs = [_faster(a, b) for a, b in zip(runs, again, strict=True)]
    if len(runs) < 2:
        return [], trials + [Trial(GROUP, "convert: scale runs", False,
                                   f"only {len(runs)} of {len(sizes)} sizes converted")]
    return _convert_figures(runs, workers), _convert_trials(runs) + trials


def _convert_sizes(work: Path, sizes: Sequence[int], pool: list[bytes], workers: int,
                   size: int, classes: int) -> tuple[list[dict[str, Any]], list[Trial]]:
    """One measured conversion of a synthetic tar per size (``convert_scale``)."""
    runs: list[dict[str, Any]] = []
    trials: list[Trial] = []
    for n in sizes:
        tar = write_train_tar(work / f"src-{n}" / "ILSVRC2012_img_train.tar", n, pool, classes)
        run, checks = _convert_run(tar, work / f"out-{n}", n, workers, size)
        trials += checks
        if run:
            run["listing_us"] = best_of(partial(list_source, tar, workers=workers)) / n * 1e6
            run["listing_us_1w"] = best_of(partial(list_source, tar, workers=1)) / n * 1e6
            runs.append(run)
        shutil.rmtree(tar.parent)
        shutil.rmtree(work / f"out-{n}", ignore_errors=True)
    return runs, trials


def _rates_within_bound(runs: list[dict[str, Any]]) -> bool:
    return min(_rate_ratios(runs)) >= THROUGHPUT_MIN_RATIO


def _rate_ratios(runs: list[dict[str, Any]]) -> list[float]:
    """Each larger size's judged throughput over the smallest's."""
    key, _ = judged_rate(runs)
    return [r[key] / runs[0][key] for r in runs[1:]]


def _faster(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Of two runs of one size, the faster's figures, with the higher peak memory of the
    two (the memory bound judges the worse)."""
    fast = a if a["wall_s"] <= b["wall_s"] else b
    return {**fast, "rss_mb": max(a["rss_mb"], b["rss_mb"]),
            "pss_mb": max(a["pss_mb"], b["pss_mb"])}


# ---------------------------------------------------------------------------- stage-to-node


def _stage_launch(src: Path, work: Path, mode: str, nodes: int, local_ranks: int
                  ) -> tuple[list[tuple[int, Path]], list[subprocess.Popen[str]]]:
    """Start nodes x local_ranks stage-to-node processes; returns ((node, dst) per process,
    the processes).

    partition: torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    GROUP_RANK) and ``--dst <work>/partition-node{node}``: local rank 0 copies, the others
    wait for its done-marker. replicate: no launcher variables, one ``--dst`` per node: the
    node's processes race for the lock in it, the first copies, the others find it staged.
    """
    ranks = nodes * local_ranks
    where: list[tuple[int, Path]] = []
    procs = []
    for rank in range(ranks):
        node = rank // local_ranks
        dst = work / f"{mode}-node{node}"
        if mode == "partition":
            env = clean_env(RANK=rank, WORLD_SIZE=ranks, LOCAL_RANK=rank % local_ranks,
                            LOCAL_WORLD_SIZE=local_ranks, GROUP_RANK=node)
            arg = str(work / f"{mode}-node{{node}}")
        else:
            env, arg = clean_env(), str(dst)
        where.append((node, dst))
        procs.append(start(imgprep_cmd("stage-to-node", "--src", src, "--dst", arg, "--mode",
                                       mode, "--timeout", 600, "--json", "-q"), env))
    return where, procs


def _node_problem(dst: Path, want: list[str]) -> str | None:
    """Why the node folder ``dst`` is not exactly the staged shards ``want`` (None: it is)."""
    try:
        rep = verify(dst)
        staged = sorted(s.name for s in read_manifest(dst, "train").shards)
    except ImgprepError as e:
        return str(e)
    if not rep.ok:
        return "; ".join(rep.problems[:2])
    return None if staged == want else f"holds {staged}, its share is {want}"


def _stage_trials(src: Path, mode: str, nodes: int, local_ranks: int,
                  where: list[tuple[int, Path]],
                  results: list[tuple[int, list[dict[str, Any]], str]]) -> list[Trial]:
    m = read_manifest(src, "train")
    share = node_shards([s.samples for s in m.shards], nodes, mode, 0)
    dsts = [dst for _, dst in sorted(dict(where).items())]  # index = node
    summaries = [lines[-1] if lines else {} for _, lines, _ in results]
    name = f"stage {mode} {nodes}x{local_ranks}"
    crashed = [f"process {i} (node {where[i][0]}) exit {rc}: {err}"
               for i, (rc, lines, err) in enumerate(results) if rc != 0 or not lines]
    roles: dict[int, list[str]] = {}
    for (node, _), s in zip(where, summaries, strict=True):
        roles.setdefault(node, []).append(str(s.get("role")))
    bad_roles = [f"node {k}: {sorted(r)}" for k, r in roles.items()
                 if r.count("copier") != 1 or r.count("waiter") != local_ranks - 1]
    incomplete = [f"{dst.name}: {why}" for k, dst in enumerate(dsts)
                  if (why := _node_problem(dst, sorted(m.shards[i].name for i in share[k])))]
    index = m.index.bytes if m.index is not None else 0  # every node's copier reads it too
    expected = sum(m.shards[i].bytes for part in share for i in part) + nodes * index
    read = sum(int(s.get("bytes_read", 0)) for s in summaries)
    leftovers = [f"{d.name}/{p}" for d in dsts for p in tmp_leftovers(d)]
    return [
        _ok_all(name, "every process exits 0", crashed, f"{len(results)} processes"),
        _ok_all(name, "exactly one copier per node", bad_roles,
                f"{nodes} nodes: 1 copier + {local_ranks - 1} waiters each"),
        _ok_all(name, "every node complete", incomplete,
                f"imgprep.shards.verify ok on {nodes} nodes, each manifest lists exactly its "
                "share (imgprep.job.assign.node_shards)"),
        Trial(GROUP, f"{name}: source bytes read == node shares", read == expected,
              f"{read:,} bytes read by all processes, node shares and indexes {expected:,}"),
        _ok_all(name, "no temp files left", leftovers, "no .tmp-* under any node folder"),
    ]


def stage_scale(work: Path, nodes: int = 8, local_ranks: int = 4, shards: int = 64,
                per_shard: int = 32, size: int = 128) -> tuple[list[Figure], list[Trial]]:
    """``nodes`` x ``local_ranks`` ``imgprep stage-to-node --json -q`` processes at once on
    this machine, one per simulated (node, local rank), over a converted set of ``shards``
    synthetic shards (``per_shard`` images of ``size`` px each), each node with its own
    destination folder, in two rounds:

    - partition, under torchrun's variables (``--dst .../partition-node{node}``): local rank
      0 takes the lock and copies, the other local ranks wait for its done-marker;
    - replicate, with no launcher variables and one ``--dst`` per node: each node's
      processes race for the lock in it; the first copies, the rest find the node staged.

    Trials per round: every process exits 0; exactly one copier per node (the summaries'
    ``role``: 1 copier + local_ranks - 1 waiters); every node complete (``imgprep.shards.verify`` ok
    with decoding, and its manifest lists exactly its share from ``imgprep.job.assign``); the
    source bytes read by all processes (``bytes_read``) equal exactly the sum of the node
    shares' sizes plus one sample index per node; no ``.tmp-*`` file left. Figures: wall
    time, bytes read, MB/s per round.
    """
    src = make_shards(work / "stage-src", shards, per_shard, size)
    figs: list[Figure] = []
    trials: list[Trial] = []
    for mode in ("partition", "replicate"):
        t0 = time.perf_counter()
        where, procs = _stage_launch(src, work, mode, nodes, local_ranks)
        results = finish(procs, 900)
        wall = time.perf_counter() - t0
        trials += _stage_trials(src, mode, nodes, local_ranks, where, results)
        copiers = [lines[-1] for _, lines, _ in results
                   if lines and lines[-1].get("role") == "copier"]
        read = sum(int(s["bytes_read"]) for s in copiers)
        label = f"{mode}, {nodes} nodes x {local_ranks} ranks"
        figs += [Figure("stage-to-node", f"wall time (start of all to end of all), {label}",
                        round(wall, 2), "s"),
                 Figure("stage-to-node", f"slowest copier's own time, {label}",
                        round(max((float(s["seconds"]) for s in copiers), default=0.0), 2), "s"),
                 Figure("stage-to-node", f"bytes read from the source, {label}",
                        round(read / MB, 2), "MB"),
                 Figure("stage-to-node", f"throughput (bytes read / wall time), {label}",
                        round(read / MB / wall, 1), "MB/s")]
    return figs, trials


# ---------------------------------------------------------------------------- loaders

RANK_MAIN = ("import json, sys; from harness.reliability.scale import loader_rank; "
             "loader_rank(**json.loads(sys.argv[1]))")


def _memory(pid: int) -> dict[str, int]:
    return {"pid": pid, "rss_kb": proc_kb(pid, "VmRSS:"),
            "pss_kb": proc_kb(pid, "Pss:", "smaps_rollup")}


def loader_rank(folder: str, rank: int, ranks: int, workers: int, epochs: int,
                batch_size: int, size: int) -> None:
    """One rank of ``loader_scale`` (run in its own process): a ShardLoader for an explicit
    ``World(rank, ranks)`` on one node, ``epochs`` epochs; prints one JSON line per epoch with
    the planned and yielded batches, start-up time, and the memory of itself and its workers."""
    from loaders import LoaderOptions, ShardLoader, TrainTransform  # torch: only in ranks

    t0 = time.perf_counter()
    loader = ShardLoader(Path(folder), "train", World(rank=rank, world_size=ranks,
                                                      local_rank=rank, local_world_size=ranks),
                         LoaderOptions(batch_size=batch_size, workers=workers,
                                       transform=TrainTransform(size=size)))
    built = time.perf_counter() - t0
    first = 0.0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        planned, batches = len(loader), 0
        t1 = time.perf_counter()
        for _ in loader:
            if not first:
                first = time.perf_counter() - t0
            batches += 1
        print(json.dumps({"rank": rank, "epoch": epoch, "planned": planned, "batches": batches,
                          "constructor_s": built, "startup_s": first,
                          "epoch_s": time.perf_counter() - t1,
                          "self": _memory(os.getpid()),
                          "workers": [_memory(p) for p in sorted(descendants())]}), flush=True)


def _mb(kb: int) -> float:
    return kb * KB / MB


def _loader_figures(reports: list[dict[str, Any]], epochs: int) -> list[Figure]:
    by_epoch = {e: [r for r in reports if r["epoch"] == e] for e in (0, epochs - 1)}
    figs = [Figure("loaders", "start-up (constructor + first batch), slowest rank",
                   round(max(r["startup_s"] for r in by_epoch[0]), 3), "s"),
            Figure("loaders", "constructor, slowest rank",
                   round(max(r["constructor_s"] for r in by_epoch[0]), 3), "s"),
            Figure("loaders", "batches per epoch per rank", by_epoch[0][0]["planned"],
                   "batches"),
            Figure("loaders", f"epoch {epochs} time, slowest rank",
                   round(max(r["epoch_s"] for r in by_epoch[epochs - 1]), 3), "s")]
    for e, rows in by_epoch.items():
        pss = [_mb(w["pss_kb"]) for r in rows for w in r["workers"]]
        rss = [_mb(w["rss_kb"]) for r in rows for w in r["workers"]]
        figs += [Figure("loaders", f"worker PSS after epoch {e + 1}, mean",
                        round(float(np.mean(pss)), 1), "MB"),
                 Figure("loaders", f"worker PSS after epoch {e + 1}, max", round(max(pss), 1),
                        "MB"),
                 Figure("loaders", f"worker RSS after epoch {e + 1}, mean",
                        round(float(np.mean(rss)), 1), "MB"),
                 Figure("loaders", f"rank process PSS after epoch {e + 1}, mean",
                        round(float(np.mean([_mb(r["self"]["pss_kb"]) for r in rows])), 1),
                        "MB")]
    growth = max(_worker_growth_mb(reports, epochs).values())
    figs.append(Figure("loaders", f"worker PSS growth, epoch 1 -> {epochs}, max",
                       round(growth, 2), "MB", f"<= {WORKER_GROWTH_MB:.0f}",
                       growth <= WORKER_GROWTH_MB))
    return figs


def _worker_growth_mb(reports: list[dict[str, Any]], epochs: int) -> dict[tuple[int, int], float]:
    """(rank, worker pid) -> PSS growth (MB) from the first epoch to the last; a worker that
    is not there in both (persistent workers must live across epochs) counts as infinite."""
    growth: dict[tuple[int, int], float] = {}
    for rank in sorted({r["rank"] for r in reports}):
        rows = {r["epoch"]: r for r in reports if r["rank"] == rank}
        first = {w["pid"]: w["pss_kb"] for w in rows[0]["workers"]}
        last = {w["pid"]: w["pss_kb"] for w in rows[epochs - 1]["workers"]}
        for pid in first.keys() | last.keys():
            both = pid in first and pid in last
            growth[rank, pid] = _mb(last[pid] - first[pid]) if both else float("inf")
    return growth


def _growth(reports: list[dict[str, Any]], epochs: int) -> list[str]:
    """The workers whose PSS grew by more than the bound, or that were replaced."""
    return [f"rank {rank} worker pid {pid}: " + (f"PSS +{mb:.1f} MB" if mb < float("inf")
                                                 else "not alive in both epochs")
            for (rank, pid), mb in sorted(_worker_growth_mb(reports, epochs).items())
            if mb > WORKER_GROWTH_MB]


def _loader_trials(reports: list[dict[str, Any]], ranks: int, epochs: int,
                   results: list[tuple[int, list[dict[str, Any]], str]]) -> list[Trial]:
    crashed = [f"rank {i} exit {rc}: {err}" for i, (rc, lines, err) in enumerate(results)
               if rc != 0 or len(lines) != epochs]
    counts = {e: sorted({r["batches"] for r in reports if r["epoch"] == e})
              for e in range(epochs)}
    short = [f"rank {r['rank']} epoch {r['epoch']}: {r['batches']} of {r['planned']}"
             for r in reports if r["batches"] != r["planned"]]
    name = f"loaders {ranks} ranks"
    growth = _growth(reports, epochs) if not crashed else ["not measured: a rank failed"]
    return [
        _ok_all(name, "every rank exits 0 after all epochs", crashed,
                f"{ranks} ranks x {epochs} epochs"),
        _ok_all(name, "equal batch counts across ranks",
                [f"epoch {e}: {c}" for e, c in counts.items() if len(c) != 1],
                f"{counts[0]} batches in every epoch on every rank"),
        _ok_all(name, "every epoch gives the planned batches", short,
                "len(loader) stated before each epoch == batches yielded"),
        _ok_all(name, f"no growth over {epochs} epochs", growth,
                f"every worker's PSS after epoch {epochs} <= after epoch 1 + "
                f"{WORKER_GROWTH_MB:.0f} MB (same persistent worker pids)"),
    ]


ILSVRC_SHARDS = [1250] * 1024 + [1167]  # the default conversion of ILSVRC2012 train
BIG_JOBS = ((16, 8, 8, 256), (128, 8, 8, 32), (256, 8, 8, 32))  # nodes, local, workers, batch


def _big_plans() -> Trial:
    """Plans of ILSVRC2012-sized jobs from counts alone: >= 99.9 % of the set per epoch in
    short mode, every worker busy and within one batch of its siblings, no refusal."""
    from loaders import job_summary

    bad, seen = [], []
    for job in BIG_JOBS:
        try:
            s = job_summary(ILSVRC_SHARDS, *job, tail="short")
        except ImgprepError as e:
            bad.append(f"{job}: refused: {e}")
            continue
        seen.append(f"{job[0]}x{job[1]}: {100 * s.seen:.3f} %")
        if s.seen < 0.999 or s.busy_workers < job[2] or s.worker_spread > job[3]:
            bad.append(f"{job}: {s}")
    return _ok_all("loader plans", "ILSVRC2012 jobs up to 256 x 8 ranks", bad,
                   "seen " + ", ".join(seen) + "; all 8 workers busy; none refused")


def loader_scale(work: Path, ranks: int = 4, workers: int = 2, shards: int = 2000,
                 epochs: int = 3, per_shard: int = 4, batch_size: int = 16, size: int = 32
                 ) -> tuple[list[Figure], list[Trial]]:
    """``ranks`` processes, each a ``loaders.ShardLoader`` for an explicit ``World(rank,
    ranks)`` (one node, no process group, replicate) with ``workers`` persistent DataLoader
    workers, iterating ``epochs`` epochs over ``shards`` synthetic shards of ``per_shard``
    images (``size`` px shards, train transform at ``size``, batch ``batch_size``).

    Each rank reports, per epoch, ``len(loader)`` (stated before the epoch) and the batches it
    yielded, its start-up time (constructor + first batch), and the RSS and PSS (from
    ``smaps_rollup``) of itself and each of its workers after the epoch.

    Trials and bounds: every rank exits 0; equal batch counts across ranks in every epoch;
    every epoch gives the planned batches; no growth: every worker's PSS after the last
    epoch <= after the first + 10 MB, with the same worker pids; ILSVRC2012-sized plans
    (``_big_plans``) see >= 99.9 % with every worker busy. Figures: start-up s, batches
    per epoch, worker PSS/RSS and rank PSS after the first and last epochs.
    """
    folder = make_shards(work / "loader-src", shards, per_shard, size)
    args = {"folder": str(folder), "ranks": ranks, "workers": workers, "epochs": epochs,
            "batch_size": batch_size, "size": size}
    procs = [start([sys.executable, "-c", RANK_MAIN, json.dumps({**args, "rank": r})],
                   clean_env())  # the rank imports harness.reliability.scale
             for r in range(ranks)]
    results = finish(procs, 900)
    reports = [line for _, lines, _ in results for line in lines]
    trials = _loader_trials(reports, ranks, epochs, results) + [_big_plans()]
    if not trials[0].ok:  # a rank failed: its figures would be partial
        return [], trials
    return _loader_figures(reports, epochs), trials
