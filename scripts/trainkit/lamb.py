"""LAMB (``--opt lamb``), with timm's ``Lamb`` semantics (the NVIDIA FusedLAMB variant).

One step, for every parameter ``p`` with a gradient (``lr``, ``betas`` = (b1, b2), ``eps`` and
``weight_decay`` its group's):

1. the gradients are clipped together: each is divided by ``max(1, G / max_grad_norm)``, G the
   L2 norm of all gradients at once (``max_grad_norm=None``: no clipping);
2. Adam's moments, bias-corrected with the group's step count t (counted per group, from 1):
   ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
   ``u = (m / (1 - b1^t)) / (sqrt(v) / sqrt(1 - b2^t) + eps)``;
3. L2 weight decay added to the update (not decoupled): ``u += weight_decay * p``;
4. where ``weight_decay != 0`` (or ``always_adapt``), the layer-wise trust ratio
   ``r = |p| / |u|`` (1 where either norm is 0; at most 1 with ``trust_clip``) scales it:
   ``u *= r``; a group without weight decay (norm parameters and biases, by the trainer's
   groups) takes the plain Adam step, as in timm;
5. ``p -= lr * u``.

The defaults are timm's (``betas=(0.9, 0.999)``, ``eps=1e-6``, ``max_grad_norm=1.0``), which the
ResNet-strikes-back recipes ran with. The step count is kept in each parameter group
(``group["step"]``), so ``state_dict`` holds it and a resume goes on with the same bias
corrections.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Optimizer


class Lamb(Optimizer):
    """LAMB as timm's ``timm.optim.Lamb`` computes it (module docstring)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, max_grad_norm: float | None = 1.0,
                 trust_clip: bool = False, always_adapt: bool = False) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"Lamb: lr {lr}, eps {eps} and weight_decay {weight_decay} must "
                             "be >= 0")
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"Lamb: betas {betas} must be in [0, 1)")
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ValueError(f"Lamb: max_grad_norm {max_grad_norm} must be > 0 (None: no "
                             "clipping)")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "max_grad_norm": max_grad_norm, "trust_clip": trust_clip,
                    "always_adapt": always_adapt}
        super().__init__(params, defaults)

    def _clip_divisor(self) -> torch.Tensor | None:
        """``max(1, G / max_grad_norm)``, G the norm of every gradient together."""
        limit = self.defaults["max_grad_norm"]
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if limit is None or not grads:
            return None
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g)
                                                      for g in grads]))
        return (total / limit).clamp(min=1.0)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        divisor = self._clip_divisor()
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group, p.grad if divisor is None else p.grad / divisor)
        return loss

    def _update(self, p: torch.Tensor, group: dict[str, Any], grad: torch.Tensor) -> None:
        """One parameter's step (the module docstring's steps 2 to 5)."""
        b1, b2 = group["betas"]
        t = group["step"]
        state = self.state[p]
        if not state:
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(b1).add_(grad, alpha=1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        denom = (v.sqrt() / (1 - b2 ** t) ** 0.5).add_(group["eps"])
        update = (m / (1 - b1 ** t)).div_(denom)
        wd = group["weight_decay"]
        if wd != 0:
            update.add_(p, alpha=wd)
        if wd != 0 or group["always_adapt"]:
            w_norm, u_norm = p.norm(2.0), update.norm(2.0)
            one = torch.ones_like(w_norm)
            ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, one)
            if group["trust_clip"]:
                ratio = ratio.clamp(max=1.0)
            update.mul_(ratio)
        p.add_(update, alpha=-group["lr"])
