"""The DALI backend (only where ``nvidia.dali`` imports): ``backend="dali"`` with
``device="gpu"`` (``"cpu"`` in the CPU form) gives every rank, step by step, the same samples
as the Pillow backend, and its images/s.

Samples: the labels of the first steps of each rank of a 2-rank World (two nodes of one rank:
both decode on this machine's GPU 0), DALI's against Pillow's, with the batch shapes and
dtype. The pixels differ (DALI draws its own crops and flips; ``loaders.dali``). Rate: DALI
and Pillow over the same epoch of one rank, the run's worker count as DALI's threads.
"""

from __future__ import annotations

from typing import Any

from imgprep import World
from loaders import worker_count

from .backend_compare import loader, same_samples
from .context import Context
from .record import figure, holds, plural
from .timing import batch_rate, median, rates


def check(ctx: Context) -> dict[str, Any]:
    p = ctx.profile
    ok, detail = same_samples(ctx, "dali")
    workers = worker_count("auto", World())
    sync = ctx.sync
    out = {}
    for backend in ("dali", "pillow"):
        ld = loader(ctx, World(), backend, workers)
        ld.set_epoch(0)
        batch_rate(ld, 2, sync)  # warm-up: workers, DALI's first pipeline
        passes = []
        for r in range(p.rounds):
            ld.set_epoch(r + 1)
            passes.append(batch_rate(ld, p.many_batches, sync))
        out[backend] = passes
    where = "gpu" if ctx.device == "cuda" else "cpu"
    dali_rate, pil_rate = median(rates(out["dali"])), median(rates(out["pillow"]))
    c = "dali"
    rows = [holds(c, f"device={where!r}: the same samples per rank and step as Pillow", ok,
                  detail),
            figure(c, f"DALI on the {where}, {plural(workers, 'thread')}, img/s", dali_rate),
            figure(c, f"Pillow, {plural(workers, 'worker')}, img/s", pil_rate),
            figure(c, "DALI / Pillow", f"{dali_rate / pil_rate:.3f}" if pil_rate else "-")]
    return {"rows": rows, "dali": out["dali"], "pillow": out["pillow"]}
