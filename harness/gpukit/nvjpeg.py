"""The nvjpeg backend: ``backend="nvjpeg"`` with ``device="gpu"`` (torchvision's nvJPEG on
the GPU; ``"cpu"`` in the CPU form) against the CPU loader (the ``nvjpeg`` check), and what
each feeds a trainer (the ``nvjpeg_trainer`` check).

- Samples: the labels of the first steps of each rank of a 2-rank World (two nodes of one
  rank, both on GPU 0), nvjpeg's against Pillow's, with the batch shapes and dtype (the
  pixels differ: another decoder and resampler, ``loaders.nvjpeg``).
- Rate: images/s of one rank's loader, random-resized-crop at the run's size, channels_last
  rows: nvjpeg (``workers="auto"`` CPU-decode threads) against the Pillow backend with 4
  workers and with ``workers="auto"`` (15 on 16 cores), timed in interleaved rounds; on the
  GPU each batch is waited for (its CUDA work done) before the next is asked for.
- Trainer: for each model of the profile (ResNet-50 and ResNet-18 at 224 px, batch 256 on
  the GPU run), ``scripts/train_imagenet.py`` fed synthetic device tensors (the ceiling),
  then by the nvjpeg backend, then by the Pillow backend (``--workers auto``): images/s,
  fed / synthetic, the data-wait fraction. Figures, no target: what the GPU decoder buys.

On a GPU machine both run only where torchvision imports (``machine.unavailable``).
"""

from __future__ import annotations

import sys
from typing import Any

from imgprep import World
from loaders import worker_count

from .backend_compare import loader, same_samples
from .context import Context
from .record import Row, figure, holds, plural
from .timing import batch_rate, median, rates
from .trainer import TRAINER, TrainRun, launch, steady, trainer_args


def worker_counts() -> list[int]:
    """The Pillow loader's worker counts: 4 (a node with few cores a GPU) and ``auto``."""
    auto = worker_count("auto", World.single())
    return sorted({min(4, auto), auto})


def loader_rates(ctx: Context) -> dict[str, list[dict[str, float]]]:
    """Passes of nvjpeg and of Pillow at each worker count, in interleaved rounds, after a
    warm-up pass each (threads, workers, nvJPEG's start)."""
    p = ctx.profile
    one = World.single()
    loaders = {"nvjpeg": loader(ctx, one, "nvjpeg", worker_count("auto", one))}
    loaders.update({f"pillow-{w}": loader(ctx, one, "pillow", w) for w in worker_counts()})
    out: dict[str, list[dict[str, float]]] = {name: [] for name in loaders}
    for ld in loaders.values():
        ld.set_epoch(0)
        batch_rate(ld, 2, ctx.sync)
    for r in range(p.rounds):
        for name, ld in loaders.items():
            ld.set_epoch(r + 1)
            out[name].append(batch_rate(ld, p.many_batches, ctx.sync))
    return out


def train(ctx: Context, arch: str, name: str, *extra: str) -> dict[str, Any]:
    p = ctx.profile
    log_json = ctx.work / f"train-nvjpeg-{arch}-{name}.jsonl"
    cmd = [sys.executable, str(TRAINER), *trainer_args(
        ctx, arch=arch, batch=p.batch, steps=p.steps, log_every=p.log_every,
        log_json=log_json), *extra]
    run: TrainRun = launch(cmd, log_json, p.timeout_s)
    return steady(run)


def trainer_rows(ctx: Context, arch: str) -> tuple[list[Row], dict[str, Any]]:
    """Synthetic, fed by nvjpeg, fed by Pillow: one model's rows and figures."""
    runs = {"synthetic": train(ctx, arch, "synthetic", "--synthetic"),
            "nvjpeg": train(ctx, arch, "nvjpeg", "--loader-backend", "nvjpeg"),
            "pillow": train(ctx, arch, "pillow", "--loader-backend", "pillow")}
    ceiling = runs["synthetic"]["images_per_s"]
    c, p = "nvjpeg_trainer", ctx.profile
    head = f"{arch}, {p.image_size} px, batch {p.batch}"

    def over(name: str) -> str:
        return f"{runs[name]['images_per_s'] / ceiling:.3f}" if ceiling else "-"

    rows = [figure(c, f"{head}: synthetic (ceiling), img/s", ceiling),
            figure(c, f"{head}: fed by nvjpeg / by Pillow (auto workers), img/s",
                   f"{runs['nvjpeg']['images_per_s']:,.1f} / "
                   f"{runs['pillow']['images_per_s']:,.1f}"),
            figure(c, f"{head}: fed / synthetic, nvjpeg / Pillow",
                   f"{over('nvjpeg')} / {over('pillow')}"),
            figure(c, f"{head}: data-wait fraction, nvjpeg / Pillow",
                   f"{runs['nvjpeg']['data_wait_fraction']:.1%} / "
                   f"{runs['pillow']['data_wait_fraction']:.1%}")]
    return rows, runs


def check(ctx: Context) -> dict[str, Any]:
    p = ctx.profile
    ok, detail = same_samples(ctx, "nvjpeg")
    passes = loader_rates(ctx)
    where = "gpu" if ctx.device == "cuda" else "cpu"
    threads = worker_count("auto", World.single())
    nv = median(rates(passes["nvjpeg"]))
    c = "nvjpeg"
    rows = [holds(c, f"device={where!r}: the same samples per rank and step as Pillow", ok,
                  detail),
            figure(c, f"nvjpeg on the {where} ({plural(threads, 'CPU-decode thread')}), "
                      f"random-resized-crop {p.image_size}, batch {p.loader_batch}, img/s", nv)]
    for w in worker_counts():
        pil = median(rates(passes[f"pillow-{w}"]))
        rows += [figure(c, f"Pillow, {plural(w, 'worker')}, img/s", pil),
                 figure(c, f"nvjpeg / Pillow with {plural(w, 'worker')}",
                        f"{nv / pil:.3f}" if pil else "-")]
    return {"rows": rows, "loaders": passes}


def trainer_check(ctx: Context) -> dict[str, Any]:
    """The trainer rows (module docstring), a check of their own so that the record keeps
    the loader's rows when a run is cut short."""
    rows: list[Row] = []
    trainers = {}
    for arch in ctx.profile.nvjpeg_archs:
        more, trainers[arch] = trainer_rows(ctx, arch)
        rows += more
    return {"rows": rows, "trainer": trainers}
