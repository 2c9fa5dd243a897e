"""The model's exponential moving average (``--model-ema``), as torchvision's reference
``references/classification/train.py`` keeps it.

- ``ExponentialMovingAverage``: torchvision's ``utils.ExponentialMovingAverage``, a
  ``torch.optim.swa_utils.AveragedModel`` over parameters and buffers (``use_buffers=True``:
  the BN statistics are averaged too) with ``avg = decay * avg + (1 - decay) * model``; the
  first update after ``n_averaged`` is 0 copies the model instead.
- ``adjusted_decay``: the decay it runs with. ``--model-ema-decay`` names it for one update per
  image of the whole run; torchvision rescales it so that the average spans the same share of
  the run whatever the world size, batch and update interval:
  ``alpha = min(1, (1 - decay) * world * batch * steps / epochs)``, decay ``1 - alpha``
  (0.99998 at 8 x 128 images, every 32 steps, 600 epochs: 0.998908).
- ``update``: every ``--model-ema-steps`` steps, at the batches of an epoch whose index is a
  multiple of it (0, 32, 64, ...: torchvision counts them per epoch), after the optimizer's
  step; during the learning-rate warm-up (epochs below ``--warmup-epochs``) ``n_averaged`` is
  set back to 0 after each update, so the average keeps copying the model until it ends.

The trainer validates the average beside the model, and checkpoints its ``state_dict``
(``model_ema``: its weights, buffers and ``n_averaged``), so a resume goes on with it exactly.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel


class ExponentialMovingAverage(AveragedModel):
    """An exponential moving average of ``model``'s parameters and buffers, kept on
    ``device`` (None: where the model is; torchvision's ``utils.ExponentialMovingAverage``)."""

    def __init__(self, model: nn.Module, decay: float, device: torch.device | None = None
                 ) -> None:
        if not 0 <= decay <= 1:
            raise ValueError(f"EMA decay {decay} must be in [0, 1]")
        self.decay = decay

        def ema_avg(avg: torch.Tensor, param: torch.Tensor, n: torch.Tensor | int
                    ) -> torch.Tensor:
            return decay * avg + (1 - decay) * param

        super().__init__(model, device, ema_avg, use_buffers=True)


def adjusted_decay(decay: float, *, world_size: int, batch_size: int, steps: int,
                   epochs: int) -> float:
    """torchvision's decay adjustment: ``1 - min(1, (1 - decay) * world * batch * steps /
    epochs)``, ``batch_size`` per rank."""
    if steps < 1 or epochs < 1:
        raise ValueError(f"--model-ema-steps {steps} and --epochs {epochs} must be >= 1")
    alpha = (1.0 - decay) * world_size * batch_size * steps / epochs
    return 1.0 - min(1.0, alpha)


def update(ema: ExponentialMovingAverage, model: nn.Module, *, batch_index: int, epoch: int,
           steps: int, warmup_epochs: float) -> bool:
    """After the optimizer's step on an epoch's batch ``batch_index``: update the average when
    the index is a multiple of ``steps``, and hold it at a copy of the model during the
    warm-up (module docstring). True when it was updated."""
    if batch_index % steps:
        return False
    ema.update_parameters(model)
    if epoch < warmup_epochs:
        ema.n_averaged.fill_(0)
    return True
