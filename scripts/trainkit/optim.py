"""The optimizer, its weight-decay groups, and the learning rate at each step.

Weight decay by parameter group:

- by default (neither ``--norm-weight-decay`` nor ``--bias-weight-decay``): ``--weight-decay``
  on conv and linear weights, none on norm parameters and biases (``models.param_groups``:
  Goyal et al.'s rule, and timm's ``filter_bias_and_bn``, which the ResNet-strikes-back
  recipes use);
- with either: torchvision's ``utils.set_weight_decay``: a parameter named ``bias`` takes
  ``--bias-weight-decay`` (when given), every other parameter of a norm layer (batch, group,
  layer, instance norm, local response norm) ``--norm-weight-decay`` (when given), and the
  rest, biases of other layers included where ``--bias-weight-decay`` is not given,
  ``--weight-decay``. Groups in torchvision's order (other, norm, bias), empty ones left out.

Optimizers (``--opt``): SGD with ``--momentum`` (no Nesterov), or LAMB (``trainkit.lamb``:
timm's semantics, its ``betas``, ``eps`` and gradient clipping defaults).

The learning rate: ``--lr`` is per 256 images, scaled to the run's global batch B (all ranks)
linearly (``--lr-scaling linear``: ``lr * B / 256``, Goyal et al.; torchvision's and FFCV's
rule for another GPU count) or by its square root (``sqrt``: ``lr * sqrt(B / 256)``, timm's
rule for LAMB and Adam). Then a linear warm-up from 0 over ``--warmup-epochs`` and a decay:
``step`` (x0.1 at 1/3, 2/3 and 8/9 of ``--epochs``), ``cosine`` (to 0 at the end) or
``linear`` (straight to 0 at the end: with the warm-up, FFCV's triangular "cyclic"
schedule). Where the schedule stands is the images trained on (all ranks), each step's own:
a resume on another global batch goes on from there.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
from torch import nn

from imgprep import World

from .lamb import Lamb
from .models import param_groups

OPTIMIZERS = ("sgd", "lamb")
LR_SCALINGS = ("linear", "sqrt")
SCHEDULES = ("step", "cosine", "linear")
NORM_LAYERS = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm,
               nn.modules.instancenorm._InstanceNorm, nn.LocalResponseNorm)


def weight_decay_groups(model: nn.Module, weight_decay: float,
                        norm_weight_decay: float | None = None,
                        bias_weight_decay: float | None = None) -> list[dict[str, Any]]:
    """The optimizer's parameter groups (module docstring)."""
    if norm_weight_decay is None and bias_weight_decay is None:
        return param_groups(model, weight_decay)
    params: dict[str, list[nn.Parameter]] = {"other": [], "norm": [], "bias": []}
    decay = {"other": weight_decay, "norm": norm_weight_decay, "bias": bias_weight_decay}
    seen: set[int] = set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            if bias_weight_decay is not None and name == "bias":
                params["bias"].append(p)
            elif norm_weight_decay is not None and isinstance(module, NORM_LAYERS):
                params["norm"].append(p)
            else:
                params["other"].append(p)
    return [{"params": ps, "weight_decay": decay[key]} for key, ps in params.items() if ps]


def make_optimizer(args: argparse.Namespace, model: nn.Module) -> torch.optim.Optimizer:
    """``--opt`` over ``weight_decay_groups``; the learning rate is set every step."""
    groups = weight_decay_groups(model, args.weight_decay, args.norm_weight_decay,
                                 args.bias_weight_decay)
    if args.opt == "lamb":
        return Lamb(groups, lr=args.lr, weight_decay=args.weight_decay)
    return torch.optim.SGD(groups, lr=args.lr, momentum=args.momentum, nesterov=False)


def peak_lr(args: argparse.Namespace, world_size: int) -> float:
    """``--lr`` (per 256 images) scaled to the global batch by ``--lr-scaling``."""
    ratio = args.batch_size * world_size / 256
    return args.lr * (math.sqrt(ratio) if args.lr_scaling == "sqrt" else ratio)


def learning_rate(samples: int, steps_per_epoch: int, args: argparse.Namespace,
                  world: World) -> float:
    """The learning rate of the step after ``samples`` images (all ranks) were trained on
    (module docstring)."""
    global_batch = args.batch_size * world.world_size
    peak, per_epoch = peak_lr(args, world.world_size), max(steps_per_epoch, 1) * global_batch
    epoch = samples / per_epoch
    if epoch < args.warmup_epochs:
        return peak * (epoch + global_batch / per_epoch) / args.warmup_epochs
    if args.schedule == "step":
        return peak * 0.1 ** sum(epoch >= args.epochs * f for f in (1 / 3, 2 / 3, 8 / 9))
    done = min(1.0, (epoch - args.warmup_epochs) / max(args.epochs - args.warmup_epochs, 1e-9))
    if args.schedule == "cosine":
        return peak * 0.5 * (1 + math.cos(math.pi * done))
    return peak * (1 - done)
