"""Automatic augmentation policies: which ops each training sample gets, drawn in Python from
the sample's generator, carried out in C (``imgprep.augment``) by every decode path.

A policy is a frozen record with ``draw(size, rng) -> tuple[Op, ...]``: the ops of one
``size`` x ``size`` crop, in order, as ``imgprep.augment.Op`` records (kind, arguments,
resample, fill). ``TrainTransform(augment=policy)`` draws them after the crop box and the
flip, from the same generator (``loaders.transforms``); ``loaders.decode`` carries them out
after the resample and flip, on every decode path. Each policy's ``steps(size, rng)`` gives
the same draws as the published code names them (``loaders.augment_step.Step``), which is
what the tests hold to the published definitions.

The policies, and where each is defined (read from the published source, written anew):

- ``"ta_wide"``: torchvision 0.20.1 ``TrivialAugmentWide`` (``loaders.augment_torchvision``);
- ``"ra"``, ``"ra-n2-m9"`` (any ``ra-nN-mM``): torchvision 0.20.1 ``RandAugment(num_ops=N,
  magnitude=M)``, 31 bins;
- ``"aa-imagenet"``: torchvision 0.20.1 ``AutoAugment(AutoAugmentPolicy.IMAGENET)``;
- any ``"rand-..."`` string: timm v1.0.28 ``rand_augment_transform`` with the hparams timm's
  ``create_transform`` passes (``loaders.augment_timm``).

``AUGMENT_VERSION`` names these draws and the ops' pixels together: a loader that augments
records it in its pixel version (``loaders.decode.pixel_version``); change it with either.
"""

from __future__ import annotations

import re
from typing import Protocol

import numpy as np

from imgprep.augment import Op
from loaders.augment_step import Step
from loaders.augment_timm import TIMM_FILL, RandAugmentTimm
from loaders.augment_torchvision import AutoAugmentImageNet, RandAugment, TrivialAugmentWide

AUGMENT_VERSION = "augment-1"
POLICIES = ("ta_wide", "ra", "ra-n2-m9", "aa-imagenet", "rand-m9-mstd0.5-inc1")
POLICY_TYPES = (TrivialAugmentWide, RandAugment, AutoAugmentImageNet, RandAugmentTimm)


class Policy(Protocol):
    """What ``TrainTransform(augment=...)`` takes: a name and the draw of one sample's ops."""

    @property
    def name(self) -> str: ...

    def steps(self, size: int, rng: np.random.Generator) -> tuple[Step, ...]: ...

    def draw(self, size: int, rng: np.random.Generator) -> tuple[Op, ...]: ...


_RA = re.compile(r"ra(?:-n(\d+))?(?:-m(\d+))?")


def policy(name: str, *, fill: tuple[int, int, int] | None = None,
           interpolation: str | None = None) -> Policy:
    """The policy ``name`` names (``POLICIES``, ``ra-nN-mM``, or any timm ``rand-...``
    string), with the fill colour and resample of its geometric ops; None: the policy's own
    (torchvision's ``(0, 0, 0)`` and ``"nearest"``; timm's ImageNet mean ``(124, 116,
    104)`` and bilinear or bicubic drawn per op). A ``ValueError`` names what is wrong."""
    if name.startswith("rand"):
        return RandAugmentTimm(config=name, fill=TIMM_FILL if fill is None else fill,
                               interpolation=interpolation)
    fill, interpolation = fill or (0, 0, 0), interpolation or "nearest"
    if name == "ta_wide":
        return TrivialAugmentWide(fill=fill, interpolation=interpolation)
    if name == "aa-imagenet":
        return AutoAugmentImageNet(fill=fill, interpolation=interpolation)
    if match := _RA.fullmatch(name):
        n, m = match.groups()
        return RandAugment(num_ops=int(n or 2), magnitude=int(m or 9), fill=fill,
                           interpolation=interpolation)
    raise ValueError(f"unknown augmentation policy {name!r}: one of {', '.join(POLICIES)}, "
                     "ra-nN-mM, or a timm rand-... string (rand-m9-mstd0.5-inc1)")


def check_policy(augment: object) -> None:
    """Refuse what is not a policy of this module (a programming error: ValueError)."""
    if augment is not None and not isinstance(augment, POLICY_TYPES):
        raise ValueError(f"augment must be a policy (loaders.augment.policy(name)) or None, "
                         f"not {augment!r}")


__all__ = ["AUGMENT_VERSION", "POLICIES", "POLICY_TYPES", "AutoAugmentImageNet", "Policy",
           "RandAugment", "RandAugmentTimm", "Step", "TrivialAugmentWide", "check_policy",
           "policy"]
