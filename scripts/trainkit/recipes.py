"""``--recipe``: published ImageNet recipes as presets of the trainer's flags.

A recipe sets every option its source sets (``Setting``: the flag, our value, the source's own
spelling of it, and a note where we differ); a flag given on the command line wins over the
preset. What the source does that no flag of ours does is listed too (``Gap``). The run
prints one table at its start (``table``): each option, the value this run trains with, the
source's value, and the note, which also says when a given flag overrode the preset and what
an option comes to at this run's world size.

Batch and learning rate follow each source's own rule for another GPU count: the batch is per
rank, as each source's is per GPU, so the global batch is the source's at its GPU count
(8 in all three) and scales with the ranks; the learning rate (``--lr``, per 256 images)
scales with the global batch linearly for torchvision (its README: scale the learning rate
with the GPUs and batch) and FFCV (its maintainers: Goyal et al.'s rule), and by the square
root for timm's LAMB recipe (timm's ``--lr-base`` rule for LAMB and Adam). At 8 ranks each
preset trains with the source's global batch and learning rate.

The sources:

- ``torchvision-v2``: torchvision's ResNet-50 ``IMAGENET1K_V2`` recipe ("How to Train
  State-Of-The-Art Models Using TorchVision's Latest Primitives"; references/classification,
  ``torchrun --nproc_per_node=8 train.py --model resnet50 --batch-size 128 --lr 0.5
  --lr-scheduler cosineannealinglr --lr-warmup-epochs 5 --lr-warmup-method linear
  --auto-augment ta_wide --epochs 600 --random-erase 0.1 --weight-decay 0.00002
  --norm-weight-decay 0.0 --label-smoothing 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0
  --train-crop-size 176 --model-ema --val-resize-size 232 --ra-sampler --ra-reps 4``, with
  train.py's defaults for the rest);
- ``ffcv-rn50``: FFCV's ImageNet example (libffcv/ffcv-imagenet), ``rn50_88_epochs.yaml`` and
  its ``train_imagenet.py``;
- ``rsb-a3``: "ResNet strikes back: An improved training procedure in timm" (Wightman,
  Touvron, Jégou, 2021), Table 1, procedure A3, as timm's ``train.py`` runs it.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

from loaders import SizeSchedule, augment_policy

from .ema import adjusted_decay
from .optim import peak_lr


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One option a recipe sets: ``flag``'s value, the source's spelling, where we differ."""

    flag: str
    value: Any
    source: str
    note: str = ""

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


@dataclass(frozen=True, kw_only=True)
class Gap:
    """Something the source does that no flag of ours does: what, the source's, ours, why."""

    what: str
    source: str
    here: str
    note: str


@dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str
    title: str
    settings: tuple[Setting, ...]
    gaps: tuple[Gap, ...] = ()


