"""NCCL as the trainer uses it: ``torchrun --nproc-per-node 1`` with ``--backend nccl`` opens
the process group for the one process, so DDP's bucketed all-reduce runs through NCCL with the
bf16 wire dtype (``--allreduce-dtype bf16``); a few steps, whose losses must equal those of
the same run with ``--backend gloo`` on the same GPU and seed (``--deterministic``: cuDNN's
deterministic algorithms and a fixed cuBLAS workspace). One rank's all-reduce of its own
gradients changes nothing but their dtype, so any difference is the backend's doing.

The CPU form runs the same pair with Gloo on both sides: torchrun, the one-process group,
the bucketed hook and the loss comparison, without NCCL.
"""

from __future__ import annotations

import sys
from typing import Any

from bench.common import free_port

from .context import Context
from .record import figure, holds
from .trainer import TRAINER, TrainRun, launch, steady, trainer_args

WIRE = "bf16"


def torchrun(ctx: Context, backend: str, tag: str) -> TrainRun:
    """The trainer under ``torchrun --nproc-per-node 1`` with ``backend``."""
    p = ctx.profile
    log_json = ctx.work / f"nccl-{tag}.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
           "--master-port", str(free_port()), str(TRAINER),
           *trainer_args(ctx, arch=p.nccl_arch, batch=p.nccl_batch, steps=p.nccl_steps,
                         log_every=1, log_json=log_json),
           "--backend", backend, "--allreduce-dtype", WIRE, "--deterministic",
           "--workers", "2" if ctx.device == "cuda" else "1"]
    return launch(cmd, log_json, p.timeout_s)


def losses(run: TrainRun) -> list[float]:
    return [float(r["loss"]) for r in run.intervals]


def check(ctx: Context) -> dict[str, Any]:
    pair = ("nccl", "gloo") if ctx.device == "cuda" else ("gloo", "gloo")
    a, b = (torchrun(ctx, backend, f"{i}-{backend}") for i, backend in enumerate(pair))
    la, lb = losses(a), losses(b)
    gap = max((abs(x - y) for x, y in zip(la, lb, strict=False)), default=float("inf"))
    same = len(la) == len(lb) == ctx.profile.nccl_steps and la == lb
    backends = [a.summary["backend"], b.summary["backend"]]
    wires = [r.summary["wire_dtypes"] for r in (a, b)]
    buckets = [int(r.summary["buckets"]) for r in (a, b)]
    c = "nccl"
    rows = [
        holds(c, "process groups opened, one rank under torchrun",
              backends == list(pair) and all(r.summary["world_size"] == 1 for r in (a, b)),
              " vs ".join(backends)),
        holds(c, f"bucketed all-reduce in {WIRE} (buckets over {len(la)} steps)",
              min(buckets) > 0 and all(w == ["bfloat16"] for w in wires),
              f"{buckets[0]} / {buckets[1]} buckets, "
              f"{' / '.join(','.join(w) or 'none' for w in wires)} on the wire"),
        holds(c, f"losses equal over {ctx.profile.nccl_steps} steps (same seed, "
                 "--deterministic)", same,
              "equal" if same else f"differ: by up to {gap:.3g} ({len(la)} / {len(lb)} steps)"),
        figure(c, f"{ctx.profile.nccl_arch}, batch {ctx.profile.nccl_batch}: img/s "
                  f"{pair[0]} / {pair[1]}",
               f"{steady(a)['images_per_s']:,.1f} / {steady(b)['images_per_s']:,.1f}"),
    ]
    return {"rows": rows, "pair": list(pair), "losses": {"a": la, "b": lb},
            "buckets": buckets, "wire_dtypes": wires}
