"""The trainer's command line: every flag, its checks, and ``--recipe``'s presets applied.

A flag given on the command line always wins over a preset: ``parse_args`` tells the flags
given from the defaults (``explicit``), sets every other option the recipe names to the
recipe's value (``trainkit.recipes``), and keeps what it did on the namespace
(``args.explicit``) for the table the run prints at its start (``recipes.table``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from loaders import BACKENDS, SizeSchedule

from . import compiled, distributed, recipes
from .optim import LR_SCALINGS, OPTIMIZERS, SCHEDULES
from .precision import MODES
from .runconfig import normalize_arg

ERASE_MODES = ("const", "rand", "pixel")
MIX_MODES = ("batch", "pair", "elem")
_UNSET = object()  # a namespace value argparse leaves alone: the flag was not given


def workers_arg(text: str) -> int | str:
    """``--workers``: ``auto`` or a count >= 0."""
    if text == "auto":
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected 'auto' or a count >= 0, got {text!r}")
    return int(text)


def schedule_arg(text: str) -> SizeSchedule:
    """``--res-schedule``: a size schedule (``loaders.SizeSchedule.parse``)."""
    try:
        return SizeSchedule.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def augment_arg(text: str) -> str | None:
    """``--auto-augment``: a policy name ``loaders.augment_policy`` knows, or ``none``."""
    if text == "none":
        return None
    try:
        recipes.policy_for(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    return text


def _data_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--data", type=Path, required=True, help="folder with train/val manifests")
    ap.add_argument("--stage-from", type=Path, default=None,
                    help="stage shards from this shared folder into --data first")
    ap.add_argument("--stage-mode", choices=["replicate", "partition"], default="replicate")
    ap.add_argument("--fanout", action="store_true",
                    help="with --stage-from and replicate: read the file server once in all, "
                         "nodes pass shards to each other")
    ap.add_argument("--workers", type=workers_arg, default="auto",
                    help="loader workers per rank (auto: this rank's cores less one); DALI "
                         "threads with --loader-backend dali, CPU-decode threads with nvjpeg")
    ap.add_argument("--pin-cpus", choices=("auto", "on", "off"), default="auto",
                    help="keep a core of this rank's share for the training process and pin "
                         "the loader's workers to the rest, at nice 10 (auto: with --workers "
                         "auto when training on CUDA)")
    ap.add_argument("--worker-nice", type=int, default=None, metavar="N",
                    help="the loader's workers' nice value, 0-19 (default: 10 where they are "
                         "pinned, else 0)")
    ap.add_argument("--worker-sizing", choices=("fixed", "demand"), default="fixed",
                    help="demand: start --workers and keep as many active as the step's "
                         "demand needs (loaders.sizing; the pillow backend)")
    ap.add_argument("--loader-backend", choices=list(BACKENDS), default="pillow",
                    help="decode in CPU worker processes (default: imgprep's extension, "
                         "Pillow with --no-crop-decode), NVIDIA DALI "
                         "(pip install 'imgprep[dali]') or torchvision's nvJPEG; the last two "
                         "on the GPU when training on CUDA")
    ap.add_argument("--crop-decode", action=argparse.BooleanOptionalAction, default=None,
                    help="the pillow backend's extension path (imgprep's decode and "
                    "resampler); --no-crop-decode: Pillow's decode and resize (default: the "
                    "extension when it is built)")
    ap.add_argument("--normalize", type=normalize_arg, default="train", metavar="STATS",
                    help="mean/std for every split: train (the train manifest's, the default), "
                         "imagenet (0.485,0.456,0.406/0.229,0.224,0.225) or R,G,B/R,G,B")


def _size_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--image-size", type=int, default=224,
                    help="train crop, and the default --val-size")
    ap.add_argument("--res-schedule", type=schedule_arg, default=None, metavar="SCHEDULE",
                    help="train size by epoch, instead of --image-size: LOW:HIGH@START-END "
                         "(FFCV's ramp, multiples of 32 px; /STEP for another step: "
                         "160:192@11-13), EPOCH=SIZE,... (0=128,10=160,20=192) or SIZE")
    ap.add_argument("--val-size", type=int, default=None,
                    help="validation center crop (default: --image-size)")
    ap.add_argument("--val-crop-ratio", type=float, default=0.875,
                    help="the val crop over the resized short side (default 0.875: the short "
                         "side resized to --val-size / 0.875, 256 for 224)")
    ap.add_argument("--val-resize", type=int, default=None,
                    help="the short side's size before the val crop, instead of "
                         "--val-crop-ratio (torchvision's --val-resize-size: 232 for 224)")
    ap.add_argument("--val-flip", action=argparse.BooleanOptionalAction, default=False,
                    help="validate on the logits of each image plus its mirror's (FFCV's "
                         "lr_tta)")


def _model_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--arch", default="resnet50", help="resnet50, resnet18 or tiny")
    ap.add_argument("--zero-init-residual", action=argparse.BooleanOptionalAction,
                    default=True, help="start the last BN of every residual branch at "
                    "gamma 0 (Goyal et al.; timm's default; torchvision's is off)")
    ap.add_argument("--blurpool", action=argparse.BooleanOptionalAction, default=False,
                    help="blur before every strided conv of >= 16 channels (FFCV's BlurPool)")
    ap.add_argument("--sync-bn", action="store_true")
    ap.add_argument("--compile", nargs="?", choices=compiled.MODES, const="on", default="auto",
                    help="torch.compile the model: auto (on CUDA, eager on the CPU), on (also a "
                         "bare --compile) or off; static shapes, one graph per size")
    ap.add_argument("--bf16", nargs="?", choices=MODES, const="on", default="auto",
                    help="bf16 autocast for forward/backward: auto (where the device computes "
                         "bf16 natively: CUDA with bf16, CPUs with AMX or AVX-512 BF16), on "
                         "(also a bare --bf16) or off")
    ap.add_argument("--no-bf16", dest="bf16", action="store_const", const="off",
                    help="the same as --bf16 off")


def _optim_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--epochs", type=int, default=90)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--opt", choices=OPTIMIZERS, default="sgd",
                    help="SGD with momentum, or LAMB (timm's semantics)")
    ap.add_argument("--lr", type=float, default=0.1, help="per 256 images, scaled to the "
                    "global batch by --lr-scaling")
    ap.add_argument("--lr-scaling", choices=LR_SCALINGS, default="linear",
                    help="linear: lr x global/256 (Goyal et al.); sqrt: lr x sqrt(global/256) "
                         "(timm's rule for LAMB)")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--norm-weight-decay", type=float, default=None,
                    help="weight decay of norm layers' parameters (torchvision's groups; "
                         "default: none on norm parameters and biases)")
    ap.add_argument("--bias-weight-decay", type=float, default=None,
                    help="weight decay of parameters named bias (torchvision's groups)")
    ap.add_argument("--warmup-epochs", type=float, default=5.0)
    ap.add_argument("--schedule", choices=SCHEDULES, default="step",
                    help="after the warm-up: step (x0.1 at 1/3, 2/3, 8/9), cosine, or linear "
                         "to 0 (FFCV's triangular schedule)")
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--bce", action=argparse.BooleanOptionalAction, default=False,
                    help="binary cross-entropy on the (soft) targets (timm's, as ResNet "
                         "strikes back trains)")
    ap.add_argument("--bce-target-thresh", type=float, default=None,
                    help="with --bce: targets above this become 1, the others 0")
    ap.add_argument("--model-ema", action=argparse.BooleanOptionalAction, default=False,
                    help="keep, validate and checkpoint an exponential moving average of the "
                         "model (torchvision's)")
    ap.add_argument("--model-ema-steps", type=int, default=32,
                    help="update the average every this many steps of an epoch")
    ap.add_argument("--model-ema-decay", type=float, default=0.99998,
                    help="its decay, adjusted to world x batch x steps / epochs as torchvision "
                         "does")


def _augment_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--auto-augment", type=augment_arg, default=None, metavar="NAME",
                    help="a policy after crop and flip: ta_wide, ra, aa-imagenet, a timm "
                         "rand-... string (rand-m9-mstd0.5-inc1), or none")
    ap.add_argument("--random-erase", type=float, default=0.0, metavar="P",
                    help="erase a random box of each image with this probability, after "
                         "normalisation")
    ap.add_argument("--random-erase-mode", choices=ERASE_MODES, default="const",
                    help="what fills the box: 0 (const), per-channel (rand) or per-pixel "
                         "(pixel) normal noise")
    ap.add_argument("--mixup", type=float, default=0.0, metavar="ALPHA",
                    help="mixup's Beta(alpha, alpha) (0: off); soft targets")
    ap.add_argument("--cutmix", type=float, default=0.0, metavar="ALPHA",
                    help="cutmix's Beta(alpha, alpha) (0: off); soft targets")
    ap.add_argument("--mixup-switch-prob", type=float, default=0.5,
                    help="with both: the chance of cutmix instead of mixup")
    ap.add_argument("--mixup-mode", choices=MIX_MODES, default="batch",
                    help="one draw a batch, a pair of images, or an image (timm's modes)")
    ap.add_argument("--ra-reps", type=int, default=1, metavar="K",
                    help="repeated augmentation: each image K times an epoch, on different "
                         "ranks (1: off)")


def _run_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--recipe", choices=list(recipes.RECIPES), default=None,
                    help="set every option of a published recipe (a flag given overrides "
                         "it; the run prints what it set, beside the source's values)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: all)")
    ap.add_argument("--allreduce-dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: cores/ranks)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", type=Path, default=None, help="checkpoint folder")
    ap.add_argument("--checkpoint-every", type=int, default=0, help="steps (0: epoch ends)")
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    ap.add_argument("--validate", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--log-json", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=300.0, help="process-group timeout, s")
    ap.add_argument("--backend", choices=distributed.BACKENDS, default="auto",
                    help="process-group backend: auto (NCCL with CUDA, else Gloo; opened only "
                         "for more than one process), nccl or gloo (opened even for one "
                         "process: DDP's all-reduce then runs alone)")
    ap.add_argument("--deterministic", action="store_true",
                    help="deterministic cuDNN algorithms and cuBLAS workspace: a rerun on the "
                         "same GPU with the same seed gives the same losses")
    ap.add_argument("--synthetic", action="store_true",
                    help="train on one random batch made once on the device, no loader (the "
                         "compute ceiling); --data still gives the classes and the statistics")


def parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    for add in (_data_flags, _size_flags, _model_flags, _optim_flags, _augment_flags,
                _run_flags):
        add(ap)
    return ap


def explicit(ap: argparse.ArgumentParser, argv: Sequence[str] | None,
             dests: Sequence[str]) -> set[str]:
    """The options given on the command line: argparse sets a default only where the
    namespace lacks the attribute, so a namespace holding a marker everywhere keeps it
    exactly where no flag was given."""
    probe = argparse.Namespace(**{d: _UNSET for d in dests})
    ap.parse_args(argv, namespace=probe)
    return {d for d, v in vars(probe).items() if v is not _UNSET}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = parser("Train a ResNet data-parallel on imgprep shards, and show where each "
                "iteration's time goes.")
    args = ap.parse_args(argv)
    args.explicit = explicit(ap, argv, list(vars(args)))
    if args.recipe is not None:
        recipes.apply(args.recipe, args, args.explicit)
    check(ap, args)
    if args.val_size is None:
        args.val_size = args.image_size
    return args


def check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse values no run can take (argparse's error: exit 2, the usage and why)."""
    if args.fanout and args.stage_mode != "replicate":
        ap.error("--fanout goes with --stage-mode replicate")
    if not 0 < args.val_crop_ratio <= 1:
        ap.error(f"--val-crop-ratio must be in (0, 1], not {args.val_crop_ratio}")
    if args.val_resize is not None and "val_crop_ratio" in args.explicit:
        ap.error("give --val-resize or --val-crop-ratio, not both")
    for name in ("random_erase", "mixup_switch_prob"):
        if not 0 <= getattr(args, name) <= 1:
            ap.error(f"--{name.replace('_', '-')} must be in [0, 1]")
    if min(args.mixup, args.cutmix) < 0:
        ap.error("--mixup and --cutmix take alpha >= 0 (0: off)")
    if args.ra_reps < 1 or args.model_ema_steps < 1:
        ap.error("--ra-reps and --model-ema-steps must be >= 1")
    if not 0 <= args.model_ema_decay <= 1:
        ap.error(f"--model-ema-decay must be in [0, 1], not {args.model_ema_decay}")
    if args.bce_target_thresh is not None and not args.bce:
        ap.error("--bce-target-thresh goes with --bce")
    if not 0 <= args.label_smoothing < 1:
        ap.error(f"--label-smoothing must be in [0, 1), not {args.label_smoothing}")
