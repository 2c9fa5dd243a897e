"""Benchmark Gloo all-reduce (fp32, bf16, fp16) and point-to-point bandwidth between processes.

What it measures, in one run of ``--procs`` processes (default 2) on this machine, each with
one intra-op thread, joined by ``torch.distributed`` over Gloo on TCP 127.0.0.1:

- support: whether this torch build's Gloo all-reduces float32, bfloat16 and float16 tensors;
  a dtype it refuses is reported as unsupported (table and JSON) and left out of the rest.
- p2p: send/recv bandwidth between rank 0 and rank 1, the link's ceiling (as the ChainerMN
  study checked its 10 GbE with an MPI point-to-point test): a ping-pong of an L-byte buffer,
  one-way time = round trip / 2, bandwidth = L / one-way time.
- sweep: ``dist.all_reduce`` (SUM) of an L-byte tensor, L = 1, 4, 16, 64, 128 MB (``--sizes``;
  MB = 1e6 bytes) in each supported dtype (the same bytes, so twice the elements in 16 bits);
  algbw = L / time, busbw = 2 L (p - 1) / p / time (the NCCL-tests definition: the bytes each
  process sends and receives in a ring all-reduce, comparable with the p2p bandwidth).
- resnet50: the gradients of ResNet-50 (25,557,032 parameters: 102.2 MB in fp32, 51.1 MB in
  bf16): an fp32 tensor of that many elements all-reduced as is, vs. cast to bf16, all-reduced
  and cast back into the fp32 tensor (``.to(torch.bfloat16)`` then ``copy_``, what DDP's
  ``bf16_compress_hook`` does, casts and their allocation included in the time; the three
  parts are also timed apart), vs. the same with a preallocated bf16 buffer, vs. a bf16 tensor
  all-reduced without casts; and the same in fp16 (``fp16_compress_hook``), for reference.

Timing: warm-up iterations first, then every timed iteration starts with a barrier; each rank
times its own call and an iteration's time is the slowest rank's (rank 0's alone for p2p).
Figures are medians over ``--iters`` iterations (fewer for large messages, never below
``--min-iters``); the variants of a size (the dtypes) and of the ResNet-50 case run
interleaved, one of each per round, so a slow spell hits all of them. Every block of rounds
(and every ResNet-50 round) records how many cores other processes kept busy meanwhile (from
/proc/stat, steal included, minus all ranks' own CPU time); the ResNet-50 medians use only the
rounds nobody disturbed (rounds are added, up to half as many again, to get enough of those;
all rounds count when too few were quiet, and the output then says it is unreliable, giving
the quiet rounds' medians beside them). Tensors are refilled from a pristine copy before
every iteration (outside the timer), so values stay bounded. Rank 0 gathers the timings; the
parent prints a table, then one JSON object with every figure as the last line of stdout.

Target: bf16 all-reduce of ResNet-50's gradients >= 1.3 x faster than fp32 (fp32 time / bf16
time, the all-reduce itself, timed alone, without the casts). What a compression hook
pays on top, the casts in and out, is reported beside it: with a fresh buffer per step, and
into a kept one (what the trainer's hook does); fp16 likewise. Linux only.

Run (from the repository root, in the project's environment)::

    python -m bench.allreduce                  # 2 processes, well under 3 minutes
    python -m bench.allreduce --procs 4        # more processes (p > cores: contended)
    python -m bench.allreduce --sizes 1 16 --iters 5 --resnet-iters 5   # a quick look
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.common import TICK, free_port, machine_busy_s, verdict

MB = 1e6
GB = 1e9
RESNET50_PARAMS = 25_557_032
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
TARGET_BF16_SPEEDUP = 1.3
QUIET_FOREIGN_CORES = 0.2  # a round is "quiet" when other processes used less CPU than this
MIN_BLOCK_S = 0.25  # blocks shorter than this are too short to tell (1/TICK s ticks per CPU)
REFERENCE_MB = 16.0  # messages up to this size get --iters iterations, larger ones fewer

Times = dict[str, list[float]]


# ---------------------------------------------------------------------------- helpers (ranks)


def iters_for(nbytes: int, iters: int, min_iters: int) -> int:
    """``iters`` up to REFERENCE_MB, then fewer in proportion to the size (>= ``min_iters``)."""
    scaled = round(iters * REFERENCE_MB * MB / max(nbytes, 1))
    return max(min(iters, min_iters), min(iters, scaled))


def timed(fn: Callable[[], Any]) -> float:
    """Seconds of ``fn()`` on this rank, after a barrier so that all ranks start together."""
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def block_start() -> tuple[float, float, float]:
    dist.barrier()
    return time.perf_counter(), time.process_time(), machine_busy_s()


def block_end(start: tuple[float, float, float]) -> tuple[float, float]:
    """Cores other processes kept busy since ``block_start``, and the block's seconds (rank
    0's readings, so the same values on every rank)."""
    dist.barrier()
    wall = time.perf_counter() - start[0]
    own = torch.tensor([time.process_time() - start[1]], dtype=torch.float64)
    busy = machine_busy_s() - start[2]
    dist.all_reduce(own)  # every rank's CPU time (all threads), summed
    out = torch.tensor([max(0.0, (busy - own.item()) / max(wall, 1e-9)), wall],
                       dtype=torch.float64)
    dist.broadcast(out, 0)  # rank 0's reading of /proc/stat decides for all
    return float(out[0].item()), float(out[1].item())


