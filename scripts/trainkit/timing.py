"""Where each iteration's time goes: data wait, forward+backward, exposed all-reduce, optimizer.

DDP overlaps gradient all-reduce with backward: a bucket is reduced as soon as its gradients
are ready, and ``backward()`` returns only when every bucket's reduction is done. A
communication hook that notes when the last bucket became ready splits backward in two: the
time until then is compute, the time from then until ``backward()`` returns is all-reduce
that backward could not hide (the *exposed* part).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

PHASES = ("data", "compute", "allreduce", "optimizer")
Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


@dataclass
class BucketClock:
    """Wraps a DDP communication hook; remembers when the last bucket was handed to it.

    Register ``clock.hook`` (a plain function: DDP inspects its annotations)."""

    wire: torch.dtype
    last_ready: float = 0.0
    buckets: int = 0
    wire_dtypes: set[str] = field(default_factory=set)
    hook: Hook = field(init=False, repr=False)
    _sent: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        def hook(state, bucket):  # type: ignore[no-untyped-def]
            self.last_ready = time.perf_counter()
            self.buckets += 1
            grads = bucket.buffer()
            # Average in the wire dtype (ChainerMN's half-precision all-reduce): the cast
            # halves the bytes on the wire for bf16/fp16. Each bucket keeps its wire buffer:
            # a fresh 51 MB one per step costs more in page faults than the halving saves.
            sent = grads if self.wire == grads.dtype else self._sent.get(bucket.index())
            if sent is None or sent.shape != grads.shape:
                sent = self._sent[bucket.index()] = torch.empty_like(grads, dtype=self.wire)
            if sent is not grads:
                sent.copy_(grads)
            sent.div_(dist.get_world_size())
            self.wire_dtypes.add(str(sent.dtype).removeprefix("torch."))
            future = dist.all_reduce(sent, async_op=True).get_future()

            def back(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
                if f.value()[0] is not grads:
                    grads.copy_(f.value()[0])
                return grads

            return future.then(back)

        # DDP checks these annotations by identity, so they must be objects, not strings.
        hook.__annotations__ = {"bucket": dist.GradBucket,
                                "return": torch.futures.Future[torch.Tensor]}
        self.hook = hook


WIRE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def wire_dtype(name: str) -> torch.dtype:
    """The dtype gradients travel in for ``--allreduce-dtype name``."""
    if name not in WIRE_DTYPES:
        raise ValueError(f"all-reduce dtype must be one of {sorted(WIRE_DTYPES)}")
    return WIRE_DTYPES[name]


@dataclass
class Split:
    """Seconds per phase, summed over the iterations of one log interval."""

    data: float = 0.0
    compute: float = 0.0
    allreduce: float = 0.0
    optimizer: float = 0.0
    iterations: int = 0

    def add(self, data: float, compute: float, allreduce: float, optimizer: float) -> None:
        self.data += data
        self.compute += compute
        self.allreduce += allreduce
        self.optimizer += optimizer
        self.iterations += 1

    def per_iteration(self) -> dict[str, float]:
        n = max(self.iterations, 1)
        return {p: getattr(self, p) / n for p in PHASES}


def reduce_split(split: Split, world_size: int, device: torch.device) -> dict[str, Any]:
    """Per-iteration phase times, mean and max over ranks (collective: every rank calls it)."""
    mine = torch.tensor([split.per_iteration()[p] for p in PHASES], dtype=torch.float64,
                        device=device)
    if world_size > 1:
        total, peak = mine.clone(), mine.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        mean = (total / world_size).tolist()
        high = peak.tolist()
    else:
        mean = high = mine.tolist()
    step = sum(mean)
    return {
        "mean": dict(zip(PHASES, mean, strict=True)),
        "max": dict(zip(PHASES, high, strict=True)),
        "step_s": step,
        "data_wait_fraction": mean[0] / step if step > 0 else 0.0,
        "exposed_allreduce_fraction": mean[2] / step if step > 0 else 0.0,
    }


@dataclass
class DataWaitHint:
    """Says once what to change when the data-wait fraction stays above ``threshold`` for
    ``intervals`` log intervals in a row (the first interval, which holds the loader
    workers' start-up, does not count)."""

    workers: int
    cores_per_rank: int
    ranks_per_node: int
    staged: bool
    one_cpu: bool = False  # the launcher bound the rank (and so its workers) to a single CPU
    threshold: float = 0.05
    intervals: int = 3
    given: bool = False
    _seen: int = 0
    _high: int = 0
    _low: float = 1.0  # the smallest fraction of the current run of high intervals

    def update(self, fraction: float) -> str | None:
        """Note one interval's data-wait fraction; the hint's text the first time it is due."""
        self._seen += 1
        high = self._seen > 1 and fraction > self.threshold
        self._low = min(self._low, fraction) if high and self._high else fraction
        self._high = self._high + 1 if high else 0
        if self.given or self._high < self.intervals:
            return None
        self.given = True
        return (f"hint: the step waited for data at least {self._low:.0%} of the time in "
                f"{self._high} log intervals in a row; {self.advice()}")

    def advice(self) -> str:
        w, c, r = self.workers, self.cores_per_rank, self.ranks_per_node
        if self.one_cpu and w:
            tips = [f"this rank and its {w} loader worker(s) share the one CPU the launcher "
                    "bound it to: launch with mpirun --bind-to none (or --map-by "
                    "ppr:N:node:PE=C), or srun --cpus-per-task C"]
        elif w == 0:
            tips = ["--workers 0 decodes in the training process: use --workers auto"]
        elif w < c:
            tips = [f"raise --workers ({w} now; this rank may use {c} cores)"]
        else:
            tips = [f"every core of this rank ({c}) decodes already (--workers {w}): run "
                    f"fewer ranks per node ({r} now) or give the job more cores"]
        if not self.staged:
            tips.append("stage the data to node-local disk (--stage-from) if --data is on "
                        "shared storage")
        return "; ".join(tips)


def report(split: Split, seen: int, t_log: float, world_size: int, rank: int,
           device: torch.device, step: int, epoch: int, loss: float) -> dict[str, Any]:
    """Reduce a log interval's split over ranks (collective); rank 0 prints one compact line
    per phase. Returns the interval's record (images/s, mean and max per phase)."""
    times = reduce_split(split, world_size, device)
    elapsed = time.perf_counter() - t_log
    per_rank = seen / elapsed if elapsed > 0 else 0.0
    rec = {"step": step, "epoch": epoch, "loss": loss, "images_per_s": per_rank * world_size,
           "images_per_s_per_rank": per_rank, **times}
    if rank == 0:
        m, x = times["mean"], times["max"]
        print(f"step {step} loss {loss:.3f} | {rec['images_per_s']:.1f} img/s "
              f"({per_rank:.1f}/rank) | ms mean/max: data {m['data'] * 1e3:.1f}/"
              f"{x['data'] * 1e3:.1f} fwd+bwd {m['compute'] * 1e3:.1f}/{x['compute'] * 1e3:.1f}"
              f" allreduce {m['allreduce'] * 1e3:.1f}/{x['allreduce'] * 1e3:.1f} optim "
              f"{m['optimizer'] * 1e3:.1f}/{x['optimizer'] * 1e3:.1f} | data wait "
              f"{times['data_wait_fraction']:.1%}", flush=True)
    return rec
