"""ResNet models for the embedded trainer, written here so the project needs no torchvision.

- ``resnet50`` / ``resnet18``: ResNet v1.5 as in torchvision (the stride-2 downsampling sits in
  the 3x3 conv of the bottleneck, not the first 1x1), with the same module names, so parameter
  counts (25,557,032 and 11,689,512 with 1000 classes) and ``state_dict`` keys match torchvision.
- ``tiny``: a three-stage BasicBlock net (widths 16/32/64, one block per stage) for tests and the
  demo; a training step at batch 8, 112 px, takes a few milliseconds on two CPU cores.
- ``param_groups``: weight decay on conv/linear weights only, none on norm parameters or biases.
- ``add_blurpool``: FFCV's BlurPool (Zhang, "Making Convolutional Networks Shift-Invariant
  Again", 2019): every strided conv with at least 16 input channels is preceded by a fixed 3x3
  binomial blur (``BlurPoolConv2d``), as FFCV's ImageNet example applies it (``--blurpool``).

Initialisation follows torchvision: Kaiming normal (fan_out, ReLU) for convs, norm weight 1 and
bias 0, and by default the last BN of every residual branch starts at gamma 0 (Goyal et al.,
"Accurate, Large Minibatch SGD", 2017), so each block starts as the identity and large-batch
training is stabler early on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "MODEL_NAMES",
    "BasicBlock",
    "BlurPoolConv2d",
    "Bottleneck",
    "ResNet",
    "add_blurpool",
    "model_by_name",
    "param_groups",
    "resnet18",
    "resnet50",
    "tiny",
    "to_device",
]

M = TypeVar("M", bound=nn.Module)


def _conv3x3(inplanes: int, planes: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution with padding 1 and no bias (a BN follows every conv)."""
    return nn.Conv2d(inplanes, planes, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(inplanes: int, planes: int, stride: int = 1) -> nn.Conv2d:
    """1x1 convolution without bias (a BN follows every conv)."""
    return nn.Conv2d(inplanes, planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual connection (ResNet-18/34 block)."""

    expansion: ClassVar[int] = 1

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def last_bn(self) -> nn.BatchNorm2d:
        """The BN closing the residual branch (the one ``zero_init_residual`` zeroes)."""
        return self.bn2

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride: v1.5), 1x1 expand by 4, plus a residual connection."""

    expansion: ClassVar[int] = 4

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = _conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def last_bn(self) -> nn.BatchNorm2d:
        """The BN closing the residual branch (the one ``zero_init_residual`` zeroes)."""
        return self.bn3

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


Block = type[BasicBlock] | type[Bottleneck]


class ResNet(nn.Module):
    """ImageNet-style ResNet: 7x7/2 stem and 3x3/2 max-pool, residual stages, global pool, fc.

    ``widths`` gives the base width of each stage (the output has ``width * block.expansion``
    channels); every stage after the first halves the resolution. Module names follow
    torchvision (``conv1``, ``bn1``, ``layer1``..., ``fc``), so the state dicts are compatible.
    """

    def __init__(
        self,
        block: Block,
        layers: Sequence[int],
        widths: Sequence[int] = (64, 128, 256, 512),
        num_classes: int = 1000,
        zero_init_residual: bool = True,
    ) -> None:
        super().__init__()
        if len(layers) != len(widths) or not layers:
            raise ValueError(f"layers {list(layers)} and widths {list(widths)} must match")
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.inplanes = widths[0]
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        for i, (blocks, width) in enumerate(zip(layers, widths, strict=True)):
            stage = self._make_layer(block, width, blocks, stride=1 if i == 0 else 2)
            self.add_module(f"layer{i + 1}", stage)
        self.num_stages = len(layers)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[-1] * block.expansion, num_classes)
        self._init_weights(zero_init_residual)

    def _make_layer(self, block: Block, planes: int, blocks: int, stride: int) -> nn.Sequential:
        """One stage: the first block changes width/stride (1x1 projection); the rest keep it."""
        downsample: nn.Module | None = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                _conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        stage: list[nn.Module] = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        stage += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*stage)

    def _init_weights(self, zero_init_residual: bool) -> None:
        """Kaiming normal (fan_out) convs, norm gamma 1 / beta 0, optionally zero last gammas.

        The fc keeps PyTorch's default init, as torchvision does.
        """
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d | nn.GroupNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, BasicBlock | Bottleneck):
                    nn.init.zeros_(m.last_bn().weight)

    def stages(self) -> list[nn.Module]:
        """The residual stages in order (``layer1``, ``layer2``, ...)."""
        return [self.get_submodule(f"layer{i + 1}") for i in range(self.num_stages)]

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage in self.stages():
            x = stage(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet50(num_classes: int = 1000, zero_init_residual: bool = True) -> ResNet:
    """ResNet-50 v1.5 (torchvision's ``resnet50``): 25,557,032 parameters with 1000 classes."""
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes=num_classes,
                  zero_init_residual=zero_init_residual)


