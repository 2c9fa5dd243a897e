"""The embedded trainer, top to bottom: set-up (process group, device, staging, loaders,
model, its moving average, optimizer, loss), the training loop with its time split,
evaluation, checkpoints. Its flags, and ``--recipe``'s presets under them, are
``trainkit.options``.

``scripts/train_imagenet.py`` runs ``main``; its docstring says how to launch it and what each
line it prints means.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from imgprep import CpuPlan, ImgprepError, World, detect, read_limits
from loaders import ORDER_VERSION, PAD_LABEL, DeviceLoader, Loader, cpu_line, worker_count

from . import TrainError, compiled, distributed, ema, recipes
from .checkpoint import load_checkpoint, order_version_of, resume_config, save_checkpoint
from .data import loader_options, make_loaders, pin_cpus, stage, synthetic_batches
from .logs import configure_logging
from .loss import Loss
from .models import add_blurpool, model_by_name
from .optim import learning_rate, make_optimizer
from .options import parse_args
from .precision import Precision
from .precision import detect as detect_precision
from .runconfig import RunConfig, run_config
from .timing import (
    BucketClock,
    DataWaitHint,
    Split,
    report,
    wire_dtype,
)

logger = logging.getLogger("train_imagenet")  # notes from rank 0 (trainkit.logs)


@torch.no_grad()
def validate(model: nn.Module, batches: DeviceLoader, device: torch.device, world: World,
             bf16: bool, flip: bool = False) -> dict[str, float]:
    """Exact top-1/top-5: every sample once across ranks (padding masked), counts summed;
    with ``flip`` (--val-flip) on the logits of each image plus its mirror's."""
    model.eval()
    counts = torch.zeros(3, dtype=torch.float64, device=device)
    for images, labels in batches:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(images).float()
            if flip:
                logits = logits + model(images.flip(3)).float()
        real = labels != PAD_LABEL
        top5 = logits.topk(5, dim=1).indices
        hit = top5 == labels[:, None]
        counts += torch.tensor([float((hit[:, 0] & real).sum()), float((hit.any(1) & real).sum()),
                                float(real.sum())], dtype=torch.float64, device=device)
    if world.is_distributed:
        dist.all_reduce(counts)
    model.train()
    n = max(counts[2].item(), 1.0)
    return {"top1": counts[0].item() / n, "top5": counts[1].item() / n,
            "samples": int(counts[2].item())}


