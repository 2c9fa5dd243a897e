"""Train on an imgprep folder with Hugging Face Accelerate; resume mid-epoch from a checkpoint.

    pip install 'imgprep[accelerate]'
    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_train.py DATA --out ckpt
    (the same) ... DATA --out ckpt2 --resume ckpt/epoch0000-step000100   # on from step 100

(``--multi_gpu`` is Accelerate's torchrun launcher; add ``--cpu`` to train on the CPU, Gloo.)

Each rank loads its own share (the World is the launcher's, checked against Accelerate's);
accelerator.save_state writes the loader's position with the model and optimizer, and
load_state gives it back, so a resumed run yields exactly the batches the interrupted one had
left, and goes on with fewer ranks too (docs/integrations.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator

from loaders import PAD_LABEL, LoaderOptions, TrainTransform, make_loader
from loaders.accelerate import accelerate_world, prepare_loader


def save(accelerator: Accelerator, out: Path, name: str) -> None:
    """``accelerator.save_state`` under a temporary name, renamed once every rank is done."""
    accelerator.save_state(out / f".{name}")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (out / f".{name}").rename(out / name)


def main(argv: list[str] | None = None, on_batch: Callable[..., Any] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cpu", action="store_true", help="run on the CPU (Gloo) with GPUs present")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", default="auto")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--save-every", type=int, default=100, help="steps between checkpoints")
    p.add_argument("--resume", type=Path, help="a checkpoint folder (OUT/epochE-stepS)")
    args = p.parse_args(argv)
    accelerator = Accelerator(cpu=args.cpu or not torch.cuda.is_available())
    workers = args.workers if args.workers == "auto" else int(args.workers)
    options = LoaderOptions(batch_size=args.batch_size, workers=workers, tail="pad",
                            transform=TrainTransform(size=args.image_size))
    raw = make_loader(args.data, "train", accelerate_world(accelerator.state), options)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(16, args.num_classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = prepare_loader(accelerator, raw)  # normalised on the device, registered
    if args.resume:
        accelerator.load_state(args.resume)
    for epoch in loader.epochs(args.epochs):  # from the restored position, then whole epochs
        steps = len(loader)  # the epoch's, counting the steps done before a resume
        for images, labels in loader:
            loss = F.cross_entropy(model(images), labels, ignore_index=PAD_LABEL)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if loader.steps % args.save_every == 0:
                save(accelerator, args.out, f"epoch{epoch:04d}-step{loader.steps:06d}")
            if on_batch is not None:  # a hook for logging (the tests record batches)
                on_batch(epoch, loader.steps, images, labels, steps)


if __name__ == "__main__":
    main()
