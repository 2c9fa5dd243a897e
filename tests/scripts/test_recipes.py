"""Today's ImageNet recipes in the trainer: ``--recipe`` presets and the table they print, a
given flag over a preset, LAMB against a hand-computed step, the moving average's update
rule, torchvision's weight-decay groups, the losses on soft targets; and runs of the tiny
model on the CPU: ``--recipe torchvision-v2`` and ``rsb-a3`` a few steps each, and a resume in
the middle of an epoch that goes on with the same batches, mixes and moving average as the
run that was not stopped."""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from imgprep import World
from scripts.trainkit import ema, recipes
from scripts.trainkit import train as train_imagenet
from scripts.trainkit.lamb import Lamb
from scripts.trainkit.loss import Loss
from scripts.trainkit.models import BlurPoolConv2d, add_blurpool, param_groups, resnet50, tiny
from scripts.trainkit.optim import learning_rate, peak_lr, weight_decay_groups

# the tiny model on 32 px crops of the fake set (48 train images: 6 steps of 8 an epoch)
TINY = ["--arch", "tiny", "--batch-size", "8", "--image-size", "32", "--val-size", "32",
        "--val-resize", "36", "--epochs", "4", "--threads", "1", "--log-every", "1"]


def args_of(*flags: str) -> Any:
    return train_imagenet.parse_args(["--data", "d", *flags])


def test_a_recipe_sets_its_options_and_a_given_flag_wins() -> None:
    args = args_of("--recipe", "torchvision-v2", "--epochs", "3", "--no-model-ema")
    assert (args.arch, args.batch_size, args.lr, args.lr_scaling) == ("resnet50", 128, 0.125,
                                                                      "linear")
    assert (args.image_size, args.val_size, args.val_resize) == (176, 224, 232)
    assert (args.mixup, args.cutmix, args.random_erase, args.ra_reps) == (0.2, 1.0, 0.1, 4)
    assert (args.auto_augment, args.norm_weight_decay, args.weight_decay) == ("ta_wide", 0.0,
                                                                              2e-5)
    assert (args.epochs, args.model_ema, args.zero_init_residual) == (3, False, False)
    a3 = args_of("--recipe", "rsb-a3")
    assert (a3.opt, a3.bce, a3.bce_target_thresh, a3.label_smoothing) == ("lamb", True, 0.2, 0)
    assert peak_lr(a3, 8) == pytest.approx(8e-3)  # the paper's, at its 2048 images
    ffcv = args_of("--recipe", "ffcv-rn50")
    assert peak_lr(ffcv, 8) == pytest.approx(1.7) and str(ffcv.res_schedule) == "0=160,71=192"
    assert (ffcv.val_size, ffcv.val_flip, ffcv.blurpool, ffcv.schedule) == (256, True, True,
                                                                           "linear")
    # the recipe's --val-resize gives way to a --val-crop-ratio given, its --res-schedule to
    # an --image-size given; --val-resize and --val-crop-ratio both given: refused
    ratio = args_of("--recipe", "torchvision-v2", "--val-crop-ratio", "0.9")
    assert (ratio.val_resize, ratio.val_crop_ratio) == (None, 0.9)
    assert "given --val-crop-ratio: the recipe's is 232" in recipes.table(ratio, 1)
    sized = args_of("--recipe", "ffcv-rn50", "--image-size", "128")
    assert (sized.res_schedule, sized.image_size) == (None, 128)
    with pytest.raises(SystemExit):
        args_of("--val-resize", "232", "--val-crop-ratio", "0.9")
    with pytest.raises(SystemExit):
        args_of("--bce-target-thresh", "0.2")  # without --bce