S = Setting
PRECISION = "bf16 autocast where the device computes it natively, else fp32"
TORCHVISION_V2 = Recipe(name="torchvision-v2", title="torchvision's ResNet-50 IMAGENET1K_V2 "
                        "recipe (references/classification/train.py, 8 GPUs)", settings=(
    S(flag="--arch", value="resnet50", source="--model resnet50"),
    S(flag="--zero-init-residual", value=False, source="off (torchvision's resnet50)"),
    S(flag="--epochs", value=600, source="600"),
    S(flag="--batch-size", value=128, source="128 a GPU, 8 GPUs: 1024"),
    S(flag="--lr", value=0.5 * 256 / 1024, source="0.5 at 1024 images",
      note="per 256 images"),
    S(flag="--lr-scaling", value="linear", source="linear (its README, for another GPU "
      "count)"),
    S(flag="--opt", value="sgd", source="sgd"),
    S(flag="--momentum", value=0.9, source="0.9"),
    S(flag="--weight-decay", value=2e-5, source="0.00002"),
    S(flag="--norm-weight-decay", value=0.0, source="0.0"),
    S(flag="--warmup-epochs", value=5.0, source="5, linear from 0.01 x lr",
      note="here from 0, set every step (torchvision: once an epoch)"),
    S(flag="--schedule", value="cosine", source="cosineannealinglr to 0",
      note="set every step (torchvision: once an epoch)"),
    S(flag="--label-smoothing", value=0.1, source="0.1"),
    S(flag="--mixup", value=0.2, source="--mixup-alpha 0.2"),
    S(flag="--cutmix", value=1.0, source="--cutmix-alpha 1.0"),
    S(flag="--mixup-switch-prob", value=0.5, source="mixup or cutmix, p 0.5 each"),
    S(flag="--mixup-mode", value="batch", source="one draw a batch",
      note="partners: the batch reversed (timm's); torchvision rolls it by one"),
    S(flag="--auto-augment", value="ta_wide", source="ta_wide (bilinear)"),
    S(flag="--random-erase", value=0.1, source="0.1"),
    S(flag="--random-erase-mode", value="const", source="value 0, after normalisation",
      note="timm's box draws (loaders.RandomErasing)"),
    S(flag="--ra-reps", value=4, source="--ra-sampler --ra-reps 4"),
    S(flag="--model-ema", value=True, source="--model-ema"),
    S(flag="--model-ema-steps", value=32, source="32"),
    S(flag="--model-ema-decay", value=0.99998, source="0.99998, adjusted"),
    S(flag="--image-size", value=176, source="--train-crop-size 176"),
    S(flag="--val-size", value=224, source="--val-crop-size 224"),
    S(flag="--val-resize", value=232, source="--val-resize-size 232"),
    S(flag="--normalize", value="imagenet", source="ImageNet mean and std"),
), gaps=(
    Gap(what="precision", source="fp32 (no --amp)", here="--bf16 auto",
        note=PRECISION + "; --bf16 off: fp32 as the source"),
))
FFCV_RN50 = Recipe(name="ffcv-rn50", title="FFCV's ResNet-50, 88 epochs (ffcv-imagenet "
                   "rn50_88_epochs.yaml, 8 GPUs)", settings=(
    S(flag="--arch", value="resnet50", source="resnet50 (torchvision's)"),
    S(flag="--zero-init-residual", value=False, source="off (torchvision's resnet50)"),
    S(flag="--blurpool", value=True, source="use_blurpool 1"),
    S(flag="--epochs", value=88, source="88"),
    S(flag="--batch-size", value=512, source="512 a GPU, 8 GPUs: 4096"),
    S(flag="--lr", value=1.7 * 256 / 4096, source="1.7 at 4096 images", note="per 256 images"),
    S(flag="--lr-scaling", value="linear", source="none (its maintainers: Goyal et al.'s, "
      "linear)"),
    S(flag="--opt", value="sgd", source="sgd"),
    S(flag="--momentum", value=0.9, source="0.9"),
    S(flag="--weight-decay", value=1e-4, source="0.0001"),
    S(flag="--norm-weight-decay", value=0.0, source="bn_wd 0: parameters named *bn*",
      note="FFCV decays the downsample BN (no 'bn' in its name); here every norm layer is 0"),
    S(flag="--warmup-epochs", value=2.0, source="lr_peak_epoch 2, from 1e-4 x lr",
      note="here from 0"),
    S(flag="--schedule", value="linear", source="cyclic: straight to 0 at epoch 88"),
    S(flag="--label-smoothing", value=0.1, source="0.1"),
    S(flag="--res-schedule", value=SizeSchedule.parse("160:192@65-76"),
      source="min_res 160, max_res 192, start_ramp 65, end_ramp 76"),
    S(flag="--val-size", value=256, source="validation resolution 256"),
    S(flag="--val-crop-ratio", value=0.875, source="DEFAULT_CROP_RATIO 224/256"),
    S(flag="--val-flip", value=True, source="lr_tta: the mirror's logits added"),
    S(flag="--normalize", value="imagenet", source="ImageNet mean and std"),
), gaps=(
    Gap(what="precision", source="fp16 autocast, GradScaler", here="--bf16 auto",
        note=PRECISION),
    Gap(what="train crop resize", source="OpenCV, INTER_AREA", here="bilinear",
        note="Pillow's filter, antialiased"),
))
RSB_A3 = Recipe(name="rsb-a3", title="ResNet strikes back, procedure A3 (Table 1; timm's "
                "train.py)", settings=(
    S(flag="--arch", value="resnet50", source="resnet50 (timm's)"),
    S(flag="--zero-init-residual", value=True, source="on (timm's zero_init_last)"),
    S(flag="--epochs", value=100, source="100"),
    S(flag="--batch-size", value=256, source="2048", note="per rank: 2048 at 8 ranks"),
    S(flag="--opt", value="lamb", source="LAMB"),
    S(flag="--lr", value=8e-3 / math.sqrt(2048 / 256), source="8e-3 at 2048 images",
      note="per 256 images"),
    S(flag="--lr-scaling", value="sqrt", source="sqrt (timm's --lr-base rule for LAMB)"),
    S(flag="--weight-decay", value=0.02, source="0.02, none on norm and bias"),
    S(flag="--warmup-epochs", value=5.0, source="5, from --warmup-lr",
      note="here from 0, set every step (timm: once an epoch)"),
    S(flag="--schedule", value="cosine", source="cosine over all 100 epochs",
      note="here over the 95 after the warm-up, set every step"),
    S(flag="--label-smoothing", value=0.0, source="none"),
    S(flag="--bce", value=True, source="BCE loss"),
    S(flag="--bce-target-thresh", value=0.2, source="0.2 (timm's A commands)"),
    S(flag="--mixup", value=0.1, source="0.1"),
    S(flag="--cutmix", value=1.0, source="1.0"),
    S(flag="--mixup-switch-prob", value=0.5, source="0.5 (timm's default)"),
    S(flag="--mixup-mode", value="batch", source="batch (timm's default)"),
    S(flag="--auto-augment", value="rand-m6-mstd0.5-inc1", source="RandAugment 6 / 0.5"),
    S(flag="--random-erase", value=0.0, source="none"),
    S(flag="--ra-reps", value=1, source="none (A3 has no repeated augmentation)"),
    S(flag="--model-ema", value=False, source="none"),
    S(flag="--image-size", value=160, source="160"),
    S(flag="--val-size", value=224, source="224"),
    S(flag="--val-resize", value=235, source="crop ratio 0.95: floor(224 / 0.95)"),
    S(flag="--normalize", value="imagenet", source="ImageNet mean and std"),
), gaps=(
    Gap(what="precision", source="AMP (fp16)", here="--bf16 auto", note=PRECISION),
    Gap(what="train crop resize", source="bilinear or bicubic, drawn per image",
        here="bilinear", note="the loader's train crops are bilinear"),
    Gap(what="val resize", source="bicubic (timm's resnet50)", here="bilinear",
        note="the loader's val resize is bilinear"),
))
RECIPES: dict[str, Recipe] = {r.name: r for r in (TORCHVISION_V2, FFCV_RN50, RSB_A3)}


