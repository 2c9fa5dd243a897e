"""The trainer on one device: first fed synthetic batches made on the device (``--synthetic``:
the compute ceiling), then fed by the real loader from the converted set on local disk with
the loader's default worker count; images/s, the time split of an iteration and the data-wait
fraction of each, and the fed rate over the ceiling (target >= 0.95 on the full GPU run). Both
run the trainer's defaults for the device (bf16 autocast where it is native, channels_last,
``--compile auto``: torch.compile on CUDA). Then, at each size of the profile's
``res_sizes`` (160 and 224 px: a resolution schedule's ends; the quick CPU form's own 64 px
alone, where the first pair is the eager one), fed and synthetic again, eager (``--compile
off``) and compiled (``--compile on``): their rates, fed over synthetic, and compiled over
eager. Last, the torchvision-v2 recipe
(``--recipe torchvision-v2`` at the profile's model, size, batch and steps: TrivialAugment,
random erasing, mixup / cutmix, repeated augmentation x4, the model's moving average), fed
and synthetic: its rates, fed over synthetic, and its fed rate over the plain fed run's (what
the recipe's augmentation and average cost a step).

The trainer runs as users launch it, ``python scripts/train_imagenet.py``, in a child process;
its ``--log-json`` records give the rates, the first log interval (loader start-up, cuDNN's
first calls) left out. ``launch`` and ``steady`` serve the NCCL check too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .context import Context
from .machine import REPO, child_env
from .record import Row, figure, holds, plural, ratio
from .timing import median

TRAINER = REPO / "scripts" / "train_imagenet.py"
PHASES = ("data", "compute", "allreduce", "optimizer")
FED_OVER_SYNTHETIC = 0.95


@dataclass(frozen=True, kw_only=True)
class TrainRun:
    """One trainer run: its closing summary and its ``--log-json`` interval records."""

    summary: dict[str, Any]
    intervals: list[dict[str, Any]]


def trainer_args(ctx: Context, *, arch: str, batch: int, steps: int, log_every: int,
                 log_json: Path) -> list[str]:
    """The options every trainer run of the kit shares."""
    p = ctx.profile
    return ["--data", str(ctx.data()), "--arch", arch, "--image-size", str(p.image_size),
            "--batch-size", str(batch), "--steps", str(steps), "--log-every", str(log_every),
            "--no-validate", "--seed", "0", "--log-json", str(log_json),
            "--timeout", str(int(p.timeout_s))]


def launch(cmd: Sequence[str], log_json: Path, timeout_s: float, **env: object) -> TrainRun:
    """Run the trainer (``cmd``); its summary and intervals, or an error with its stderr."""
    log_json.unlink(missing_ok=True)
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s,
                          env=child_env(**env))
    if done.returncode != 0:
        raise RuntimeError(f"the trainer exited {done.returncode}: "
                           f"{done.stderr.strip()[-1500:]}")
    summary = json.loads([line for line in done.stdout.splitlines()
                          if line.startswith("{")][-1])
    records = [json.loads(line) for line in log_json.read_text().splitlines()]
    return TrainRun(summary=summary, intervals=[r for r in records if "images_per_s" in r])


def steady(run: TrainRun) -> dict[str, Any]:
    """Images/s, ms per phase and the data-wait fraction: medians over the log intervals
    after the first."""
    later = run.intervals[1:] or run.intervals
    return {"images_per_s": median([r["images_per_s"] for r in later]),
            "ms": {p: 1e3 * median([r["mean"][p] for r in later]) for p in PHASES},
            "data_wait_fraction": median([r["data_wait_fraction"] for r in later]),
            "intervals": len(later)}


def run_one(ctx: Context, name: str, *extra: str) -> tuple[TrainRun, dict[str, Any]]:
    p = ctx.profile
    log_json = ctx.work / f"train-{name}.jsonl"
    cmd = [sys.executable, str(TRAINER), *trainer_args(
        ctx, arch=p.arch, batch=p.batch, steps=p.steps, log_every=p.log_every,
        log_json=log_json), *extra]
    run = launch(cmd, log_json, p.timeout_s)
    return run, steady(run)


def split_text(s: dict[str, Any]) -> str:
    return " / ".join(f"{s['ms'][p]:.1f}" for p in PHASES)


def check(ctx: Context) -> dict[str, Any]:
    """Synthetic, then fed; with torch.compile when offered."""
    synth_run, synth = run_one(ctx, "synthetic", "--synthetic")
    fed_run, fed = run_one(ctx, "fed")
    workers = fed_run.summary["config"]["workers"]
    precision = fed_run.summary["precision"]
    c = "trainer"
    rows: list[Row] = [
        figure(c, f"{ctx.profile.arch}, {ctx.profile.image_size} px, batch "
                  f"{ctx.profile.batch}: synthetic device tensors (ceiling), img/s",
               synth["images_per_s"]),
        figure(c, f"fed by the loader from local disk ({plural(workers, 'worker')}), img/s",
               fed["images_per_s"]),
        ratio(c, "fed / synthetic", fed["images_per_s"] / synth["images_per_s"],
              FED_OVER_SYNTHETIC, ctx.targets_apply),
        figure(c, "ms per iteration, fed: data / fwd+bwd / all-reduce / optimizer",
               split_text(fed)),
        figure(c, "ms per iteration, synthetic: the same", split_text(synth)),
        figure(c, "data-wait fraction, fed", f"{fed['data_wait_fraction']:.1%}"),
    ]
    bf16 = "bf16 autocast" if precision["bf16"] else "fp32"
    if ctx.device == "cuda":
        rows.append(holds(c, "the trainer's CUDA defaults: bf16 autocast, channels_last",
                          bool(precision["bf16"]), f"{bf16}, channels_last"))
    else:
        rows.append(figure(c, "precision (--bf16 auto), layout", f"{bf16}, channels_last"))
    rows.append(figure(c, "torch.compile (--compile auto)",
                       "on" if fed_run.summary["compile"] else "off"))
    eager = None if fed_run.summary["compile"] else {"synthetic": synth, "fed": fed}
    by_size, size_rows = sizes_check(ctx, eager)
    recipe, recipe_rows = recipe_check(ctx, fed)
    return {"rows": rows + size_rows + recipe_rows, "synthetic": synth, "fed": fed,
            "workers": workers, "precision": precision, "sizes": by_size, "recipe": recipe}


RECIPE = "torchvision-v2"


def recipe_check(ctx: Context, plain_fed: dict[str, Any]) -> tuple[dict[str, Any], list[Row]]:
    """``--recipe torchvision-v2`` synthetic and fed, at the profile's model, size, batch and
    steps (given flags win over the preset): its steady figures, and its rows."""
    c = "trainer"
    _, synth = run_one(ctx, f"synthetic-{RECIPE}", "--recipe", RECIPE, "--synthetic")
    fed_run, fed = run_one(ctx, f"fed-{RECIPE}", "--recipe", RECIPE)
    rows = [figure(c, f"--recipe {RECIPE} (ta_wide, random erasing, mixup/cutmix, RA x4, "
                      "EMA): synthetic / fed img/s (fed / synthetic)",
                   f"{synth['images_per_s']:,.1f} / {fed['images_per_s']:,.1f} "
                   f"({fed['images_per_s'] / synth['images_per_s']:.3f})"),
            figure(c, f"--recipe {RECIPE}: fed / the plain fed run",
                   f"{fed['images_per_s'] / plain_fed['images_per_s']:.3f}")]
    return {"synthetic": synth, "fed": fed, "config": fed_run.summary["config"]}, rows


def sizes_check(ctx: Context, eager: dict[str, Any] | None,
                ) -> tuple[dict[str, Any], list[Row]]:
    """Synthetic and fed at each of the profile's ``res_sizes``, eager and compiled: the
    runs' steady figures by ``"<size>px-<eager|compiled>"``, and their rows. ``eager``: the
    first pair's figures when it ran eager, which stand for the eager pair at its own size
    (the quick CPU form's one size) instead of a second run of the same command."""
    c, runs, rows = "trainer", {}, []
    for size in ctx.profile.res_sizes:
        for mode, how in (("off", "eager"), ("on", "compiled")):
            if how == "eager" and eager is not None and size == ctx.profile.image_size:
                synth, fed = eager["synthetic"], eager["fed"]
            else:
                extra = ("--image-size", str(size), "--compile", mode)
                _, synth = run_one(ctx, f"synthetic-{size}-{how}", "--synthetic", *extra)
                _, fed = run_one(ctx, f"fed-{size}-{how}", *extra)
            runs[f"{size}px-{how}"] = {"synthetic": synth, "fed": fed}
            rows.append(figure(c, f"{size} px, {how}: synthetic / fed img/s (fed / synthetic)",
                               f"{synth['images_per_s']:,.1f} / {fed['images_per_s']:,.1f} "
                               f"({fed['images_per_s'] / synth['images_per_s']:.3f})"))
        e, k = runs[f"{size}px-eager"], runs[f"{size}px-compiled"]
        rows.append(figure(c, f"{size} px: torch.compile / eager, synthetic / fed",
                           f"{k['synthetic']['images_per_s'] / e['synthetic']['images_per_s']:.3f}"
                           f" / {k['fed']['images_per_s'] / e['fed']['images_per_s']:.3f}"))
    return runs, rows