def test_the_table_shows_each_option_its_source_and_what_a_flag_overrode() -> None:
    args = args_of("--recipe", "torchvision-v2", "--epochs", "3", "--batch-size", "64")
    lines = recipes.table(args, world_size=2).splitlines()
    assert lines[0].startswith("recipe torchvision-v2: torchvision's ResNet-50 IMAGENET1K_V2")
    assert lines[1].split() == ["option", "this", "run", "source", "note"]
    by_option = {line.split()[0]: line for line in lines[2:]}
    assert by_option["--epochs"].split()[:3] == ["--epochs", "3", "600"]
    assert "given: the recipe's is 600" in by_option["--epochs"]
    assert "given: the recipe's is 128" in by_option["--batch-size"]
    assert "2 x 64 = 128 images a step here" in by_option["--batch-size"]
    # 0.125 per 256 images, linearly to 128 images: 0.0625
    assert "peak 0.0625 here (linear scaling to 128 images)" in by_option["--lr"]
    assert "given" not in by_option["--lr"] and "0.5 at 1024 images" in by_option["--lr"]
    alpha = 2e-5 * 2 * 64 * 32 / 3
    assert f"{1 - alpha:.6f} here" in by_option["--model-ema-decay"]
    assert by_option["precision"].split()[1:5] == ["--bf16", "auto", "fp32", "(no"]
    assert "differs: bf16 autocast where the device" in by_option["precision"]
    rows = recipes.rows(args, 2)
    assert {r["option"] for r in rows} >= {s.flag for s in recipes.TORCHVISION_V2.settings}
    assert all(r["source"] for r in rows)


def test_lamb_takes_the_hand_computed_step() -> None:
    """Gradients clipped together to norm 1, the first step of bias-corrected Adam (g / |g|),
    the weight decay added, the trust ratio |w| / |u| on the decayed group only."""
    w = nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
    b = nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = Lamb([{"params": [w], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}],
               lr=0.01)
    w.grad, b.grad = torch.tensor([0.6, 0.8], dtype=torch.float64), torch.tensor(
        [2.0], dtype=torch.float64)
    opt.step()
    # by hand: the gradients' norm is sqrt(5); u_w = g/(|g| + eps) + 0.1 w = (1.3, 1.4) - ~3e-6,
    # ratio 5 / |u_w| = 2.617126; b takes 0.01 * g/(|g| + eps)
    assert w.tolist() == pytest.approx([2.9659774609, 3.9633603107], abs=1e-9)
    assert b.tolist() == pytest.approx([0.9900000112], abs=1e-9)
    # a second step: the moments go on from the first, bias-corrected for t = 2
    g1, g2 = torch.tensor([0.6, 0.8]) / math.sqrt(5), torch.tensor([0.0, 0.5])
    before = w.detach().clone()
    w.grad = g2.double()  # norm 0.5 with b's below: under 1, not clipped
    b.grad = torch.zeros(1, dtype=torch.float64)
    opt.step()
    m = (0.9 * 0.1 * g1 + 0.1 * g2) / (1 - 0.9 ** 2)
    v = (0.999 * 0.001 * g1 ** 2 + 0.001 * g2 ** 2) / (1 - 0.999 ** 2)
    u = m / (v.sqrt() + 1e-6) + 0.1 * before.float()
    want = before.float() - 0.01 * (before.norm() / u.norm()).float() * u
    assert w.float().tolist() == pytest.approx(want.tolist(), abs=1e-6)
    state = opt.state_dict()
    assert [g["step"] for g in state["param_groups"]] == [2, 2]


def test_the_moving_average_follows_torchvisions_rule() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    average = ema.ExponentialMovingAverage(model, decay=0.75)
    first = [t.clone() for t in model.state_dict().values()]
    assert ema.update(average, model, batch_index=0, epoch=0, steps=4, warmup_epochs=0)
    with torch.no_grad():
        model[0].weight.add_(1.0)
        model[1].running_mean.fill_(2.0)
    assert not ema.update(average, model, batch_index=3, epoch=0, steps=4, warmup_epochs=0)
    assert torch.equal(average.module[0].weight, first[0])  # the first update copied
    assert ema.update(average, model, batch_index=4, epoch=0, steps=4, warmup_epochs=0)
    assert torch.allclose(average.module[0].weight, 0.75 * first[0] + 0.25 * model[0].weight)
    assert torch.allclose(average.module[1].running_mean, torch.full((2,), 0.5))  # buffers too
    # during the warm-up it keeps copying the model
    ema.update(average, model, batch_index=0, epoch=1, steps=4, warmup_epochs=5)
    assert int(average.n_averaged) == 0  # type: ignore[call-overload]
    ema.update(average, model, batch_index=4, epoch=1, steps=4, warmup_epochs=5)
    assert torch.equal(average.module[0].weight, model[0].weight)
    # torchvision's adjustment: 0.99998 at 8 x 128 images every 32 steps over 600 epochs
    assert ema.adjusted_decay(0.99998, world_size=8, batch_size=128, steps=32,
                              epochs=600) == pytest.approx(1 - 2e-5 * 8 * 128 * 32 / 600)
    assert ema.adjusted_decay(0.9, world_size=8, batch_size=128, steps=32, epochs=1) == 0.0