def policy_for(name: str) -> Any:
    """``loaders.augment_policy(name)`` as the name's source runs it: torchvision's policies
    with the train crop's resampling (its reference passes ``--interpolation``, bilinear, to
    them), timm's ``rand-`` strings with timm's own fill and resampling (``create_transform``'s)."""
    if name.startswith("rand"):
        return augment_policy(name)
    return augment_policy(name, interpolation="bilinear")


# an option a recipe sets that another flag, when given, replaces: the schedule gives way to a
# size given, one way of sizing the validation resize to the other
GIVES_WAY = {"res_schedule": "image_size", "val_resize": "val_crop_ratio",
             "val_crop_ratio": "val_resize"}


def overridden(dest: str, given: set[str]) -> str | None:
    """The flag given on the command line that sets (or replaces) option ``dest``."""
    if dest in given:
        return dest
    other = GIVES_WAY.get(dest)
    return other if other in given else None


def apply(name: str, args: argparse.Namespace, given: set[str]) -> None:
    """Set every option of recipe ``name`` that no flag ``given`` on the command line sets or
    replaces."""
    for s in RECIPES[name].settings:
        if overridden(s.dest, given) is None:
            setattr(args, s.dest, s.value)


def show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:.6g}"
    return "none" if value is None else str(value)


def _here(s: Setting, args: argparse.Namespace, world_size: int) -> str:
    """What an option comes to at this world size."""
    images = args.batch_size * world_size
    if s.dest == "batch_size":
        return f"{world_size} x {args.batch_size} = {images} images a step here"
    if s.dest == "lr":
        return (f"peak {peak_lr(args, world_size):.6g} here ({args.lr_scaling} scaling to "
                f"{images} images)")
    if s.dest == "model_ema_decay" and args.model_ema:
        decay = adjusted_decay(args.model_ema_decay, world_size=world_size,
                               batch_size=args.batch_size, steps=args.model_ema_steps,
                               epochs=args.epochs)
        return (f"{decay:.6f} here (torchvision's adjustment: {world_size} x "
                f"{args.batch_size} images x {args.model_ema_steps} steps / {args.epochs} "
                "epochs)")
    return ""


def rows(args: argparse.Namespace, world_size: int) -> list[dict[str, str]]:
    """The table's rows: option, this run's value, the source's, the note."""
    recipe = RECIPES[args.recipe]
    out = []
    for s in recipe.settings:
        value = getattr(args, s.dest)
        notes = [s.note, _here(s, args, world_size)]
        by = overridden(s.dest, args.explicit)
        if by is not None and value != s.value:
            flag = "" if by == s.dest else f" --{by.replace('_', '-')}"
            notes.insert(0, f"given{flag}: the recipe's is {show(s.value)}")
        out.append({"option": s.flag, "value": show(value), "source": s.source,
                    "note": "; ".join(n for n in notes if n)})
    out += [{"option": g.what, "value": g.here, "source": g.source,
             "note": f"differs: {g.note}"} for g in recipe.gaps]
    return out


def table(args: argparse.Namespace, world_size: int) -> str:
    """The table printed at the run's start."""
    head = {"option": "option", "value": "this run", "source": "source", "note": "note"}
    body = rows(args, world_size)
    width = {k: max(len(r[k]) for r in [head, *body]) for k in ("option", "value", "source")}
    lines = [f"recipe {args.recipe}: {RECIPES[args.recipe].title}"]
    for r in [head, *body]:
        cells = [r[k].ljust(width[k]) for k in ("option", "value", "source")]
        lines.append(("  ".join([*cells, r["note"]])).rstrip())
    return "\n".join(lines)
