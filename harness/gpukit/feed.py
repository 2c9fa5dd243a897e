"""The feed checks: what feeding the model costs its step, and what keeping the training
process's core, and the GPU's hardware JPEG decoders, win back. On the full GPU run: ResNet-50
at 160 px, batch 256, compiled (``feed_*`` of the profile: 250 steps, the first 50 of them the
warm-up left out, so 200 timed), the inductor cache in ``<work>/inductor`` kept for every run.

- Profile (is it the CPUs?): the trainer on synthetic batches alone, then beside the loader's
  load without its data (``harness.gpukit.burn``: the Pillow loader as the trainer ran it
  before, ``workers="auto"`` unpinned, decoding and dropping batches). If the synthetic rate
  beside it falls about as far as the fed rate falls below it, the loss is CPU contention,
  not the data's arrival (the fed run's data wait says the same from the other side).
- Rows, on every CPU of the machine (the ``feed`` check, after the profile) and on half of
  them (``feed_half``; ``taskset -c``: 16 and 8 on the lent H200), the trainer fed by:
  (a) ``--pin-cpus off --worker-nice 0``: ``workers="auto"`` as before; (b) ``--pin-cpus
  on``: the new ``auto``, the training process on a core of its own, the workers on the rest
  at nice 10; (c) ``--loader-backend nvimgcodec``: the hardware decoders (``hw_decoder_load``
  of each batch, the rest on the CPU threads; skipped where nvImageCodec does not import on
  the GPU); and on every CPU only, (d) as (b) with ``--worker-sizing demand`` (the workers
  sized to the step's demand, ``loaders.sizing``: whether it should be the default). Each:
  img/s, over the same CPUs' synthetic rate (target >= 0.95 for (b) and (c) on the full
  run), the data wait, fwd+bwd ms and the workers (the active ones at the end, for (d)).

A run of both (``--only feed,feed_half``) makes 10 trainer runs: the first compiles (a minute
or two), the others find their graphs in the cache; each check is recorded as it ends. The
quick and CPU forms run the same rows at their sizes (the CPU forms eager): what ``make test``
keeps from rotting.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from typing import Any

from imgprep import cpu_list

from .context import Context
from .machine import SAFE_PATH, child_env
from .record import Row, figure, ratio
from .trainer import FED_OVER_SYNTHETIC, TRAINER, launch, steady, trainer_args

FEDS = {  # row -> (what, the trainer's flags)
    "a": ("(a) auto as before, nothing pinned", ("--pin-cpus", "off", "--worker-nice", "0")),
    "b": ("(b) auto now: pinned, workers at nice 10", ("--pin-cpus", "on")),
    "c": ("(c) hardware decoders (nvimgcodec)", ("--loader-backend", "nvimgcodec")),
    "d": ("(d) as (b), workers sized to demand", ("--pin-cpus", "on", "--worker-sizing",
                                                  "demand")),
}
EVERY_CPU_ONLY = ("d",)  # rows the feed check runs and feed_half leaves out
TARGETED = ("b", "c")  # rows held to fed / synthetic >= FED_OVER_SYNTHETIC on the full run
BURN_S = 900.0  # the burn's own limit; it is stopped when its trainer run ends
CACHE = {"TORCHINDUCTOR_FX_GRAPH_CACHE": 1, "TORCHINDUCTOR_AUTOGRAD_CACHE": 1}  # compiled
# graphs kept in <work>/inductor for the next run: only the first one compiles


def cpus_of(half: bool) -> list[int]:
    """Every CPU of this process, or the first half of them."""
    mine = sorted(os.sched_getaffinity(0))
    return mine[:max(1, len(mine) // 2)] if half else mine


def on(cpus: list[int]) -> list[str]:
    """The command prefix that runs a command on ``cpus`` only."""
    taskset = shutil.which("taskset")
    if taskset is None:
        raise RuntimeError("taskset (util-linux) is not on PATH: the feed check runs the "
                           "trainer on some of the CPUs with it")
    return [taskset, "-c", cpu_list(cpus)]


def train(ctx: Context, name: str, cpus: list[int], *flags: str) -> dict[str, Any]:
    """The trainer on ``cpus`` with the feed sizes and ``flags``: its steady figures and the
    workers it ran."""
    p = ctx.profile
    log_json = ctx.work / f"train-feed-{name}.jsonl"
    cmd = [*on(cpus), sys.executable, str(TRAINER), *trainer_args(
        ctx, arch=p.arch, batch=p.batch, steps=p.feed_steps, log_every=p.feed_log_every,
        log_json=log_json), "--image-size", str(p.feed_size), "--compile", p.feed_compile,
        *flags]
    run = launch(cmd, log_json, p.timeout_s, **CACHE, TORCHINDUCTOR_CACHE_DIR=ctx.work / "inductor")
    active = run.intervals[-1].get("active_workers") if run.intervals else None
    return steady(run) | {"workers": active or run.summary["config"]["workers"]}


def beside_the_loader(ctx: Context, cpus: list[int]) -> dict[str, Any]:
    """Synthetic batches with the loader's load beside the trainer (module docstring)."""
    p = ctx.profile
    cmd = [*on(cpus), sys.executable, *SAFE_PATH, "-m",
           "harness.gpukit.burn", str(ctx.data()), "--size", str(p.feed_size), "--batch",
           str(p.batch), "--seconds", str(BURN_S)]
    burn = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        return train(ctx, "synthetic-beside-loader", cpus, "--synthetic")
    finally:
        os.killpg(burn.pid, signal.SIGTERM)  # the burn's own group: it and its workers
        burn.wait(timeout=60)


