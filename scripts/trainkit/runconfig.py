"""What defines a training run, recorded in every checkpoint and compared on ``--resume``.

A checkpoint holds ``RunConfig.record()`` under ``config``. Each field's metadata says how a
resume treats another value:

- ``same``: the model, the data and the optimisation (arch, its initialisation and BlurPool,
  image size and resolution schedule, classes, the train split's conversion fingerprint and
  size, ``--normalize``, seed, the optimizer, its weight-decay groups and learning-rate
  schedule, the loss, the augmentations and mixing, repeated augmentation, the model's
  average, precision). Another value is refused, naming the option and both values; a
  field a checkpoint's record lacks (written before the option existed) is not compared.
- ``elastic``: what the loaders' elastic resume serves (world size, batch size per rank,
  workers, decoder, all-reduce dtype, the data's folder): allowed, said in one line.
- ``stats``: the normalisation statistics themselves. They follow ``--normalize``; with
  ``train`` a resume keeps the checkpoint's values (the trainer says so when the train manifest
  now says other ones).

Every split is normalised with one set of statistics: the training split's, from its manifest
(``--normalize train``, the default), or constants the user chooses (``imagenet``, or explicit
``R,G,B/R,G,B``); never a split's own, so a validation score does not depend on the statistics
of the images it scores.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from imgprep import World, read_manifest

CONFIG_VERSION = 1
Stats = tuple[float, float, float]
IMAGENET: tuple[Stats, Stats] = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # 0..1 scale
NAMED = ("train", "imagenet")  # --normalize choices besides explicit values


def _opt(label: str, resume: str = "same") -> Any:
    """A field: ``label`` names it in messages (its option), ``resume`` is its rule."""
    return field(metadata={"label": label, "resume": resume})


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Every option that defines a run (model, data, optimisation) and the elastic ones."""

    arch: str = _opt("--arch")
    image_size: int = _opt("--image-size")
    res_schedule: str | None = _opt("--res-schedule")  # its one spelling (str(SizeSchedule))
    sync_bn: bool = _opt("--sync-bn")
    zero_init_residual: bool = _opt("--zero-init-residual")
    blurpool: bool = _opt("--blurpool")
    num_classes: int = _opt("--data (classes)")
    data_fingerprint: str | None = _opt("--data (the train split's conversion fingerprint)")
    train_samples: int = _opt("--data (train samples)")
    normalize: str = _opt("--normalize")
    mean: Stats = _opt("normalisation mean", "stats")
    std: Stats = _opt("normalisation std", "stats")
    seed: int = _opt("--seed")
    lr: float = _opt("--lr")
    momentum: float = _opt("--momentum")
    weight_decay: float = _opt("--weight-decay")
    warmup_epochs: float = _opt("--warmup-epochs")
    schedule: str = _opt("--schedule")
    epochs: int = _opt("--epochs")
    label_smoothing: float = _opt("--label-smoothing")
    opt: str = _opt("--opt")
    lr_scaling: str = _opt("--lr-scaling")
    norm_weight_decay: float | None = _opt("--norm-weight-decay")
    bias_weight_decay: float | None = _opt("--bias-weight-decay")
    bce: bool = _opt("--bce")
    bce_target_thresh: float | None = _opt("--bce-target-thresh")
    auto_augment: str | None = _opt("--auto-augment")
    random_erase: float = _opt("--random-erase")
    random_erase_mode: str = _opt("--random-erase-mode")
    mixup: float = _opt("--mixup")
    cutmix: float = _opt("--cutmix")
    mixup_switch_prob: float = _opt("--mixup-switch-prob")
    mixup_mode: str = _opt("--mixup-mode")
    ra_reps: int = _opt("--ra-reps")
    model_ema: bool = _opt("--model-ema")
    model_ema_decay: float = _opt("--model-ema-decay")
    model_ema_steps: int = _opt("--model-ema-steps")
    bf16: bool = _opt("--bf16 (bf16 autocast)")
    world_size: int = _opt("world size", "elastic")
    batch_size: int = _opt("--batch-size", "elastic")
    workers: int = _opt("--workers", "elastic")
    loader_backend: str = _opt("--loader-backend", "elastic")
    allreduce_dtype: str = _opt("--allreduce-dtype", "elastic")
    data: str = _opt("--data (folder)", "elastic")

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        check_stats(self.mean, self.std, f"--normalize {self.normalize}")
        if self.world_size < 1 or self.batch_size < 1 or self.workers < 0:
            raise ValueError(f"world size {self.world_size}, batch size {self.batch_size} "
                             f"and workers {self.workers}: need >= 1, >= 1 and >= 0")

    def record(self) -> dict[str, Any]:
        """The checkpoint's ``config``: plain values (lists, not tuples) and its version."""
        plain = {f.name: getattr(self, f.name) for f in fields(self)}
        return {"version": CONFIG_VERSION,
                **{k: list(v) if isinstance(v, tuple) else v for k, v in plain.items()}}


