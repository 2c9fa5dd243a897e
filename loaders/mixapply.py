"""A batch's draws (``loaders.mixing.BatchDraws``) carried out on its normalised images, on
their device: random erasing, then mixup or cutmix, and the soft targets.

- Erasing: each row's rectangles in turn (row by row, rectangle by rectangle), filled with
  zeros (``"const"``), one standard normal value per channel (``"rand"``) or one per pixel
  and channel (``"pixel"``). The noise comes from a ``torch.Generator`` on the images'
  device seeded with the batch's ``noise_seed``, drawn in float32 in that order (one call
  for the whole batch): the same on every run on one kind of device, but not the same
  numbers on the CPU and on CUDA (their generators differ), and rounded to the images'
  dtype.
- Mixing: every row takes ``lam * itself + (1 - lam) * its partner`` (a blend row, computed
  as ``torch.lerp``: the same up to rounding) or its partner's pixels inside its box (a
  cutmix row), both from the images as they were before mixing; a row not mixed (lam 1, its
  own partner: padding among them) keeps its values exactly. The work: a gather of the
  partners, one fused pass for the blends and a copy of each box; for the one box of a
  batch-mode cutmix, a copy of the box alone.
- Targets (with mixup): float32, rows x classes, timm's ``mixup_target``: each real row's
  one-hot label smoothed (off = smoothing / classes, on = 1 - smoothing + off), then
  ``lam * own + (1 - lam) * partner's``; a padding row's targets are zeros (it adds nothing
  to a soft-target cross entropy), every real row's sum to 1.
"""

from __future__ import annotations

import numpy as np
import torch

from loaders.batch import PAD_LABEL
from loaders.mixing import BatchDraws


def apply_draws(images: torch.Tensor, labels: torch.Tensor, draws: BatchDraws
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``images`` (float NCHW, normalised; erased in place) erased and mixed as ``draws``
    say, with the labels, or with mixing the soft targets."""
    n, _, h, w = images.shape
    if (draws.rows, draws.height, draws.width) != (n, h, w):
        raise ValueError(f"the draws are for {draws.rows} rows of {draws.height} x "
                         f"{draws.width}, the batch has {n} of {h} x {w}: each batch's "
                         "draws travel with it (loaders.mixing)")
    if draws.erase_mode is not None:
        erase_(images, draws)
    if draws.mix_mode is None:
        return images, labels
    return mix(images, draws), soft_targets(labels, draws)


def erase_(images: torch.Tensor, draws: BatchDraws) -> None:
    """Fill each row's rectangles as ``draws.erase_mode`` says, in place."""
    rects = [(r, *(int(v) for v in draws.rects[r, k]))
             for r in range(draws.rows) for k in range(int(draws.counts[r]))]
    if not rects:
        return
    c = images.shape[1]
    if draws.erase_mode == "const":
        for r, top, left, h, w in rects:
            images[r, :, top:top + h, left:left + w] = 0
        return
    gen = torch.Generator(device=images.device)
    gen.manual_seed(draws.noise_seed)
    sizes = [c if draws.erase_mode == "rand" else c * h * w for _, _, _, h, w in rects]
    noise = torch.randn(sum(sizes), generator=gen, device=images.device, dtype=torch.float32)
    at = 0
    for (r, top, left, h, w), size in zip(rects, sizes, strict=True):
        value = noise[at:at + size]
        at += size
        shape = (c, 1, 1) if draws.erase_mode == "rand" else (c, h, w)
        images[r, :, top:top + h, left:left + w] = value.view(shape)


def mix(images: torch.Tensor, draws: BatchDraws) -> torch.Tensor:
    """The images mixed with their partners, in place."""
    mixed = draws.lam != 1.0
    if not mixed.any():
        return images
    cut, blend = mixed & draws.cut, mixed & ~draws.cut
    dev = images.device
    if not blend.any() and (draws.box[cut] == draws.box[cut][0]).all():  # one box
        top, bottom, left, right = (int(v) for v in draws.box[cut][0])
        region = images[:, :, top:bottom, left:right]
        theirs = region[_to(draws.partner[cut].astype(np.int64), dev)]  # a copy, first
        region.index_copy_(0, _to(np.flatnonzero(cut), dev), theirs)
        return images
    theirs = images[_to(draws.partner.astype(np.int64), dev)]  # keeps the memory format
    if blend.any():  # lerp gives its start exactly at weight 0: rows not blended stay
        weight = np.where(blend, 1.0 - draws.lam, 0.0)
        images.lerp_(theirs, _to(weight, dev, images.dtype).view(-1, 1, 1, 1))
    for r in np.flatnonzero(cut).tolist():
        top, bottom, left, right = (int(v) for v in draws.box[r])
        images[r, :, top:bottom, left:right] = theirs[r, :, top:bottom, left:right]
    return images


def soft_targets(labels: torch.Tensor, draws: BatchDraws) -> torch.Tensor:
    """timm's ``mixup_target`` with each row's partner (module docstring): float32, rows x
    ``draws.num_classes``; padding rows zero."""
    k, s = draws.num_classes, draws.label_smoothing
    off = s / k
    on = 1.0 - s + off
    dev = labels.device
    real = labels != PAD_LABEL
    one = torch.full((len(labels), k), off, dtype=torch.float32, device=dev)
    one.scatter_(1, labels.clamp(min=0).view(-1, 1), on)
    one.mul_(real.view(-1, 1))
    partner = _to(draws.partner.astype(np.int64), dev)
    own, theirs = (_to(v, dev, torch.float32).view(-1, 1) for v in (draws.lam, 1.0 - draws.lam))
    return one.mul(own).add_(one.index_select(0, partner).mul_(theirs))


def _to(values: np.ndarray, device: torch.device, dtype: torch.dtype | None = None
        ) -> torch.Tensor:
    """A small host array on ``device`` (as ``dtype``); to CUDA from pinned memory, so the
    copy is queued on the current stream without waiting for it."""
    t = torch.from_numpy(np.ascontiguousarray(values))
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, dtype, non_blocking=True)