def test_weight_decay_groups_follow_torchvisions_set_weight_decay() -> None:
    model = tiny(num_classes=10)
    norms = {id(p) for m in model.modules() if isinstance(m, nn.BatchNorm2d)
             for p in m.parameters(recurse=False)}
    biases = {id(p) for n, p in model.named_parameters() if n.endswith(".bias")}
    norm_weights = norms - biases

    def ids(groups: list[dict[str, Any]]) -> list[tuple[set[int], float]]:
        return [({id(p) for p in g["params"]}, g["weight_decay"]) for g in groups]

    every = {id(p) for p in model.parameters()}
    assert ids(weight_decay_groups(model, 1e-4, 0.0)) == [(every - norms, 1e-4), (norms, 0.0)]
    assert ids(weight_decay_groups(model, 1e-4, 0.0, 0.0)) == [
        (every - norms - biases, 1e-4), (norm_weights, 0.0), (biases, 0.0)]
    # only --bias-weight-decay: norm weights decay with the rest, as torchvision's do
    assert ids(weight_decay_groups(model, 1e-4, None, 0.5)) == [(every - biases, 1e-4),
                                                                (biases, 0.5)]
    assert ids(weight_decay_groups(model, 1e-4)) == ids(param_groups(model, 1e-4))


def test_the_losses_on_labels_and_soft_targets() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 1.0, -2.0]])
    labels = torch.tensor([0, 2])
    soft = (1 - 0.1) * F.one_hot(labels, 3).float() + 0.1 / 3
    ce = Loss(smoothing=0.1)
    assert torch.allclose(ce(logits, labels), ce(logits, soft))  # smoothing folded in alike
    bce = Loss(smoothing=0.1, bce=True)
    assert torch.allclose(bce(logits, labels), F.binary_cross_entropy_with_logits(logits, soft))
    mixed = torch.tensor([[0.7, 0.3, 0.0], [0.1, 0.15, 0.75]])
    cut = Loss(bce=True, target_threshold=0.2)
    assert torch.allclose(cut(logits, mixed), F.binary_cross_entropy_with_logits(
        logits, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])))


def test_the_schedules_and_lamb_scaling() -> None:
    args = args_of("--recipe", "ffcv-rn50", "--batch-size", "16")
    world, steps = World(), 10  # 160 images an epoch
    lrs = [learning_rate(e * 160, steps, args, world) for e in (2, 45, 88)]
    peak = 0.10625 * 16 / 256
    assert lrs == pytest.approx([peak, peak * (1 - 43 / 86), 0.0])
    a3 = args_of("--recipe", "rsb-a3")
    assert peak_lr(a3, 1) == pytest.approx(8e-3 / math.sqrt(8))  # 256 images: sqrt(1/8)


def test_blurpool_wraps_the_strided_convs_ffcv_wraps() -> None:
    model = add_blurpool(resnet50(num_classes=10))
    wrapped = [n for n, m in model.named_modules() if isinstance(m, BlurPoolConv2d)]
    # the 3x3 of each stage's first bottleneck and its projection; not the stem (3 channels)
    assert wrapped == [f"layer{i}.0.{c}" for i in (2, 3, 4) for c in ("conv2", "downsample.0")]
    blur = model.get_submodule("layer2.0.conv2")
    assert isinstance(blur, BlurPoolConv2d)
    x = torch.ones(1, blur.conv.in_channels, 4, 4)
    inner = F.conv2d(x, blur.blur_filter, padding=1, groups=blur.conv.in_channels)
    assert inner[0, 0, 1, 1] == 1.0 and inner[0, 0, 0, 0] == pytest.approx(9 / 16)


