"""Train a ResNet data-parallel on imgprep shards, and show where each iteration's time goes.

Launch it any of these ways (the same flags everywhere):

    python scripts/train_imagenet.py --data DIR --arch tiny --steps 200         # one process
    torchrun --nproc-per-node 2 scripts/train_imagenet.py --data DIR ...         # torchrun
    mpirun -np 2 python scripts/train_imagenet.py --data DIR ...                 # Open MPI
    srun -N 2 --ntasks-per-node 4 python scripts/train_imagenet.py --data DIR ...

NCCL with CUDA (one GPU per local rank), Gloo on CPU; under mpirun rank 0's address and a
free port go out over mpi4py. Every ``--log-every`` steps rank 0 prints images/s (global and
per rank) and the iteration's time split — data wait, forward+backward, exposed all-reduce,
optimizer — as the mean and max over ranks, and appends a JSON line to ``--log-json``.
Checkpoints are written atomically by rank 0; ``--resume`` restores model, optimizer, step,
loader position and RNG, so a resumed CPU run gives the same losses as an uninterrupted one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainkit import distributed  # noqa: E402
from trainkit.models import model_by_name, param_groups  # noqa: E402
from trainkit.timing import BucketClock, Split, reduce_split, wire_dtype  # noqa: E402

from imgprep.errors import ImgprepError  # noqa: E402
from imgprep.fsutil import atomic_open  # noqa: E402
from imgprep.manifest import manifest_path  # noqa: E402
from imgprep.world import World, detect  # noqa: E402
from loaders import (  # noqa: E402
    PAD_LABEL,
    DeviceLoader,
    Loader,
    TrainTransform,
    ValTransform,
    make_loader,
)


class TrainError(ImgprepError, RuntimeError):
    """Training cannot go on (a non-finite loss, a bad checkpoint); the message says why."""


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
    ap.add_argument("--workers", type=int, default=4, help="loader workers per rank")
    ap.add_argument("--image-size", type=int, default=224, help="train crop (val: center)")
    ap.add_argument("--lr", type=float, default=0.1, help="per 256 images (Goyal et al.)")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--warmup-epochs", type=float, default=5.0)
    ap.add_argument("--schedule", choices=["step", "cosine"], default="step")
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--sync-bn", action="store_true")
    ap.add_argument("--allreduce-dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                    help="bf16 autocast for forward/backward")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: cores/ranks)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", type=Path, default=None, help="checkpoint folder")
    ap.add_argument("--checkpoint-every", type=int, default=0, help="steps (0: epoch ends)")
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    ap.add_argument("--validate", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--log-json", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=300.0, help="process-group timeout, s")
    args = ap.parse_args(argv)
    if args.fanout and args.stage_mode != "replicate":
        ap.error("--fanout goes with --stage-mode replicate")
    return args


def learning_rate(step: int, steps_per_epoch: int, args: argparse.Namespace,
                  world: World) -> float:
    """Linear scaling (base x global batch / 256), linear warm-up, then step or cosine."""
    peak = args.lr * args.batch_size * world.world_size / 256
    epoch = step / max(steps_per_epoch, 1)
    if epoch < args.warmup_epochs:
        return peak * (epoch + 1 / max(steps_per_epoch, 1)) / args.warmup_epochs
    if args.schedule == "cosine":
        span = max(args.epochs - args.warmup_epochs, 1e-9)
        return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, (epoch - args.warmup_epochs)
                                                         / span)))
    return peak * 0.1 ** sum(epoch >= args.epochs * f for f in (1 / 3, 2 / 3, 8 / 9))


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Atomic: a kill during the write leaves the previous checkpoint loadable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path) as f:
        torch.save(state, f)


def load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError) as e:
        raise TrainError(f"cannot load checkpoint {path}: {e}; delete it or start without "
                         "--resume") from e
    return state


@torch.no_grad()
def validate(model: nn.Module, loader: Loader, device: torch.device, world: World,
             bf16: bool) -> dict[str, float]:
    """Exact top-1/top-5: every sample once across ranks (padding masked), counts summed."""
    model.eval()
    counts = torch.zeros(3, dtype=torch.float64, device=device)
    for images, labels in DeviceLoader(loader, device, loader.mean, loader.std):
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


def train(args: argparse.Namespace, world: World) -> dict[str, Any]:
    if args.threads or not torch.cuda.is_available():
        torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1)
                                                  // world.local_world_size))
    backend = distributed.init(world, args.timeout)
    device = distributed.device_for(world)
    if args.stage_from is not None:
        from imgprep.stage import StageOptions, stage_to_node

        stage_to_node(StageOptions(args.stage_from, args.data, mode=args.stage_mode,
                                   timeout=args.timeout, fanout=args.fanout), world)
    torch.manual_seed(args.seed)
    train_loader = make_loader(args.data, "train", world, args.batch_size, args.workers,
                               args.seed, transform=TrainTransform(size=args.image_size))
    no_val = args.data.is_dir() and not manifest_path(args.data, "val").exists()
    if args.validate and no_val and world.rank == 0:
        print(f"train_imagenet: warning: {args.data} has no val split (no val.json): training "
              "without validation; make one with imgprep convert ILSVRC2012_img_val.tar -o "
              f"{args.data} --labels <ground truth>", file=sys.stderr, flush=True)
    val_loader = make_loader(args.data, "val", world, args.batch_size, args.workers, args.seed,
                             transform=ValTransform(size=args.image_size,
                                                    resize=round(args.image_size * 256 / 224)),
                             ) if args.validate and not no_val else None
    model = model_by_name(args.arch, train_loader.num_classes).to(device)
    model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    if args.sync_bn and world.is_distributed:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    optimizer = torch.optim.SGD(param_groups(model, args.weight_decay), lr=args.lr,
                                momentum=args.momentum, nesterov=False)
    start_epoch = step = 0
    resumed = False
    ckpt = args.checkpoint / "last.pt" if args.checkpoint else None
    if args.resume and ckpt is not None and ckpt.exists():
        resumed = True
        state = load_checkpoint(ckpt)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, start_epoch = int(state["step"]), int(state["loader"]["epoch"])
        train_loader.load_state_dict(state["loader"])
        torch.set_rng_state(state["rng"])
    clock = BucketClock(wire_dtype(args.allreduce_dtype))
    net: nn.Module = model
    if world.is_distributed:
        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                  gradient_as_bucket_view=True)
        net.register_comm_hook(dist.group.WORLD, clock.hook)
    steps_per_epoch = train_loader.batches_per_epoch  # a whole epoch's, also after a resume
    split, seen, t_log = Split(), 0, time.perf_counter()
    losses: list[float] = []
    result: dict[str, Any] = {"backend": backend, "world_size": world.world_size}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for epoch in range(start_epoch, args.epochs):
        if not (resumed and epoch == start_epoch):  # a resumed epoch goes on where it stopped
            train_loader.set_epoch(epoch)
        batches = iter(DeviceLoader(train_loader, device, train_loader.mean, train_loader.std))
        while True:
            t0 = time.perf_counter()
            try:
                images, labels = next(batches)
            except StopIteration:
                break
            sync()
            t1 = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, steps_per_epoch, args, world)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                loss = F.cross_entropy(net(images).float(), labels,
                                       label_smoothing=args.label_smoothing)
            if not torch.isfinite(loss):
                raise TrainError(f"rank {world.rank}: loss is {loss.item()} at step {step}; "
                                 "lower --lr or check the data")
            loss.backward()
            sync()
            t2 = time.perf_counter()
            exposed = max(0.0, t2 - clock.last_ready) if world.is_distributed else 0.0
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            t3 = time.perf_counter()
            split.add(t1 - t0, (t2 - t1) - exposed, exposed, t3 - t2)
            losses.append(loss.item())
            step += 1
            seen += images.shape[0]
            if ckpt is not None and args.checkpoint_every and step % args.checkpoint_every == 0:
                checkpoint(ckpt, model, optimizer, step, train_loader, world, args)
            if step % args.log_every == 0:
                rec = report(split, seen, t_log, world, device, step, epoch, losses[-1])
                result["last_log"] = rec
                if world.rank == 0:
                    log(rec, args.log_json)
                split, seen, t_log = Split(), 0, time.perf_counter()
            if args.steps and step >= args.steps:
                break
        if args.steps and step >= args.steps:
            break
        train_loader.set_epoch(epoch + 1)
        if ckpt is not None:
            checkpoint(ckpt, model, optimizer, step, train_loader, world, args)
    if val_loader is not None:
        result["val"] = validate(model, val_loader, device, world, args.bf16)
        if world.rank == 0:
            log({"step": step, "val": result["val"]}, args.log_json)
            print(f"val: top-1 {result['val']['top1']:.3f} top-5 {result['val']['top5']:.3f} "
                  f"on {result['val']['samples']} images", flush=True)
    if ckpt is not None:
        checkpoint(ckpt, model, optimizer, step, train_loader, world, args)
    result.update(step=step, losses=losses, wire_dtypes=sorted(clock.wire_dtypes),
                  buckets=clock.buckets, replicas_identical=replicas_identical(model, world))
    return result


def replicas_identical(model: nn.Module, world: World) -> bool:
    """Whether every rank holds the same parameters (what DDP's all-reduce guarantees)."""
    if not world.is_distributed:
        return True
    flat = torch.cat([p.detach().float().flatten().cpu() for p in model.parameters()])
    digest = torch.tensor([flat.double().sum().item(), (flat.double() ** 2).sum().item()],
                          dtype=torch.float64, device=next(model.parameters()).device)
    peak, low = digest.clone(), digest.clone()
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    if not torch.equal(peak, low):
        raise TrainError(f"rank {world.rank}: model replicas differ after training "
                         f"({digest.tolist()} vs {peak.tolist()}); gradients were not synced")
    return True


def checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int,
               loader: Loader, world: World, args: argparse.Namespace) -> None:
    if world.rank == 0:
        save_checkpoint(path, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                               "step": step, "loader": loader.state_dict(),
                               "rng": torch.get_rng_state(), "arch": args.arch})
    if world.is_distributed:
        dist.barrier()