def check_stats(mean: tuple[float, ...], std: tuple[float, ...], where: str) -> None:
    """Three finite means and three finite stds > 0, on the 0..1 scale."""
    values = (*mean, *std)
    if len(mean) != 3 or len(std) != 3 or not all(math.isfinite(v) for v in values) \
            or not all(s > 0 for s in std):
        raise ValueError(f"{where}: need three means and three stds > 0 on the 0..1 scale, "
                         f"got mean {list(mean)} std {list(std)}")


def parse_stats(text: str) -> tuple[Stats, Stats]:
    """``R,G,B/R,G,B`` (mean/std on the 0..1 scale) as two triples; ValueError says why."""
    mean_text, sep, std_text = text.partition("/")
    try:
        mean = tuple(float(v) for v in mean_text.split(","))
        std = tuple(float(v) for v in std_text.split(",")) if sep else ()
    except ValueError:
        mean = std = ()
    check_stats(mean, std, f"--normalize {text!r}")
    return mean, std  # type: ignore[return-value]  # three each, checked


def normalize_arg(text: str) -> str:
    """``--normalize``: ``train``, ``imagenet`` or ``R,G,B/R,G,B``, in one spelling (the one a
    checkpoint records and a resume compares)."""
    if text in NAMED:
        return text
    try:
        mean, std = parse_stats(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected train, imagenet or R,G,B/R,G,B "
                                         f"(e.g. 0.5,0.5,0.5/0.25,0.25,0.25): {e}") from e
    return "/".join(",".join(repr(v) for v in triple) for triple in (mean, std))


def stats_for(normalize: str, train_mean: list[float],
              train_std: list[float]) -> tuple[Stats, Stats]:
    """The mean and std every split is normalised with, for a ``--normalize`` value."""
    if normalize == "train":
        return tuple(train_mean), tuple(train_std)  # type: ignore[return-value]
    if normalize == "imagenet":
        return IMAGENET
    return parse_stats(normalize)


# the fields that are the option of the same name as given (after --recipe)
AS_GIVEN = frozenset(f.name for f in fields(RunConfig)) - {
    "res_schedule", "num_classes", "data_fingerprint", "train_samples", "mean", "std", "bf16",
    "world_size", "workers", "data"}


def run_config(args: argparse.Namespace, world: World, *, workers: int,
               bf16: bool) -> RunConfig:
    """The run's config from its options, this World and the train split's manifest in
    ``args.data`` (read after staging; a node-local one counts the whole set's samples)."""
    m = read_manifest(args.data, "train")
    mean, std = stats_for(args.normalize, m.mean, m.std)
    same = {f.name: getattr(args, f.name) for f in fields(RunConfig) if f.name in AS_GIVEN}
    return RunConfig(
        **same, res_schedule=None if args.res_schedule is None else str(args.res_schedule),
        num_classes=len(m.classes), data_fingerprint=m.options.fingerprint,
        train_samples=m.node.total_samples if m.node is not None else m.total_samples,
        mean=mean, std=std, bf16=bf16, world_size=world.world_size, workers=workers,
        data=str(args.data))


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str) and len(value) == 64:  # a sha256 fingerprint
        return value[:16] + "…"
    return "none" if value is None else str(value)


def differences(saved: Mapping[str, Any], now: RunConfig) -> tuple[list[str], list[str]]:
    """What differs between a checkpoint's ``config`` and this run's, as ``label was X, now
    Y``: the refused (``same``) ones and the allowed (``elastic``) ones. A field the record
    lacks, or a fingerprint either side lacks, is not compared."""
    refused: list[str] = []
    allowed: list[str] = []
    for f in fields(now):
        rule = f.metadata["resume"]
        if rule == "stats" or f.name not in saved:
            continue
        old, new = saved[f.name], getattr(now, f.name)
        if old == new or (f.name == "data_fingerprint" and None in (old, new)):
            continue
        line = f"{f.metadata['label']} was {_show(old)}, now {_show(new)}"
        (refused if rule == "same" else allowed).append(line)
    return refused, allowed