def log(record: dict[str, Any], path: Path | None) -> None:
    if path is not None:
        with open(path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")


@dataclass(eq=False)
class Run:
    """Everything one training run holds between its steps."""

    args: argparse.Namespace
    world: World
    device: torch.device
    precision: Precision  # bf16 autocast or fp32, and why
    train_loader: Loader
    val_loader: Loader | None
    model: nn.Module
    net: nn.Module  # the model, wrapped in DDP once distributed
    optimizer: torch.optim.Optimizer
    loss: Loss
    average: ema.ExponentialMovingAverage | None  # --model-ema
    clock: BucketClock
    hint: DataWaitHint
    config: RunConfig  # what defines the run; its mean/std normalise every split
    result: dict[str, Any]
    steps_per_epoch: int  # a whole epoch's, also after a resume (the LR schedule's)
    compile: bool = False  # torch.compile the training step's model (trainkit.compiled)
    ckpt: Path | None = None
    step: int = 0
    start_epoch: int = 0
    batch_in_epoch: int = 0  # the index in its epoch of the next batch (the EMA's count)
    resumed: bool = False
    losses: list[float] = field(default_factory=list)
    split: Split = field(default_factory=Split)
    seen: int = 0  # this rank's images in the current log interval
    samples: int = 0  # images all ranks trained on since the start (kept across --resume)
    t_log: float = field(default_factory=time.perf_counter)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def batches(self, loader: Loader) -> DeviceLoader:
        """``loader``'s batches on the device, normalised with the run's one mean and std."""
        return DeviceLoader(loader, self.device, self.config.mean, self.config.std)


def train(args: argparse.Namespace, world: World) -> dict[str, Any]:
    """Set up, resume, train epoch after epoch (or to --steps), validate, checkpoint."""
    run = set_up(args, world)
    resume(run)
    distribute(run)
    for epoch in range(run.start_epoch, args.epochs):
        if not train_epoch(run, epoch):
            break  # --steps reached
        run.train_loader.set_epoch(epoch + 1)
        save(run)
    evaluate(run)
    save(run)
    run.result.update(step=run.step, losses=run.losses,
                      wire_dtypes=sorted(run.clock.wire_dtypes), buckets=run.clock.buckets,
                      replicas_identical=distributed.replicas_identical(run.model, world),
                      config=run.config.record())
    return run.result


def set_up(args: argparse.Namespace, world: World) -> Run:
    """Threads, process group, device, staging, loaders, model and optimizer."""
    if args.threads or not torch.cuda.is_available():
        torch.set_num_threads(args.threads or world.cores_per_rank())
    if args.deterministic:  # before the first cuBLAS call, which reads the variable
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    dist_backend = distributed.init(world, args.timeout, args.backend)
    device = distributed.device_for(world)
    precision = detect_precision(args.bf16, device.type)
    compile_on = compiled.wanted(args.compile, device)
    if world.rank == 0:
        print(precision.line(), flush=True)
        log({"precision": precision.record()}, args.log_json)
    if args.stage_from is not None:
        stage(args, world)
    torch.manual_seed(args.seed)
    ckpt = args.checkpoint / "last.pt" if args.checkpoint else None
    resuming = args.resume and ckpt is not None and ckpt.exists()
    order = order_version_of(ckpt) if resuming and ckpt is not None else ORDER_VERSION
    pin = pin_cpus(args, device)
    workers = worker_count(args.workers, world, pin)
    if pin and not args.threads and isinstance(plan := world.cpu_plan(), CpuPlan):
        torch.set_num_threads(len(plan.main))  # the process's own CPUs, not the workers'
    options = loader_options(args, device, workers, order)
    backend = {"backend": options.backend, "device": options.device}
    if world.rank == 0:
        unit = "DALI thread" if options.backend == "dali" else "worker"
        print(f"loader: {options.backend} backend, decoding on the {options.device}, "
              f"{workers} {unit}{'' if workers == 1 else 's'} per rank"
              f"{', sized to demand' if options.sizing else ''}", flush=True)
        log({"loader": backend}, args.log_json)
        nice = replace(options, mixup=None).resolve(train=True, world=world).worker_nice
        log({"cpus": {"pin_cpus": pin, "workers": workers, "worker_nice": nice,
                      "sizing": options.sizing is not None}}, args.log_json)
    train_loader, val_loader = make_loaders(args, world, options)
    sizes = train_loader.output_sizes  # the loader's, each epoch's in its plan
    if world.rank == 0:
        print(compiled.line(args.compile, compile_on, device, sizes), flush=True)
        print(cpu_line(world, pin), flush=True)
        log({"compile": {"mode": args.compile, "on": compile_on, "sizes": list(sizes)}},
            args.log_json)
        if args.recipe is not None:
            print(recipes.table(args, world.world_size), flush=True)
            log({"recipe": {"name": args.recipe, "rows": recipes.rows(args, world.world_size)}},
                args.log_json)
    config = run_config(args, world, workers=workers, bf16=precision.bf16)
    model, optimizer, average = build_model(args, config.num_classes, device, world)
    hint = DataWaitHint(workers, world.cores_per_rank(), world.local_world_size,
                        staged=args.stage_from is not None,
                        one_cpu=read_limits().affinity == 1 < (os.cpu_count() or 1))
    loss = Loss(smoothing=args.label_smoothing, bce=args.bce,
                target_threshold=args.bce_target_thresh)
    return Run(args, world, device, precision, train_loader, val_loader, model, model,
               optimizer, loss, average, BucketClock(wire_dtype(args.allreduce_dtype)), hint,
               config, {"backend": dist_backend, "world_size": world.world_size,
                        "precision": precision.record(), "loader": backend,
                        "synthetic": args.synthetic, "compile": compile_on,
                        "recipe": args.recipe},
               train_loader.batches_per_epoch, ckpt=ckpt, compile=compile_on)


def build_model(args: argparse.Namespace, num_classes: int, device: torch.device, world: World
                ) -> tuple[nn.Module, torch.optim.Optimizer, ema.ExponentialMovingAverage | None]:
    """The model (channels_last, as the loaders' batches: data.MEMORY_FORMAT; BlurPool and
    SyncBN when asked), its optimizer, and its moving average with --model-ema."""
    model = model_by_name(args.arch, num_classes, zero_init_residual=args.zero_init_residual)
    if args.blurpool:
        add_blurpool(model)
    model = model.to(device).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    if args.sync_bn and distributed.grouped():
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    average = None
    if args.model_ema:
        decay = ema.adjusted_decay(args.model_ema_decay, world_size=world.world_size,
                                   batch_size=args.batch_size, steps=args.model_ema_steps,
                                   epochs=args.epochs)
        average = ema.ExponentialMovingAverage(model, decay, device)
    return model, make_optimizer(args, model), average


def resume(run: Run) -> None:
    """With --resume and a checkpoint of this run (``resume_config`` refuses another's):
    model, optimizer, step, loader position, RNG and normalisation statistics; rank 0 says
    where the run goes on."""
    if not (run.args.resume and run.ckpt is not None and run.ckpt.exists()):
        return
    state = load_checkpoint(run.ckpt)
    run.config, notes = resume_config(state, run.config, run.ckpt)
    for note in notes:
        logger.info(note)
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    if run.average is not None:
        if "model_ema" not in state:
            raise TrainError(f"cannot resume from {run.ckpt} with --model-ema: it holds no "
                             "moving average; resume without --model-ema, or start a new run "
                             "in another --checkpoint folder")
        run.average.load_state_dict(state["model_ema"])
    run.step, run.start_epoch = int(state["step"]), int(state["loader"]["epoch"])
    run.batch_in_epoch = int(state["loader"]["batch"])
    run.train_loader.load_state_dict(state["loader"])
    torch.set_rng_state(state["rng"])
    run.resumed = True
    # a checkpoint written before the count was kept: every step a full global batch
    run.samples = int(state.get("samples", run.step * run.args.batch_size
                                * run.world.world_size))
    resumed = {"step": run.step, "epoch": run.start_epoch,
               "epoch_batches_done": int(state["loader"]["batch"]), "samples": run.samples}
    run.result["resumed"] = resumed
    if run.world.rank == 0:
        print(f"resumed from {run.ckpt} at step {run.step}: epoch {run.start_epoch} "
              f"({resumed['epoch_batches_done']} of its {run.steps_per_epoch} steps done), "
              f"{run.samples} samples seen", flush=True)
        log({"resumed": resumed}, run.args.log_json)


def distribute(run: Run) -> None:
    """Wrap the model in DDP, its all-reduce timed (and cast) by the bucket clock; start
    the first log interval."""
    if distributed.grouped():
        run.net = DDP(run.model, device_ids=[run.device.index] if run.device.type == "cuda"
                      else None, gradient_as_bucket_view=True)
        run.net.register_comm_hook(dist.group.WORLD, run.clock.hook)
    if run.compile:
        run.net = compiled.compile_model(run.net, run.train_loader.output_sizes)
    run.t_log = time.perf_counter()  # the first log interval starts here


def train_epoch(run: Run, epoch: int) -> bool:
    """One epoch (what is left of it after a resume); False once --steps is reached."""
    args, loader = run.args, run.train_loader
    if not (run.resumed and epoch == run.start_epoch):  # a resumed epoch goes on
        loader.set_epoch(epoch)
        run.batch_in_epoch = 0
    if args.synthetic:  # one batch made on the device, as many times as the loader has
        batches = synthetic_batches(args.batch_size, loader.plan().size,
                                    run.config.num_classes, run.device, args.seed, len(loader))
    else:
        batches = iter(run.batches(loader))
    try:
        return _train_steps(run, epoch, batches)
    finally:  # --steps stops mid-epoch: end the loader's threads now, not at exit
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def _train_steps(run: Run, epoch: int, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
                 ) -> bool:
    """The steps of ``batches``; False once --steps is reached."""
    args = run.args
    while True:
        t0 = time.perf_counter()
        try:
            images, labels = next(batches)
        except StopIteration:
            return True
        run.sync()
        optimise(run, images, labels, t0, epoch)
        run.seen += images.shape[0]
        run.samples += images.shape[0] * run.world.world_size  # equal batches on every rank
        if run.step % args.log_every == 0:  # logged before its checkpoint: a kill between
            log_interval(run, epoch)  # the two makes the resumed run log the step again
        if args.checkpoint_every and run.step % args.checkpoint_every == 0:
            save(run)
        if args.steps and run.step >= args.steps:
            return False


def optimise(run: Run, images: torch.Tensor, targets: torch.Tensor, t0: float,
             epoch: int) -> None:
    """One step on a batch and its targets (labels, or soft targets with --mixup/--cutmix);
    the time since ``t0`` split into data wait, forward+backward, exposed all-reduce and
    optimizer (the moving average's update included)."""
    args, net = run.args, run.net
    t1 = time.perf_counter()
    for group in run.optimizer.param_groups:
        group["lr"] = learning_rate(run.samples, run.steps_per_epoch, args, run.world)
    with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.precision.bf16):
        loss = run.loss(net(images), targets)
    if not torch.isfinite(loss):
        raise TrainError(f"rank {run.world.rank}: loss is {loss.item()} at step {run.step}; "
                         "lower --lr or check the data")
    loss.backward()
    run.sync()
    t2 = time.perf_counter()
    exposed = max(0.0, t2 - run.clock.last_ready) if distributed.grouped() else 0.0
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    if run.average is not None:
        ema.update(run.average, run.model, batch_index=run.batch_in_epoch, epoch=epoch,
                   steps=args.model_ema_steps, warmup_epochs=args.warmup_epochs)
    run.batch_in_epoch += 1
    run.sync()
    t3 = time.perf_counter()
    run.split.add(t1 - t0, (t2 - t1) - exposed, exposed, t3 - t2)
    run.losses.append(loss.item())
    run.step += 1


