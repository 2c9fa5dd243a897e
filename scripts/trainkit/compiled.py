"""``--compile``: torch.compile of the training step's model, when it is on, and how the sizes
of a resolution schedule compile.

- ``auto`` (the default) compiles on CUDA and runs eager on the CPU; ``on`` (or a bare
  ``--compile``) and ``off`` decide it. On the CPU, inductor builds C++ kernels with the
  system's compiler (gcc), so compiling works there too; it costs tens of seconds a size
  before it saves anything (docs/trainer.md, "torch.compile").
- Recompilation policy: static shapes (``dynamic=False``, no ``mark_dynamic``): each input
  shape gets its own graph, specialised to it, which is what inductor's fused kernels and
  CUDA graphs want. A tail="drop" epoch has one batch shape, so a schedule of n sizes makes
  n graphs, each compiled once, in the first step of the first epoch at its size (that
  step, and its log interval, carry the compile time). Dynamo's recompile limit is raised
  to cover every size (``RECOMPILE_SPARE`` more for the odd shape), so no size falls back
  to eager. Validation runs the eager model: its eval mode and size would be graphs of
  their own for one pass.
- The compiled module wraps the model (and DDP around it when distributed, so DDP's
  bucketing splits the graph); checkpoints hold the model's own state, as without it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
import torch.nn as nn

MODES = ("auto", "on", "off")
RECOMPILE_SPARE = 2  # graphs beyond the schedule's sizes before dynamo would fall back


def wanted(mode: str, device: torch.device) -> bool:
    """Whether ``--compile mode`` compiles on ``device`` (auto: on CUDA only)."""
    if mode not in MODES:
        raise argparse.ArgumentTypeError(f"--compile: expected one of {MODES}, not {mode!r}")
    return mode == "on" or (mode == "auto" and device.type == "cuda")


def compile_model(net: nn.Module, sizes: Sequence[int]) -> nn.Module:
    """``net`` compiled with static shapes, the recompile limit covering ``sizes``."""
    import torch._dynamo.config as dynamo

    dynamo.recompile_limit = max(dynamo.recompile_limit, len(sizes) + RECOMPILE_SPARE)
    compiled: nn.Module = torch.compile(net, dynamic=False)  # type: ignore[assignment]
    return compiled


def line(mode: str, on: bool, device: torch.device, sizes: Sequence[int]) -> str:
    """The line the trainer says at start about compiling."""
    px = ", ".join(str(s) for s in sizes)
    if on:
        import torch._dynamo.config as dynamo

        return (f"compile: on (--compile {mode}; torch.compile, static shapes: one graph per "
                f"size, {px} px, each compiled in its first step; recompile limit "
                f"{max(dynamo.recompile_limit, len(sizes) + RECOMPILE_SPARE)})")
    why = "eager on the CPU; --compile on compiles here too" if mode == "auto" else "eager"
    return f"compile: off (--compile {mode}: {why}; {device.type})"