def summary(out: str) -> dict[str, Any]:
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["torchvision-v2", "rsb-a3"])
def test_a_recipe_trains_the_tiny_model_on_the_cpu(
        data: Path, tmp_path: Path, recipe: str,
        trainer_main: Callable[[Sequence[str | Path]], subprocess.CompletedProcess[str]],
        ) -> None:
    """The trainer's main, in this process (``trainer_main``): what a run prints and logs."""
    log = tmp_path / "log.jsonl"
    done = trainer_main(["--data", data, "--recipe", recipe, *TINY, "--workers", "1",
                         "--steps", "3", "--log-json", log])
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    heads = [i for i, x in enumerate(lines) if x.startswith("recipe ")]
    assert len(heads) == 1 and lines[heads[0]].startswith(f"recipe {recipe}: "), lines[:8]
    table = lines[heads[0]:lines.index(next(x for x in lines if x.startswith("{")))]
    assert any(x.startswith("--arch") and "given: the recipe's is resnet50" in x for x in table)
    s = summary(done.stdout)
    assert s["step"] == 3 and s["recipe"] == recipe and s["val"]["samples"] == 20
    assert ("val_ema" in s) == (recipe == "torchvision-v2")
    config = s["config"]
    assert config["opt"] == {"torchvision-v2": "sgd", "rsb-a3": "lamb"}[recipe]
    assert config["mixup"] > 0 and config["auto_augment"]
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["recipe"]["name"] for r in records if "recipe" in r] == [recipe]
    assert all(math.isfinite(r["loss"]) for r in records if "loss" in r)


def run_steps(data: Path, steps: int, *flags: str | Path) -> tuple[Any, list[tuple[float, ...]]]:
    """Set up the torchvision-v2 recipe in this process (resuming with --resume) and train to
    ``steps``: the run, and each step's batch checksums (images, then targets: the mixes)."""
    args = train_imagenet.parse_args(["--data", str(data), "--recipe", "torchvision-v2", *TINY,
                                      "--workers", "0", "--warmup-epochs", "0",
                                      "--model-ema-steps", "2", "--steps", str(steps),
                                      "--no-validate", *map(str, flags)])
    run = train_imagenet.set_up(args, World())
    train_imagenet.resume(run)
    seen: list[tuple[float, ...]] = []
    run.model.register_forward_pre_hook(lambda _, x: seen.append((float(x[0].sum()),)))
    loss = run.loss

    def recorded(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        assert targets.is_floating_point() and targets.shape == logits.shape  # mixed: soft
        seen[-1] += (float((targets * torch.arange(1, targets.shape[1] + 1)).sum()),)
        return loss(logits, targets)

    run.loss = recorded  # type: ignore[assignment]
    train_imagenet.distribute(run)
    epoch = run.start_epoch
    while train_imagenet.train_epoch(run, epoch):
        epoch += 1
        run.train_loader.set_epoch(epoch)
    return run, seen


@pytest.mark.slow
def test_a_mid_epoch_resume_goes_on_with_the_same_batches_mixes_and_average(
        data: Path, tmp_path: Path) -> None:
    whole, seen = run_steps(data, 5)
    part, _ = run_steps(data, 3, "--checkpoint", tmp_path, "--checkpoint-every", "3")
    assert part.batch_in_epoch == 3 < part.steps_per_epoch  # stopped mid-epoch
    rest, seen_after = run_steps(data, 5, "--checkpoint", tmp_path, "--resume")
    assert rest.resumed and rest.losses == whole.losses[3:]
    assert seen_after == seen[3:] and len(seen) == 5
    assert len({s[1] for s in seen}) == 5  # each batch's own mix
    assert rest.average is not None and whole.average is not None
    for key, value in whole.average.state_dict().items():
        assert torch.equal(rest.average.state_dict()[key], value), key
    assert int(whole.average.n_averaged) == 3  # batches 0, 2, 4 of the epoch
