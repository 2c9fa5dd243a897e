"""The embedded trainer, top to bottom: arguments, set-up (process group, device, staging,
loaders, model, optimizer), the training loop with its time split, evaluation, checkpoints.

``scripts/train_imagenet.py`` runs ``main``; its docstring says how to launch it and what each
line it prints means.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from imgprep import ImgprepError, World, detect, read_limits
from loaders import (
    BACKENDS,
    ORDER_VERSION,
    PAD_LABEL,
    DeviceLoader,
    Loader,
    SizeSchedule,
    worker_count,
)

from . import TrainError, compiled, distributed
from .checkpoint import load_checkpoint, order_version_of, resume_config, save_checkpoint
from .data import loader_options, make_loaders, stage, synthetic_batches
from .logs import configure_logging
from .models import model_by_name, param_groups
from .precision import MODES, Precision
from .precision import detect as detect_precision
from .runconfig import RunConfig, normalize_arg, run_config
from .timing import (
    BucketClock,
    DataWaitHint,
    Split,
    report,
    wire_dtype,
)

logger = logging.getLogger("train_imagenet")  # notes from rank 0 (trainkit.logs)


def workers_arg(text: str) -> int | str:
    """``--workers``: ``auto`` or a count >= 0."""
    if text == "auto":
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected 'auto' or a count >= 0, got {text!r}")
    return int(text)


def schedule_arg(text: str) -> SizeSchedule:
    """``--res-schedule``: a size schedule (``loaders.SizeSchedule.parse``)."""
    try:
        return SizeSchedule.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="folder with train/val manifests")
    ap.add_argument("--stage-from", type=Path, default=None,
                    help="stage shards from this shared folder into --data first")
    ap.add_argument("--stage-mode", choices=["replicate", "partition"], default="replicate")
    ap.add_argument("--fanout", action="store_true",
                    help="with --stage-from and replicate: read the file server once in all, "
                         "nodes pass shards to each other")
    ap.add_argument("--arch", default="resnet50", help="resnet50, resnet18 or tiny")
    ap.add_argument("--epochs", type=int, default=90)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: all)")
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--workers", type=workers_arg, default="auto",
                    help="loader workers per rank (auto: this rank's cores less one); DALI "
                         "threads with --loader-backend dali, CPU-decode threads with nvjpeg")
    ap.add_argument("--loader-backend", choices=list(BACKENDS), default="pillow",
                    help="decode in CPU worker processes (default: imgprep's extension, "
                         "Pillow with --no-crop-decode), NVIDIA DALI "
                         "(pip install 'imgprep[dali]') or torchvision's nvJPEG; the last two "
                         "on the GPU when training on CUDA")
    ap.add_argument("--image-size", type=int, default=224,
                    help="train crop, and the default --val-size")
    ap.add_argument("--res-schedule", type=schedule_arg, default=None, metavar="SCHEDULE",
                    help="train size by epoch, instead of --image-size: LOW:HIGH@START-END "
                         "(FFCV's ramp, multiples of 32 px; /STEP for another step: "
                         "160:192@11-13), EPOCH=SIZE,... (0=128,10=160,20=192) or SIZE")
    ap.add_argument("--val-size", type=int, default=None,
                    help="validation center crop (default: --image-size)")
    ap.add_argument("--val-crop-ratio", type=float, default=0.875,
                    help="the val crop over the resized short side (default 0.875: the short "
                         "side resized to --val-size / 0.875, 256 for 224)")
    ap.add_argument("--compile", nargs="?", choices=compiled.MODES, const="on", default="auto",
                    help="torch.compile the model: auto (on CUDA, eager on the CPU), on (also a "
                         "bare --compile) or off; static shapes, one graph per size")
    ap.add_argument("--crop-decode", action=argparse.BooleanOptionalAction, default=None,
                    help="the pillow backend's extension path (imgprep's decode and "
                    "resampler); --no-crop-decode: Pillow's decode and resize (default: the "
                    "extension when it is built)")
    ap.add_argument("--normalize", type=normalize_arg, default="train", metavar="STATS",
                    help="mean/std for every split: train (the train manifest's, the default), "
                         "imagenet (0.485,0.456,0.406/0.229,0.224,0.225) or R,G,B/R,G,B")
    ap.add_argument("--lr", type=float, default=0.1, help="per 256 images (Goyal et al.)")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--warmup-epochs", type=float, default=5.0)
    ap.add_argument("--schedule", choices=["step", "cosine"], default="step")
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--sync-bn", action="store_true")
    ap.add_argument("--allreduce-dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--bf16", nargs="?", choices=MODES, const="on", default="auto",
                    help="bf16 autocast for forward/backward: auto (where the device computes "
                         "bf16 natively: CUDA with bf16, CPUs with AMX or AVX-512 BF16), on "
                         "(also a bare --bf16) or off")
    ap.add_argument("--no-bf16", dest="bf16", action="store_const", const="off",
                    help="the same as --bf16 off")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: cores/ranks)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", type=Path, default=None, help="checkpoint folder")
    ap.add_argument("--checkpoint-every", type=int, default=0, help="steps (0: epoch ends)")
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    ap.add_argument("--validate", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--log-json", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=300.0, help="process-group timeout, s")
    ap.add_argument("--backend", choices=distributed.BACKENDS, default="auto",
                    help="process-group backend: auto (NCCL with CUDA, else Gloo; opened only "
                         "for more than one process), nccl or gloo (opened even for one "
                         "process: DDP's all-reduce then runs alone)")
    ap.add_argument("--deterministic", action="store_true",
                    help="deterministic cuDNN algorithms and cuBLAS workspace: a rerun on the "
                         "same GPU with the same seed gives the same losses")
    ap.add_argument("--synthetic", action="store_true",
                    help="train on one random batch made once on the device, no loader (the "
                         "compute ceiling); --data still gives the classes and the statistics")
    args = ap.parse_args(argv)
    if args.fanout and args.stage_mode != "replicate":
        ap.error("--fanout goes with --stage-mode replicate")
    if not 0 < args.val_crop_ratio <= 1:
        ap.error(f"--val-crop-ratio must be in (0, 1], not {args.val_crop_ratio}")
    if args.val_size is None:
        args.val_size = args.image_size
    return args


def learning_rate(samples: int, steps_per_epoch: int, args: argparse.Namespace,
                  world: World) -> float:
    """Linear scaling (base x global batch / 256), linear warm-up, then step or cosine; where
    the schedule stands is the images trained on (all ranks), so a resume on another global
    batch goes on from there."""
    global_batch = args.batch_size * world.world_size
    peak, per_epoch = args.lr * global_batch / 256, max(steps_per_epoch, 1) * global_batch
    epoch = samples / per_epoch
    if epoch < args.warmup_epochs:
        return peak * (epoch + global_batch / per_epoch) / args.warmup_epochs
    if args.schedule == "cosine":
        span = max(args.epochs - args.warmup_epochs, 1e-9)
        return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, (epoch - args.warmup_epochs)
                                                         / span)))
    return peak * 0.1 ** sum(epoch >= args.epochs * f for f in (1 / 3, 2 / 3, 8 / 9))


@torch.no_grad()
def validate(model: nn.Module, batches: DeviceLoader, device: torch.device, world: World,
             bf16: bool) -> dict[str, float]:
    """Exact top-1/top-5: every sample once across ranks (padding masked), counts summed."""
    model.eval()
    counts = torch.zeros(3, dtype=torch.float64, device=device)
    for images, labels in batches:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(images)
        real = labels != PAD_LABEL
        top5 = logits.float().topk(5, dim=1).indices
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
    clock: BucketClock
    hint: DataWaitHint
    config: RunConfig  # what defines the run; its mean/std normalise every split
    result: dict[str, Any]
    steps_per_epoch: int  # a whole epoch's, also after a resume (the LR schedule's)
    compile: bool = False  # torch.compile the training step's model (trainkit.compiled)
    ckpt: Path | None = None
    step: int = 0
    start_epoch: int = 0
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
    workers = worker_count(args.workers, world)
    options = loader_options(args, device, workers, order)
    backend = {"backend": options.backend, "device": options.device}
    if world.rank == 0:
        unit = "DALI thread" if options.backend == "dali" else "worker"
        print(f"loader: {options.backend} backend, decoding on the {options.device}, "
              f"{workers} {unit}{'' if workers == 1 else 's'} per rank", flush=True)
        log({"loader": backend}, args.log_json)
    train_loader, val_loader = make_loaders(args, world, options)
    sizes = train_loader.output_sizes  # the loader's, each epoch's in its plan
    if world.rank == 0:
        print(compiled.line(args.compile, compile_on, device, sizes), flush=True)
        log({"compile": {"mode": args.compile, "on": compile_on, "sizes": list(sizes)}},
            args.log_json)
    config = run_config(args, world, workers=workers, bf16=precision.bf16)
    model = model_by_name(args.arch, config.num_classes).to(device)
    model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    # (the loaders' batches come channels_last too: data.MEMORY_FORMAT)
    if args.sync_bn and distributed.grouped():
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    optimizer = torch.optim.SGD(param_groups(model, args.weight_decay), lr=args.lr,
                                momentum=args.momentum, nesterov=False)
    hint = DataWaitHint(workers, world.cores_per_rank(), world.local_world_size,
                        staged=args.stage_from is not None,
                        one_cpu=read_limits().affinity == 1 < (os.cpu_count() or 1))
    return Run(args, world, device, precision, train_loader, val_loader, model, model,
               optimizer, BucketClock(wire_dtype(args.allreduce_dtype)), hint, config,
               {"backend": dist_backend, "world_size": world.world_size,
                "precision": precision.record(), "loader": backend,
                "synthetic": args.synthetic, "compile": compile_on},
               train_loader.batches_per_epoch, ckpt=ckpt, compile=compile_on)


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
    run.step, run.start_epoch = int(state["step"]), int(state["loader"]["epoch"])
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
        optimise(run, images, labels, t0)
        run.seen += images.shape[0]
        run.samples += images.shape[0] * run.world.world_size  # equal batches on every rank
        if run.step % args.log_every == 0:  # logged before its checkpoint: a kill between
            log_interval(run, epoch)  # the two makes the resumed run log the step again
        if args.checkpoint_every and run.step % args.checkpoint_every == 0:
            save(run)
        if args.steps and run.step >= args.steps:
            return False


def optimise(run: Run, images: torch.Tensor, labels: torch.Tensor, t0: float) -> None:
    """One step; the time since ``t0`` split into data wait, forward+backward, exposed
    all-reduce and optimizer."""
    args, net = run.args, run.net
    t1 = time.perf_counter()
    for group in run.optimizer.param_groups:
        group["lr"] = learning_rate(run.samples, run.steps_per_epoch, args, run.world)
    with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.precision.bf16):
        loss = F.cross_entropy(net(images).float(), labels,
                               label_smoothing=args.label_smoothing)
    if not torch.isfinite(loss):
        raise TrainError(f"rank {run.world.rank}: loss is {loss.item()} at step {run.step}; "
                         "lower --lr or check the data")
    loss.backward()
    run.sync()
    t2 = time.perf_counter()
    exposed = max(0.0, t2 - run.clock.last_ready) if distributed.grouped() else 0.0
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.sync()
    t3 = time.perf_counter()
    run.split.add(t1 - t0, (t2 - t1) - exposed, exposed, t3 - t2)
    run.losses.append(loss.item())
    run.step += 1


def log_interval(run: Run, epoch: int) -> None:
    """Reduce and print the interval's split (rank 0), and the data-wait hint once."""
    rec = report(run.split, run.seen, run.t_log, run.world.world_size, run.world.rank,
                 run.device, run.step, epoch, run.losses[-1])
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
    """Exact top-1/top-5 on the val split, printed and logged by rank 0."""
    if run.val_loader is None:
        return
    val = run.result["val"] = validate(run.model, run.batches(run.val_loader), run.device,
                                       run.world, run.precision.bf16)
    if run.world.rank == 0:
        log({"step": run.step, "val": val}, run.args.log_json)
        print(f"val: top-1 {val['top1']:.3f} top-5 {val['top5']:.3f} on {val['samples']} "
              "images", flush=True)


def save(run: Run) -> None:
    """A checkpoint when --checkpoint is given (rank 0 writes, every rank waits)."""
    if run.ckpt is None:
        return
    if run.world.rank == 0:
        save_checkpoint(run.ckpt, {
            "model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
            "step": run.step, "samples": run.samples, "loader": run.train_loader.state_dict(),
            "rng": torch.get_rng_state(), "config": run.config.record()})
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
