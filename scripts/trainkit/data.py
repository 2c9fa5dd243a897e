"""The trainer's data: staging into ``--data``, the train and val loaders, and the warning
when there is no val split to validate on.

The loaders' options are one record made from the flags (``loader_options``): the train
loader makes ``--image-size`` crops, or each epoch at its ``--res-schedule`` size (the
schedule is the loader's: its state records it, and a resume with another is refused). The
val loader's differ only in its transform, schedule (none) and batch-level draws (none: no
erasing, mixing or repeats): it center-crops ``--val-size`` (default ``--image-size``) from the
image resized so that the crop is ``--val-crop-ratio`` of its short side (0.875: 224 of 256,
as the usual ImageNet evaluation does; FFCV's recipe trains up to 192 and validates at 256),
or whose short side is ``--val-resize`` (torchvision's 232 for 224), and decodes with the same
backend. The
model runs channels_last (``train.set_up``), so both ask for channels_last batches
(``MEMORY_FORMAT``): the workers decode rows in that layout and no batch is transposed on the
CPU. Normalisation is not theirs:
the trainer normalises every split on the device with the run's one mean and std
(``trainkit.runconfig``). ``--synthetic`` feeds the model without a loader
(``synthetic_batches``): the compute ceiling that a fed run is compared with.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from imgprep import ManifestError, World, manifest_path, read_manifest
from loaders import (
    GPU_BACKENDS,
    ORDER_VERSION,
    DemandSizing,
    Loader,
    LoaderOptions,
    Mixup,
    RandomErasing,
    TrainTransform,
    ValTransform,
    make_loader,
    pins_cpus,
)

from .recipes import policy_for

logger = logging.getLogger("train_imagenet")
MEMORY_FORMAT = "channels_last"  # the model's layout (train.set_up), so the batches'


def stage(args: argparse.Namespace, world: World) -> None:
    """Copy --stage-from into --data, one copier per node (the others wait for it)."""
    from imgprep import StageOptions, stage_to_node

    stage_to_node(StageOptions(src=args.stage_from, dst=args.data, mode=args.stage_mode,
                               timeout=args.timeout, fanout=args.fanout), world)


def no_val_warning(data: Path, stage_from: Path | None) -> str:
    """Training goes on without validation; val is to be converted where the data comes
    from: --stage-from (staging copies every split it holds), else --data."""
    head = f"{data} has no val split (no val.json"
    fix = "training without validation; make one with imgprep convert ILSVRC2012_img_val.tar"
    if stage_from is None:
        return f"{head}): {fix} -o {data} --labels <ground truth>"
    return (f"{head}; it is staged from {stage_from}, which has none): {fix} -o {stage_from} "
            "--labels <ground truth>, and the next run stages it")


def pin_cpus(args: argparse.Namespace, device: torch.device) -> bool:
    """--pin-cpus: on, off, or (auto) the loaders' own default for --workers and the
    backend when training on CUDA (``loaders.pins_cpus``: with --workers auto, never for
    DALI's threads)."""
    mode = getattr(args, "pin_cpus", "auto")
    if mode != "auto":
        return bool(mode == "on")
    return device.type == "cuda" and pins_cpus(None, getattr(args, "workers", 0),
                                               args.loader_backend)


def loader_options(args: argparse.Namespace, device: torch.device, workers: int,
                   order_version: int = ORDER_VERSION) -> LoaderOptions:
    """The train loader's options from the flags: --batch-size (per rank), ``workers`` (the
    resolved --workers), --seed, --image-size or --res-schedule, --auto-augment (the policy
    drawn after crop and flip), --loader-backend and where it decodes (DALI or nvJPEG on the
    training GPU, else the CPU), --crop-decode, channels_last batches, epoch orders drawn by
    ``order_version`` (a resumed run's own), and the batch-level draws carried out on the
    device: --random-erase, --mixup / --cutmix (soft targets over the loader's classes, label
    smoothing folded in), and --ra-reps (repeated augmentation); where its processes run
    (--pin-cpus, --worker-nice) and how many decode (--worker-sizing)."""
    gpu = args.loader_backend in GPU_BACKENDS and device.type == "cuda"
    sizing = DemandSizing() if getattr(args, "worker_sizing", "fixed") == "demand" else None
    return LoaderOptions(batch_size=args.batch_size, workers=workers, seed=args.seed,
                         transform=TrainTransform(size=args.image_size,
                                                  augment=augment(args)),
                         size_schedule=args.res_schedule,
                         backend=args.loader_backend, device="gpu" if gpu else "cpu",
                         memory_format=MEMORY_FORMAT, order_version=order_version,
                         crop_decode=getattr(args, "crop_decode", None),
                         random_erase=random_erase(args), mixup=mixup(args),
                         repeats=args.ra_reps, pin_cpus=pin_cpus(args, device),
                         worker_nice=getattr(args, "worker_nice", None), sizing=sizing)


def augment(args: argparse.Namespace) -> Any:
    """--auto-augment's policy, as its source runs it (``recipes.policy_for``)."""
    return None if args.auto_augment is None else policy_for(args.auto_augment)


def random_erase(args: argparse.Namespace) -> RandomErasing | None:
    """--random-erase P (and its mode): timm's RandomErasing, one box an image."""
    if not args.random_erase:
        return None
    return RandomErasing(probability=args.random_erase, mode=args.random_erase_mode)


def mixup(args: argparse.Namespace) -> Mixup | None:
    """--mixup / --cutmix: timm's Mixup (every batch mixed; with both alphas, cutmix with
    --mixup-switch-prob), --label-smoothing folded into its targets."""
    if not (args.mixup or args.cutmix):
        return None
    return Mixup(mixup_alpha=args.mixup, cutmix_alpha=args.cutmix,
                 switch_prob=args.mixup_switch_prob, mode=args.mixup_mode,
                 label_smoothing=args.label_smoothing)


def refuse_unlabelled(data: Path) -> None:
    """Refuse --data whose train or val split was converted without labels, or which holds
    only the unlabelled test split, naming it and what to convert (the loaders refuse such a
    split too; this says it in the trainer's terms)."""
    if not data.is_dir():
        return
    for split in ("train", "val"):
        path = manifest_path(data, split)
        if path.is_file() and not read_manifest(path).labelled:
            raise ManifestError(f"--data {data}: its {split} split ({path.name}) was converted "
                                "without labels; the trainer cannot train or validate on it: "
                                f"convert the {split} split with its labels into {data}")
    if not manifest_path(data, "train").exists() and manifest_path(data, "test").is_file():
        raise ManifestError(f"--data {data} holds only the test split (test.json), which was "
                            "converted without labels: the trainer cannot train on it; "
                            f"convert the train split into it: imgprep convert "
                            f"ILSVRC2012_img_train.tar -o {data}")


def make_loaders(args: argparse.Namespace, world: World, options: LoaderOptions
                 ) -> tuple[Loader, Loader | None]:
    """The train loader with ``options`` (``loader_options``), and the val loader unless
    --no-validate or there is no val split."""
    refuse_unlabelled(args.data)
    train_loader = make_loader(args.data, "train", world, options)
    no_val = args.data.is_dir() and not manifest_path(args.data, "val").exists()
    if args.validate and no_val and world.rank == 0:
        logger.warning(no_val_warning(args.data, args.stage_from))
    if not args.validate or no_val:
        return train_loader, None
    resize = getattr(args, "val_resize", None)
    val = ValTransform(size=args.val_size, crop_ratio=None if resize else args.val_crop_ratio,
                       resize=resize)
    plain = replace(options, transform=val, size_schedule=None, random_erase=None,
                    mixup=None, repeats=1)
    return train_loader, make_loader(args.data, "val", world, plain)


def synthetic_batches(batch_size: int, image_size: int, num_classes: int,
                      device: torch.device, seed: int, count: int
                      ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` times one batch made once on ``device`` (``--synthetic``): standard-normal
    images, channels_last like the loaders' batches, and random labels. A step fed these
    waits for no loader, copy or normalisation: the compute ceiling."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(batch_size, 3, image_size, image_size, generator=gen)
    labels = torch.randint(num_classes, (batch_size,), generator=gen)
    images = images.to(device).contiguous(memory_format=torch.channels_last)
    labels = labels.to(device)
    for _ in range(count):
        yield images, labels