def probe_dtypes(names: Sequence[str]) -> dict[str, str | None]:
    """None for each dtype Gloo all-reduces correctly here, else why not (agreed by all ranks)."""
    out: dict[str, str | None] = {}
    for name in names:
        err: str | None = None
        try:
            t = torch.ones(8, dtype=DTYPES[name])
            dist.all_reduce(t)
            if not bool((t.float() == dist.get_world_size()).all()):
                err = f"wrong sum: {t.tolist()}"
        except (RuntimeError, ValueError, TypeError) as e:
            err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        flag = torch.tensor([0.0 if err else 1.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if err is None and flag.item() < 1.0:
            err = "refused on another rank"
        out[name] = err
    return out


# ---------------------------------------------------------------------------- measures (ranks)


def ping_pong(rank: int, buf: torch.Tensor) -> None:
    """Rank 0 sends ``buf`` to rank 1 and receives it back; other ranks do nothing."""
    if rank == 0:
        dist.send(buf, 1)
        dist.recv(buf, 1)
    elif rank == 1:
        dist.recv(buf, 0)
        dist.send(buf, 0)


def measure_p2p(rank: int, args: argparse.Namespace, times: Times,
                foreign: dict[str, list[float]]) -> None:
    """Ping-pong between ranks 0 and 1; rank 0 records round trip / 2 per iteration."""
    for mb in args.sizes:
        nbytes = int(mb * MB)
        n = iters_for(nbytes, args.iters, args.min_iters)
        ping = partial(ping_pong, rank, torch.ones(nbytes, dtype=torch.uint8))
        for _ in range(args.warmup):
            timed(ping)
        start = block_start()
        for _ in range(n):
            dt = timed(ping)
            if rank == 0:
                times[f"p2p/{mb:g}"].append(dt / 2)
        foreign[f"p2p/{mb:g}"] = list(block_end(start))


def measure_sweep(rank: int, args: argparse.Namespace, names: Sequence[str], times: Times,
                  foreign: dict[str, list[float]]) -> None:
    """All-reduce of L-byte tensors, the dtypes interleaved within each round."""
    gen = torch.Generator().manual_seed(1000 + rank)
    for mb in args.sizes:
        nbytes = int(mb * MB)
        n = iters_for(nbytes, args.iters, args.min_iters)
        bufs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for name in names:
            numel = nbytes // torch.empty(0, dtype=DTYPES[name]).element_size()
            src = torch.randn(numel, generator=gen).to(DTYPES[name])
            bufs[name] = (src, src.clone())
        for _ in range(args.warmup):
            for src, work in bufs.values():
                work.copy_(src)
                timed(partial(dist.all_reduce, work))
        start = block_start()
        for _ in range(n):
            for name, (src, work) in bufs.items():
                work.copy_(src)
                times[f"allreduce/{name}/{mb:g}"].append(timed(partial(dist.all_reduce, work)))
        foreign[f"allreduce/{mb:g}"] = list(block_end(start))
        del bufs


def compressed_allreduce(grad: torch.Tensor, dtype: torch.dtype, times: Times, key: str,
                         buf: torch.Tensor | None = None) -> None:
    """What a compression hook does: cast down (a new tensor, or into ``buf``), all-reduce,
    cast back into ``grad``; records the total and each part under ``key``."""
    t0 = time.perf_counter()
    low = grad.to(dtype) if buf is None else buf.copy_(grad)
    t1 = time.perf_counter()
    dist.all_reduce(low)
    t2 = time.perf_counter()
    grad.copy_(low)
    t3 = time.perf_counter()
    times[key].append(t3 - t0)
    times[f"{key}/cast_in"].append(t1 - t0)
    times[f"{key}/allreduce"].append(t2 - t1)
    times[f"{key}/cast_out"].append(t3 - t2)


def resnet_variants(names: Sequence[str]) -> list[tuple[str, str, str]]:
    """(key, the dtype on the wire, label) of every ResNet-50 variant that can run here."""
    out = [("fp32", "float32", "fp32 all-reduce (as is)")] if "float32" in names else []
    for name in ("bfloat16", "float16"):
        s = SHORT[name]
        if name in names and "float32" in names:
            out += [(f"{s}_cast", name, f"{s}: .to({s}) + all-reduce + copy_ back"),
                    (f"{s}_cast_prealloc", name, f"{s}: into a kept buffer + all-reduce + back")]
        if name in names:
            out.append((s, name, f"{s} all-reduce, no casts"))
    return out


def measure_resnet(rank: int, args: argparse.Namespace, names: Sequence[str], times: Times,
                   foreign: dict[str, list[float]]) -> None:
    """ResNet-50's gradients, every variant once per round; extra rounds while too few were
    quiet (the decision is the same on every rank: ``block_end`` agrees on the value)."""
    gen = torch.Generator().manual_seed(2000 + rank)
    pristine = torch.randn(RESNET50_PARAMS, generator=gen).mul_(1e-3)
    grad = pristine.clone()
    low_src = {n: pristine.to(DTYPES[n]) for n in names if n != "float32"}
    low = {n: t.clone() for n, t in low_src.items()}
    kept = {n: torch.empty_like(t) for n, t in low_src.items()}
    variants = resnet_variants(names)

    def one(key: str, name: str, record: bool) -> None:
        sink: Times = times if record else defaultdict(list)
        grad.copy_(pristine)
        if key == "fp32":
            sink[key].append(timed(partial(dist.all_reduce, grad)))
        elif key.endswith("_cast"):
            dist.barrier()
            compressed_allreduce(grad, DTYPES[name], sink, key)
        elif key.endswith("_cast_prealloc"):
            dist.barrier()
            compressed_allreduce(grad, DTYPES[name], sink, key, kept[name])
        else:
            low[name].copy_(low_src[name])
            sink[key].append(timed(partial(dist.all_reduce, low[name])))

    for _ in range(args.warmup):
        for key, name, _label in variants:
            one(key, name, record=False)
    need = (args.resnet_iters + 1) // 2
    rounds = quiet = 0
    foreign["resnet50"] = []
    while rounds < args.resnet_iters or (
            rounds < args.resnet_iters + args.resnet_iters // 2 and quiet < need):
        start = block_start()
        for key, name, _label in variants:
            one(key, name, record=True)
        f = block_end(start)[0]
        foreign["resnet50"].append(f)
        quiet += f < QUIET_FOREIGN_CORES
        rounds += 1


def worker(rank: int, args: argparse.Namespace, port: int, out_path: str) -> None:
    """One rank: join the group, measure everything, gather the timings on rank 0."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.procs,
                            timeout=datetime.timedelta(seconds=args.timeout))
    try:
        support = probe_dtypes(args.dtypes)
        names = [n for n in args.dtypes if support[n] is None]
        times: Times = defaultdict(list)
        foreign: dict[str, list[float]] = {}
        t0 = time.perf_counter()
        measure_p2p(rank, args, times, foreign)
        measure_sweep(rank, args, names, times, foreign)
        measure_resnet(rank, args, names, times, foreign)
        mine = {"times": dict(times), "foreign": foreign, "support": support,
                "measure_s": time.perf_counter() - t0, "threads": torch.get_num_threads()}
        gathered: list[Any] | None = [None] * args.procs if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if rank == 0 and gathered is not None:
            Path(out_path).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------- report (parent)


def per_iteration(ranks: list[dict[str, Any]], key: str) -> list[float]:
    """An iteration's time: the slowest rank's (ranks that did not record ``key`` skipped)."""
    lists = [r["times"][key] for r in ranks if key in r["times"]]
    return [max(xs) for xs in zip(*lists, strict=True)]


def stats(xs: Sequence[float]) -> dict[str, Any]:
    return {"median_s": round(statistics.median(xs), 6), "min_s": round(min(xs), 6),
            "iters": len(xs)}


def block_foreign(fw: list[float]) -> dict[str, Any]:
    """A block's foreign cores (None when it was too short for /proc/stat's ticks) and time."""
    return {"foreign_cores": round(fw[0], 2) if fw[1] >= MIN_BLOCK_S else None,
            "block_s": round(fw[1], 3)}


def fmt_foreign(f: float | None) -> str:
    return "-" if f is None else f"{f:.2f}"


def summarise(ranks: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    r0 = ranks[0]
    p = args.procs
    support: dict[str, str | None] = r0["support"]
    names = [n for n in args.dtypes if support[n] is None]
    bus = 2 * (p - 1) / p

    p2p: list[dict[str, Any]] = []
    p2p_bw: dict[str, float] = {}
    for mb in args.sizes:
        nbytes = int(mb * MB)
        s = stats(per_iteration(ranks, f"p2p/{mb:g}"))
        p2p_bw[f"{mb:g}"] = nbytes / s["median_s"] / GB
        p2p.append({"mb": mb, "bytes": nbytes, **s,
                    "gb_per_s": round(p2p_bw[f"{mb:g}"], 3),
                    **block_foreign(r0["foreign"][f"p2p/{mb:g}"])})

    sweep: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        rows = []
        elem = torch.empty(0, dtype=DTYPES[name]).element_size()
        for mb in args.sizes:
            nbytes = int(mb * MB)
            numel = nbytes // elem
            s = stats(per_iteration(ranks, f"allreduce/{name}/{mb:g}"))
            alg = numel * elem / s["median_s"] / GB
            rows.append({"mb": mb, "bytes": numel * elem, "numel": numel, **s,
                         "algbw_gb_s": round(alg, 3), "busbw_gb_s": round(alg * bus, 3),
                         "busbw_over_p2p": round(alg * bus / p2p_bw[f"{mb:g}"], 3),
                         **block_foreign(r0["foreign"][f"allreduce/{mb:g}"])})
        sweep[name] = rows

    rf = r0["foreign"]["resnet50"]
    quiet_idx = [i for i, f in enumerate(rf) if f < QUIET_FOREIGN_CORES]
    noisy = len(quiet_idx) < (args.resnet_iters + 1) // 2
    use = quiet_idx if not noisy else list(range(len(rf)))
    variants: dict[str, dict[str, Any]] = {}
    for key, name, label in resnet_variants(names):
        xs = per_iteration(ranks, key)
        chosen = [xs[i] for i in use]
        wire = RESNET50_PARAMS * torch.empty(0, dtype=DTYPES[name]).element_size()
        v: dict[str, Any] = {"label": label, "wire_dtype": name, "wire_bytes": wire,
                             **stats(chosen), "median_all_rounds_s":
                             round(statistics.median(xs), 6), "median_quiet_rounds_s":
                             round(statistics.median([xs[i] for i in quiet_idx]), 6)
                             if quiet_idx else None}
        ar = v["median_s"]
        if "_cast" in key:
            for part in ("cast_in", "allreduce", "cast_out"):
                ys = per_iteration(ranks, f"{key}/{part}")
                v[f"{part}_median_s"] = round(statistics.median([ys[i] for i in use]), 6)
            ar = v["allreduce_median_s"]
        v["allreduce_busbw_gb_s"] = round(wire / ar / GB * bus, 3)
        variants[key] = v

    ratios: dict[str, dict[str, Any]] = {}
    fp32 = variants.get("fp32")
    for key, target in (("bf16", TARGET_BF16_SPEEDUP), ("bf16_cast_prealloc", None),
                        ("bf16_cast", None), ("fp16", None), ("fp16_cast_prealloc", None),
                        ("fp16_cast", None)):
        rk = f"resnet50_fp32_over_{key}"
        on_wire = "bfloat16" if key.startswith("bf16") else "float16"
        if fp32 is None or key not in variants:
            why = (support.get("float32") if fp32 is None else support.get(on_wire)) \
                or "not measured (--dtypes)"
            ratios[rk] = {"value": None, "target": target, "result": f"UNSUPPORTED ({why})"
                          if target else "n/a", "why": why}
            continue
        val = fp32["median_s"] / variants[key]["median_s"]
        ratios[rk] = {"value": round(val, 3), "target": target,
                      "result": verdict(val, target) if target else "info"}
        if target and noisy and quiet_idx:  # the few undisturbed rounds, for what they're worth
            q = fp32["median_quiet_rounds_s"] / variants[key]["median_quiet_rounds_s"]
            ratios[f"{rk}_{len(quiet_idx)}_quiet_rounds"] = {
                "value": round(q, 3), "target": None, "result": "info"}

    return {
        "benchmark": "allreduce",
        "backend": "gloo",
        "init_method": "tcp://127.0.0.1",
        "procs": p,
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "threads_per_process": r0["threads"],
        "mb": MB,
        "sizes_mb": list(args.sizes),
        "iters": args.iters,
        "min_iters": args.min_iters,
        "warmup": args.warmup,
        "timing": "per iteration: the slowest rank's time after a barrier; median over "
                  "iterations",
        "busbw_formula": "2 * L * (p - 1) / p / time",
        "dtype_support": {n: {"supported": support[n] is None, "error": support[n]}
                          for n in args.dtypes},
        "p2p": {"ranks": [0, 1], "method": "ping-pong, one-way time = round trip / 2",
                "sizes": p2p},
        "allreduce": sweep,
        "resnet50": {"params": RESNET50_PARAMS, "rounds": len(rf),
                     "quiet_rounds": len(quiet_idx),
                     "foreign_cores": [round(f, 2) for f in rf], "variants": variants},
        "ratios": ratios,
        "quiet_foreign_cores": QUIET_FOREIGN_CORES,
        "noisy": noisy,
        "max_foreign_cores_p2p_sweep": round(max(
            (v[0] for k, v in r0["foreign"].items() if k != "resnet50" and v[1] >= MIN_BLOCK_S),
            default=0.0), 2),
        "min_block_s": MIN_BLOCK_S,
        "measure_s": round(max(r["measure_s"] for r in ranks), 1),
        "all_pass": all(v["result"] == "PASS" for v in ratios.values() if v["target"]),
    }


def print_table(res: dict[str, Any]) -> None:
    p = res["procs"]
    sup = ", ".join(f"{n} {'yes' if v['supported'] else 'NO (' + str(v['error']) + ')'}"
                    for n, v in res["dtype_support"].items())
    print(f"Gloo all-reduce benchmark: {p} processes over TCP 127.0.0.1, torch {res['torch']}, "
          f"{res['cpus']} CPUs, {res['threads_per_process']} thread per process; "
          f"load average {res['loadavg_start']} -> {res['loadavg_end']}")
    print(f"Gloo all-reduce support: {sup}")
    print(f"MB = 1e6 bytes; busbw = 2 L (p-1)/p / time; time = slowest rank after a barrier, "
          f"median of the iterations; {res['warmup']} warm-up iterations")
    print()
    print("point-to-point send/recv, rank 0 <-> rank 1 (ping-pong; one-way = round trip / 2)")
    print(f"{'MB':>7s} {'iters':>5s} {'median ms':>10s} {'min ms':>8s} {'GB/s':>7s} "
          f"{'foreign':>8s}")
    for r in res["p2p"]["sizes"]:
        print(f"{r['mb']:7g} {r['iters']:5d} {r['median_s'] * 1e3:10.2f} {r['min_s'] * 1e3:8.2f} "
              f"{r['gb_per_s']:7.2f} {fmt_foreign(r['foreign_cores']):>8s}")
    print()
    print("all-reduce (SUM) of an L-byte tensor")
    print(f"{'MB':>7s} {'dtype':>9s} {'iters':>5s} {'median ms':>10s} {'min ms':>8s} "
          f"{'algbw GB/s':>10s} {'busbw GB/s':>10s} {'busbw/p2p':>9s} {'foreign':>8s}")
    for i, mb in enumerate(res["sizes_mb"]):
        for name, rows in res["allreduce"].items():
            r = rows[i]
            print(f"{mb:7g} {name:>9s} {r['iters']:5d} {r['median_s'] * 1e3:10.2f} "
                  f"{r['min_s'] * 1e3:8.2f} {r['algbw_gb_s']:10.2f} {r['busbw_gb_s']:10.2f} "
                  f"{r['busbw_over_p2p']:9.2f} {fmt_foreign(r['foreign_cores']):>8s}")
    for name, v in res["dtype_support"].items():
        if not v["supported"]:
            print(f"{'':7s} {name:>9s}  UNSUPPORTED by Gloo here: {v['error']}")
    print("foreign = cores other processes kept busy during the size's block (from /proc/stat; "
          f"- when the block took < {MIN_BLOCK_S} s, too short for its 1/{TICK} s ticks)")
    print()
    rn = res["resnet50"]
    print(f"ResNet-50 gradients: {rn['params']:,} parameters ({rn['params'] * 4 / MB:.1f} MB "
          f"fp32, {rn['params'] * 2 / MB:.1f} MB bf16/fp16); {rn['rounds']} interleaved "
          f"rounds, {rn['quiet_rounds']} quiet (other processes < {res['quiet_foreign_cores']} "
          f"cores); medians over {'the quiet ones' if not res['noisy'] else 'ALL of them'}")
    print(f"{'variant':46s} {'median ms':>9s} {'quiet ms':>8s} {'min ms':>8s} {'busbw*':>7s}"
          "  parts (ms): cast in / all-reduce / cast back")
    for v in rn["variants"].values():
        parts = ""
        if "cast_in_median_s" in v:
            parts = (f"{v['cast_in_median_s'] * 1e3:.1f} / {v['allreduce_median_s'] * 1e3:.1f}"
                     f" / {v['cast_out_median_s'] * 1e3:.1f}")
        quiet = v["median_quiet_rounds_s"]
        quiet_ms = "-" if quiet is None else f"{quiet * 1e3:.2f}"
        print(f"{v['label']:46s} {v['median_s'] * 1e3:9.2f} {quiet_ms:>8s} {v['min_s'] * 1e3:8.2f} "
              f"{v['allreduce_busbw_gb_s']:7.2f}  {parts}")
    print("quiet ms = median of the quiet rounds alone; * busbw (GB/s) of the all-reduce part "
          "alone, L = the bytes on the wire")
    if res["max_foreign_cores_p2p_sweep"] >= QUIET_FOREIGN_CORES:
        print(f"WARNING: other processes kept up to {res['max_foreign_cores_p2p_sweep']:.2f} "
              "cores busy during the p2p and sweep blocks: those figures are unreliable")
    if res["noisy"]:
        print("WARNING: other processes kept the CPUs busy during most ResNet-50 rounds; its "
              "figures and the ratios below are unreliable: rerun on an idle machine")
    print()
    print(f"{'ratio (speed-up over fp32)':38s} {'value':>7s} {'target':>8s}  result")
    for k, v in res["ratios"].items():
        val = "-" if v["value"] is None else f"{v['value']:.3f}"
        target = "" if v["target"] is None else f">= {v['target']}"
        print(f"{k:38s} {val:>7s} {target:>8s}  {v['result']}")
    print(f"(measured in {res['measure_s']:.1f} s; {res['wall_s']:.1f} s with start-up)")


# ---------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--sizes", type=float, nargs="+", default=[1.0, 4.0, 16.0, 64.0, 128.0],
                    help="message sizes in MB (1e6 bytes) (default: 1 4 16 64 128)")
    ap.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES),
                    help="all-reduce dtypes (default: all three)")
    ap.add_argument("--iters", type=int, default=20,
                    help=f"timed iterations per size up to {REFERENCE_MB:g} MB; larger sizes "
                         "get proportionally fewer (default 20)")
    ap.add_argument("--min-iters", type=int, default=10,
                    help="the fewest timed iterations of any size (default 10)")
    ap.add_argument("--resnet-iters", type=int, default=30,
                    help="timed rounds of the ResNet-50 case (default 30)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up iterations (default 2)")
    ap.add_argument("--timeout", type=float, default=300,
                    help="process-group timeout in seconds (default 300)")
    args = ap.parse_args(argv)
    if args.procs < 2:
        ap.error("--procs must be >= 2 (p2p needs two processes; busbw is 0 for one)")
    if min(args.iters, args.min_iters, args.resnet_iters) < 1 or args.warmup < 0:
        ap.error("--iters, --min-iters and --resnet-iters must be >= 1, --warmup >= 0")
    if min(args.sizes) <= 0 or args.timeout <= 0:
        ap.error("--sizes and --timeout must be > 0")
    args.dtypes = list(dict.fromkeys(args.dtypes))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    fd, out_path = tempfile.mkstemp(prefix="bench_allreduce-", suffix=".json")
    os.close(fd)
    try:
        mp.spawn(worker, args=(args, free_port(), out_path), nprocs=args.procs, join=True)
        ranks = json.loads(Path(out_path).read_text())
    finally:
        os.unlink(out_path)
    res = summarise(ranks, args)
    res["loadavg_start"] = [round(x, 2) for x in load0]
    res["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    print_table(res)
    print(json.dumps(res, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
