"""The trainer's models (scripts/trainkit/models.py): sizes, shapes, layouts, init, groups."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest
import torch
from torch import nn

from scripts.trainkit.models import (
    MODEL_NAMES,
    BasicBlock,
    Bottleneck,
    ResNet,
    model_by_name,
    param_groups,
    resnet18,
    resnet50,
    tiny,
    to_device,
)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def r50() -> ResNet:
    torch.manual_seed(0)
    return resnet50().eval()


@pytest.fixture(scope="module")
def r18() -> ResNet:
    torch.manual_seed(0)
    return resnet18().eval()


def test_parameter_counts(r50: ResNet, r18: ResNet) -> None:
    assert n_params(r50) == 25_557_032  # the reference ResNet-50 (torchvision) count
    assert n_params(r18) == 11_689_512  # torchvision's resnet18
    assert 100_000 <= n_params(tiny(1000)) <= 300_000
    assert n_params(tiny(10)) < 100_000
    # The head follows num_classes: 2048 * (1000 - 10) weights + 990 biases fewer.
    assert n_params(resnet50(num_classes=10)) == 25_557_032 - 2049 * 990


def test_torchvision_layout(r50: ResNet) -> None:
    """Module names and v1.5 stride placement follow torchvision (compatible state dicts)."""
    keys = set(r50.state_dict())
    assert {"conv1.weight", "bn1.running_mean", "layer1.0.downsample.0.weight",
            "layer4.2.bn3.weight", "fc.weight", "fc.bias"} <= keys
    first = cast(Bottleneck, r50.get_submodule("layer2.0"))
    assert first.conv1.stride == (1, 1) and first.conv2.stride == (2, 2)  # v1.5: stride in 3x3


def test_resnet50_forward_224(r50: ResNet) -> None:
    with torch.no_grad():
        out = r50(torch.randn(1, 3, 224, 224))
    assert out.shape == (1, 1000)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("size", [224, 96, 64])
def test_forward_shapes_small_models(r18: ResNet, size: int) -> None:
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        assert r18(x).shape == (2, 1000)
        assert tiny(7).eval()(x).shape == (2, 7)


@pytest.mark.parametrize("name", ["tiny", "resnet18"])
def test_channels_last_matches_contiguous(name: str) -> None:
    torch.manual_seed(1)
    model = model_by_name(name, 10, zero_init_residual=False).eval()  # live residual branches
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        ref = model(x)
        model = to_device(model, "cpu")
        out = model(x.contiguous(memory_format=torch.channels_last))
    assert all(p.is_contiguous(memory_format=torch.channels_last)
               for p in model.parameters() if p.ndim == 4)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels_last", [False, True])
def test_bf16_autocast_forward(r18: ResNet, channels_last: bool) -> None:
    torch.manual_seed(2)
    model = tiny(10).train()
    x = torch.randn(4, 3, 64, 64)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
        loss = nn.functional.cross_entropy(out, torch.arange(4))
    assert out.shape == (4, 10) and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all() and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        big = r18(x)
    assert big.shape == (4, 1000) and torch.isfinite(big).all()


def test_tiny_sgd_reduces_loss() -> None:
    torch.manual_seed(3)
    model = to_device(tiny(10))
    x = torch.randn(8, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (8,))
    opt = torch.optim.SGD(param_groups(model, 5e-5), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(10):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_param_groups_partition() -> None:
    model = resnet18(10)
    decay_group, no_decay_group = param_groups(model, 1e-4)
    assert decay_group["weight_decay"] == 1e-4 and no_decay_group["weight_decay"] == 0.0
    decay = {id(p) for p in decay_group["params"]}
    no_decay = {id(p) for p in no_decay_group["params"]}
    everything = [id(p) for p in model.parameters()]
    assert not decay & no_decay
    assert decay | no_decay == set(everything)
    assert len(decay_group["params"]) + len(no_decay_group["params"]) == len(everything)
    for name, module in model.named_modules():
        if isinstance(module, nn.BatchNorm2d):
            assert id(module.weight) in no_decay and id(module.bias) in no_decay, name
        elif isinstance(module, nn.Conv2d):
            assert id(module.weight) in decay, name
        elif isinstance(module, nn.Linear):
            assert id(module.weight) in decay and id(module.bias) in no_decay, name
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert id(p) in no_decay, name
    # And an optimizer takes the groups as they are.
    torch.optim.SGD(param_groups(model, 1e-4), lr=0.1, momentum=0.9)


def test_param_groups_shared_parameter_once() -> None:
    lin = nn.Linear(4, 4)
    model = nn.Sequential(lin, nn.ReLU(), lin, nn.BatchNorm1d(4))
    decay, no_decay = (g["params"] for g in param_groups(model, 0.1))
    assert [id(p) for p in decay] == [id(lin.weight)]
    assert {id(p) for p in no_decay} == {id(lin.bias), id(model[3].weight), id(model[3].bias)}


@pytest.mark.parametrize("build", [resnet50, resnet18, tiny])
def test_zero_init_residual(build: Callable[..., ResNet]) -> None:
    model = build(num_classes=10)
    blocks = [m for m in model.modules() if isinstance(m, BasicBlock | Bottleneck)]
    assert blocks
    for block in blocks:
        last = block.bn3 if isinstance(block, Bottleneck) else block.bn2
        assert last is block.last_bn()
        assert torch.count_nonzero(last.weight) == 0
        assert torch.count_nonzero(last.bias) == 0
        assert torch.all(block.bn1.weight == 1)  # only the last BN of the branch is zeroed
    assert torch.all(model.bn1.weight == 1) and torch.all(model.bn1.bias == 0)


def test_zero_init_residual_off_and_init() -> None:
    model = tiny(10, zero_init_residual=False)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)
    # Kaiming normal, fan_out, ReLU gain: std = sqrt(2 / (out_channels * k * k)).
    w = cast(BasicBlock, model.get_submodule("layer3.0")).conv2.weight
    expected = (2.0 / (w.shape[0] * w.shape[2] * w.shape[3])) ** 0.5
    assert abs(w.std().item() - expected) < 0.1 * expected


def test_zero_init_block_is_identity_plus_relu() -> None:
    """With zero gammas an unprojected block passes relu(x) through: why the option helps."""
    block = BasicBlock(8, 8)
    nn.init.zeros_(block.last_bn().weight)
    x = torch.randn(2, 8, 5, 5)
    torch.testing.assert_close(block(x), torch.relu(x))


def test_model_by_name() -> None:
    assert set(MODEL_NAMES) == {"resnet50", "resnet18", "tiny"}
    model = model_by_name("tiny", 5)
    assert isinstance(model, ResNet) and model.fc.out_features == 5
    with pytest.raises(ValueError, match=r"unknown model 'resnet34'.*resnet50, resnet18, tiny"):
        model_by_name("resnet34", 1000)
    with pytest.raises(ValueError, match="unknown model"):
        model_by_name("ResNet50", 1000)
    with pytest.raises(ValueError, match="num_classes"):
        model_by_name("tiny", 0)
