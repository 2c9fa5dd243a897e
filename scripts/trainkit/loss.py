"""The training loss: cross-entropy (the default) or binary cross-entropy (``--bce``), on
class labels or on soft targets.

Targets come as class indices (a batch's labels; ``--synthetic``) or, with ``--mixup`` /
``--cutmix``, as soft targets: float (batch, classes) rows from the loader's mixing, label
smoothing already folded in (``loaders.Mixup.label_smoothing``, as timm's ``Mixup`` does). So
smoothing is applied here to class indices only:

- cross-entropy: ``F.cross_entropy(logits, labels, label_smoothing=s)``; soft targets:
  ``-sum(t * log_softmax(logits))`` averaged over the batch (timm's
  ``SoftTargetCrossEntropy``; torchvision's ``CrossEntropyLoss`` on its mixed targets, which
  folds its smoothing in the same way: ``(1 - s) t + s / classes``);
- ``--bce``: timm's ``BinaryCrossEntropy``: class indices become dense targets, ``s / classes``
  off and ``1 - s + s / classes`` on; with ``--bce-target-thresh T`` every target above T
  becomes 1 and the others 0 (an image mixed from two classes counts as both); then
  ``binary_cross_entropy_with_logits`` averaged over every element.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True, kw_only=True)
class Loss:
    """The training loss of a run (module docstring)."""

    smoothing: float = 0.0
    bce: bool = False
    target_threshold: float | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.smoothing < 1:
            raise ValueError(f"--label-smoothing {self.smoothing} must be in [0, 1)")
        if self.target_threshold is not None and not self.bce:
            raise ValueError("--bce-target-thresh goes with --bce")

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        soft = targets.is_floating_point()
        if not self.bce:
            if soft:
                return torch.sum(-targets * F.log_softmax(logits, dim=-1), dim=-1).mean()
            return F.cross_entropy(logits, targets, label_smoothing=self.smoothing)
        if not soft:
            off = self.smoothing / logits.shape[-1]
            dense = torch.full_like(logits, off)
            targets = dense.scatter_(1, targets.long().view(-1, 1), 1.0 - self.smoothing + off)
        if self.target_threshold is not None:
            targets = targets.gt(self.target_threshold).to(logits.dtype)
        return F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype))