def ms(s: dict[str, Any], phase: str) -> str:
    return f"{s['ms'][phase]:.1f}"


def profile_rows(ctx: Context, alone: dict[str, Any], beside: dict[str, Any],
                 fed: dict[str, Any]) -> list[Row]:
    c = "feed"
    a, b, f = (x["images_per_s"] for x in (alone, beside, fed))
    share = (1 - b / a) / (1 - f / a) if a and f < a else float("nan")
    return [figure(c, "profile: synthetic alone / beside the loader's decoding (as before), "
                      "img/s (beside / alone)", f"{a:,.1f} / {b:,.1f} ({b / a:.3f})"),
            figure(c, "profile: fwd+bwd ms, synthetic alone / beside the loader / fed (a)",
                   f"{ms(alone, 'compute')} / {ms(beside, 'compute')} / {ms(fed, 'compute')}"),
            figure(c, "profile: of fed (a)'s loss against synthetic, the share the loader's "
                      "CPU load alone explains", f"{share:.2f}")]


def rows_for(ctx: Context, cpus: list[int], synth: dict[str, Any],
             fed: dict[str, dict[str, Any]]) -> list[Row]:
    c, n = "feed", len(cpus)
    rows = [figure(c, f"{n} CPUs: synthetic (ceiling), img/s", synth["images_per_s"])]
    for key, run in fed.items():
        what = FEDS[key][0]
        value = run["images_per_s"] / synth["images_per_s"]
        rows += [figure(c, f"{n} CPUs, {what}: img/s, data wait, fwd+bwd ms, workers",
                        f"{run['images_per_s']:,.1f}, {run['data_wait_fraction']:.1%}, "
                        f"{ms(run, 'compute')}, {run['workers']}"),
                 ratio(c, f"{n} CPUs, {what}: fed / synthetic", value, FED_OVER_SYNTHETIC,
                       ctx.targets_apply and key in TARGETED)]
    return rows


def check(ctx: Context, half: bool, hardware: bool = True) -> dict[str, Any]:
    """The rows on every CPU, the profile first, or (``half``) on half of them (module
    docstring); ``hardware``: whether row (c) runs."""
    cpus = cpus_of(half)
    tag = f"{len(cpus)}cpus"
    synth = train(ctx, f"synthetic-{tag}", cpus, "--synthetic")
    beside = None if half else beside_the_loader(ctx, cpus)
    fed = {k: train(ctx, f"{k}-{tag}", cpus, *flags) for k, (_, flags) in FEDS.items()
           if (k != "c" or hardware) and not (half and k in EVERY_CPU_ONLY)}
    rows = [] if beside is None else profile_rows(ctx, synth, beside, fed["a"])
    runs = {"cpus": cpu_list(cpus), "synthetic": synth, **fed,
            **({} if beside is None else {"synthetic_beside_loader": beside})}
    return {"rows": rows + rows_for(ctx, cpus, synth, fed), "runs": runs,
            "hardware_row": hardware}


def nvimgcodec_problem() -> str | None:
    """Why row (c) cannot decode on the GPU here (None: ``nvidia.nvimgcodec`` imports, tried
    in a child process)."""
    done = subprocess.run([sys.executable, "-c", "import nvidia.nvimgcodec"],
                          capture_output=True, text=True, timeout=120, env=child_env())
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"nvidia.nvimgcodec does not import ({last}): pip install nvidia-nvimgcodec-cu13"
    return None


def checked(ctx: Context, half: bool) -> dict[str, Any]:
    """``check``, row (c) left out (and why) where nvImageCodec cannot decode on the GPU."""
    why = nvimgcodec_problem() if ctx.device == "cuda" else None
    result = check(ctx, half, hardware=why is None)
    if why is not None:
        result["rows"].append(figure("feed", "(c) hardware decoders: skipped", why))
    return result


def all_cpus(ctx: Context) -> dict[str, Any]:
    """The ``feed`` check: the profile and the rows on every CPU."""
    return checked(ctx, half=False)


def half_cpus(ctx: Context) -> dict[str, Any]:
    """The ``feed_half`` check: the rows on the first half of the CPUs."""
    return checked(ctx, half=True)