def log_interval(run: Run, epoch: int) -> None:
    """Reduce and print the interval's split (rank 0), and the data-wait hint once."""
    rec = report(run.split, run.seen, run.t_log, run.world.world_size, run.world.rank,
                 run.device, run.step, epoch, run.losses[-1])
    rec["active_workers"] = run.train_loader.active_workers
    run.result["last_log"] = rec
    hint = run.hint.update(rec["data_wait_fraction"])
    if hint is not None:
        run.result["hint"] = hint
    if run.world.rank == 0:
        log(rec, run.args.log_json)
        if hint is not None:
            print(hint, flush=True)
    run.split, run.seen, run.t_log = Split(), 0, time.perf_counter()


def evaluate(run: Run) -> None:
    """Exact top-1/top-5 on the val split, of the model and of its moving average
    (--model-ema: ``val_ema``), printed and logged by rank 0."""
    if run.val_loader is None:
        return
    models = {"val": run.model}
    if run.average is not None:
        models["val_ema"] = run.average.module
    for key, model in models.items():
        val = run.result[key] = validate(model, run.batches(run.val_loader), run.device,
                                         run.world, run.precision.bf16, run.args.val_flip)
        if run.world.rank == 0:
            log({"step": run.step, key: val}, run.args.log_json)
            which = " (moving average)" if key == "val_ema" else ""
            print(f"val{which}: top-1 {val['top1']:.3f} top-5 {val['top5']:.3f} on "
                  f"{val['samples']} images", flush=True)


def save(run: Run) -> None:
    """A checkpoint when --checkpoint is given (rank 0 writes, every rank waits)."""
    if run.ckpt is None:
        return
    if run.world.rank == 0:
        save_checkpoint(run.ckpt, {
            "model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
            "step": run.step, "samples": run.samples, "loader": run.train_loader.state_dict(),
            "rng": torch.get_rng_state(), "config": run.config.record(),
            **({} if run.average is None else {"model_ema": run.average.state_dict()})})
    if run.world.is_distributed:
        dist.barrier()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        world = detect()
        configure_logging(world)
        result = train(args, world)
        if world.rank == 0:
            print(json.dumps({k: v for k, v in result.items() if k != "losses"},
                             sort_keys=True), flush=True)
    except ImgprepError as e:
        print(f"train_imagenet: error: {e}", file=sys.stderr, flush=True)
        return 3
    except (RuntimeError, dist.DistBackendError) as e:
        print(f"train_imagenet: rank failed: {type(e).__name__}: {str(e).splitlines()[0]}",
              file=sys.stderr, flush=True)
        return 4
    finally:
        distributed.close()
    return 0
