"""Train on an imgprep folder with plain PyTorch DDP; resume mid-epoch from a checkpoint.

    torchrun --nproc-per-node 2 examples/ddp_train.py DATA --out ckpt
    torchrun --nproc-per-node 2 examples/ddp_train.py DATA --out ckpt2 --resume ckpt/last.pt

(mpirun and srun start it too.) Each rank loads its own share (imgprep.detect reads the
launcher's World); rank 0 writes one checkpoint file holding the loader's state, which every
rank loads: the state is the same on every rank (docs/integrations.md).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from imgprep import detect
from loaders import PAD_LABEL, DeviceLoader, LoaderOptions, TrainTransform, make_loader


def main(argv: list[str] | None = None, on_batch: Callable[..., Any] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", default="auto")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--save-every", type=int, default=100, help="steps between checkpoints")
    p.add_argument("--resume", type=Path, help="a checkpoint file (OUT/last.pt)")
    args = p.parse_args(argv)
    world, cuda = detect(), torch.cuda.is_available()
    device = torch.device("cuda", world.local_rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")  # the launcher's MASTER_ADDR/PORT
    workers = args.workers if args.workers == "auto" else int(args.workers)
    options = LoaderOptions(batch_size=args.batch_size, workers=workers, tail="pad",
                            transform=TrainTransform(size=args.image_size))
    loader = make_loader(args.data, "train", world, options)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(16, args.num_classes)).to(device)
    model = DistributedDataParallel(net, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    if args.resume:  # rank 0's file, loaded by every rank
        state = torch.load(args.resume, map_location="cpu", weights_only=True)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
    first = loader.state_dict()["epoch"]
    batches = DeviceLoader(loader, device, loader.mean, loader.std)  # its state: as handed out
    for epoch in range(first, args.epochs):
        if epoch != first or not args.resume:
            loader.set_epoch(epoch)  # starts the epoch over: not on the one resumed mid-way
        done, steps = batches.state_dict()["batch"], loader.batches_per_epoch
        for step, (images, labels) in enumerate(batches, start=done + 1):
            loss = F.cross_entropy(model(images), labels, ignore_index=PAD_LABEL)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % args.save_every == 0 and world.rank == 0:
                args.out.mkdir(parents=True, exist_ok=True)
                torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                            "loader": batches.state_dict()}, args.out / "last.pt.tmp")
                os.replace(args.out / "last.pt.tmp", args.out / "last.pt")  # whole or absent
            if on_batch is not None:  # a hook for logging (the tests record batches)
                on_batch(epoch, step, images, labels, steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