def resnet18(num_classes: int = 1000, zero_init_residual: bool = True) -> ResNet:
    """ResNet-18 (torchvision's ``resnet18``): 11,689,512 parameters with 1000 classes."""
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes=num_classes,
                  zero_init_residual=zero_init_residual)


def tiny(num_classes: int = 1000, zero_init_residual: bool = True) -> ResNet:
    """A very small ResNet (BasicBlock, widths 16/32/64, one block per stage) for tests/demos.

    About 80k parameters plus the head (65k with 1000 classes); same stem and layout as the big
    models, so it exercises the same code paths (downsampling, zero-init, channels_last).
    """
    return ResNet(BasicBlock, (1, 1, 1), widths=(16, 32, 64), num_classes=num_classes,
                  zero_init_residual=zero_init_residual)


MODEL_NAMES: tuple[str, ...] = ("resnet50", "resnet18", "tiny")


def model_by_name(name: str, num_classes: int, zero_init_residual: bool = True) -> nn.Module:
    """Build one of ``MODEL_NAMES`` (the trainer's ``--arch``); ValueError names the choices."""
    builders = {"resnet50": resnet50, "resnet18": resnet18, "tiny": tiny}
    if name not in builders:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODEL_NAMES)}")
    return builders[name](num_classes=num_classes, zero_init_residual=zero_init_residual)


class BlurPoolConv2d(nn.Module):
    """``conv`` after a depthwise 3x3 blur ([1, 2, 1] x [1, 2, 1] / 16, stride 1, padding 1):
    FFCV's ``BlurPoolConv2d``; the filter is a buffer (``blur_filter``), the conv keeps its
    weights under ``conv``."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        taps = torch.tensor([1.0, 2.0, 1.0])
        kernel = (taps[:, None] * taps[None, :] / 16).expand(conv.in_channels, 1, 3, 3)
        self.conv = conv
        self.blur_filter: Tensor
        self.register_buffer("blur_filter", kernel.clone())

    def forward(self, x: Tensor) -> Tensor:
        blurred = F.conv2d(x, self.blur_filter, stride=1, padding=1, groups=self.conv.in_channels)
        return self.conv(blurred)


def add_blurpool(model: nn.Module) -> nn.Module:
    """Wrap every conv with a stride above 1 and at least 16 input channels in
    ``BlurPoolConv2d``, in place (FFCV's ``apply_blurpool``); returns ``model``."""
    for name, child in model.named_children():
        if isinstance(child, nn.Conv2d) and max(child.stride) > 1 and child.in_channels >= 16:
            setattr(model, name, BlurPoolConv2d(child))
        else:
            add_blurpool(child)
    return model


def to_device(
    model: M, device: torch.device | str | None = None, channels_last: bool = True
) -> M:
    """Move ``model`` to ``device`` and (by default) the channels_last layout, in one typed call.

    channels_last (NHWC) is what oneDNN on CPU and cuDNN's tensor-core kernels prefer for convs;
    feed inputs made with ``x.contiguous(memory_format=torch.channels_last)``. This wrapper
    exists because torch's stubs for ``nn.Module.to`` omit ``memory_format`` (mypy rejects
    ``model.to(device, memory_format=...)`` though it works at run time).
    """
    if channels_last:
        return model.to(device, memory_format=torch.channels_last)  # type: ignore[call-overload]
    return model.to(device)


_NO_DECAY_MODULES = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two optimizer groups: decay (conv/linear weights) and no decay (norm params, all biases).

    Weight decay on BN gammas/betas and biases only fights the normalisation and does not
    regularise (Goyal et al.; the usual large-batch ImageNet recipe), so those get 0. Every
    parameter lands in exactly one group (shared parameters once), in ``model.parameters()``
    order; pass the result straight to an optimizer, e.g. ``SGD(param_groups(m, 5e-5), lr=...)``.
    """
    no_decay_ids: set[int] = set()
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if isinstance(module, _NO_DECAY_MODULES) or pname == "bias" or p.ndim <= 1:
                no_decay_ids.add(id(p))
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():  # deduplicated by PyTorch
        (no_decay if id(p) in no_decay_ids else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