def report(split: Split, seen: int, t_log: float, world: World, device: torch.device,
           step: int, epoch: int, loss: float) -> dict[str, Any]:
    """Reduce the interval's split over ranks; rank 0 prints one compact line per phase."""
    times = reduce_split(split, world.world_size, device)
    elapsed = time.perf_counter() - t_log
    per_rank = seen / elapsed if elapsed > 0 else 0.0
    rec = {"step": step, "epoch": epoch, "loss": loss, "images_per_s": per_rank * world.world_size,
           "images_per_s_per_rank": per_rank, **times}
    if world.rank == 0:
        m, x = times["mean"], times["max"]
        print(f"step {step} loss {loss:.3f} | {rec['images_per_s']:.1f} img/s "
              f"({per_rank:.1f}/rank) | ms mean/max: data {m['data'] * 1e3:.1f}/"
              f"{x['data'] * 1e3:.1f} fwd+bwd {m['compute'] * 1e3:.1f}/{x['compute'] * 1e3:.1f}"
              f" allreduce {m['allreduce'] * 1e3:.1f}/{x['allreduce'] * 1e3:.1f} optim "
              f"{m['optimizer'] * 1e3:.1f}/{x['optimizer'] * 1e3:.1f} | data wait "
              f"{times['data_wait_fraction']:.1%}", flush=True)
    return rec


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        world = detect()
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


if __name__ == "__main__":
    sys.exit(main())
