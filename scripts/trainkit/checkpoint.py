"""The trainer's checkpoint file, and what a ``--resume`` from it may change.

A checkpoint is one ``torch.save`` dict, written atomically (a kill during the write leaves the
previous one loadable) and loaded with ``weights_only=True``: ``model``, ``optimizer``,
``step``, ``samples`` (images all ranks trained on), ``loader`` (the train loader's
``state_dict``), ``rng`` and ``config`` (``RunConfig.record()``). A resume of another model,
data or optimisation is refused; what the loaders' elastic resume serves is allowed and said
in one line. Checkpoints written before ``config`` was recorded hold ``arch`` alone: that is
what they are checked on. The loader state names the epoch order it ran (``order_version``;
absent: version 1): a resumed run makes its train loader with that order, so it goes on
exactly where it stopped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from imgprep import atomic_open
from loaders import ORDER_KEY

from . import TrainError
from .runconfig import RunConfig, differences


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Atomic: a kill during the write leaves the previous checkpoint loadable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path) as f:
        torch.save(state, f)


def load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError) as e:
        raise TrainError(f"cannot load checkpoint {path}: {e}; delete it or start without "
                         "--resume") from e
    return state


def order_version_of(path: Path) -> int:
    """The epoch order the checkpoint's train loader ran (1 where the state predates the
    key), read without loading its tensors (memory-mapped)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (OSError, RuntimeError, ValueError) as e:
        raise TrainError(f"cannot load checkpoint {path}: {e}; delete it or start without "
                         "--resume") from e
    loader = state.get("loader") if isinstance(state, Mapping) else None
    if not isinstance(loader, Mapping):
        raise TrainError(f"cannot resume from {path}: it holds no loader state; delete it or "
                         "start without --resume")
    return int(loader.get(ORDER_KEY, 1))


def _refuse(path: Path, refused: list[str]) -> TrainError:
    return TrainError(f"cannot resume from {path}: it was written by another run ("
                      f"{'; '.join(refused)}); resume with the options of the run that wrote "
                      "it, or start a new run in another --checkpoint folder")


def resume_config(state: Mapping[str, Any], now: RunConfig,
                  path: Path) -> tuple[RunConfig, list[str]]:
    """The config a resume from ``state`` (a checkpoint at ``path``) runs with, and the lines
    to say about it; raises TrainError naming every refused difference."""
    saved = state.get("config")
    if not isinstance(saved, Mapping):  # written before the config was recorded
        arch = state.get("arch")
        if arch is not None and arch != now.arch:
            raise _refuse(path, [f"--arch was {arch}, now {now.arch}"])
        return now, [f"{path} was written before checkpoints recorded their run config: "
                     "only --arch is checked, the other options are taken as given"]
    refused, allowed = differences(saved, now)
    if refused:
        raise _refuse(path, refused)
    notes = []
    if allowed:
        notes.append(f"resume: {'; '.join(allowed)}: allowed, the loaders go on from the "
                     "samples done and the learning-rate schedule from the samples trained "
                     "on (scaled to the global batch)")
    if now.normalize == "train" and "mean" in saved and "std" in saved:
        kept = replace(now, mean=tuple(saved["mean"]), std=tuple(saved["std"]))
        if (kept.mean, kept.std) != (now.mean, now.std):
            notes.append(f"normalize: the train statistics recorded in {path} (mean "
                         f"{list(kept.mean)}, std {list(kept.std)}), not those the train "
                         f"manifest now gives (mean {list(now.mean)}, std {list(now.std)})")
        now = kept
    return now, notes
