"""Train on an imgprep folder with PyTorch Lightning; resume mid-epoch from the last checkpoint.

    pip install 'imgprep[lightning]'
    python examples/lightning_train.py DATA --out ckpt --devices 2            # Lightning's launcher
    torchrun --nproc-per-node 2 examples/lightning_train.py DATA --out ckpt --devices 2
    python examples/lightning_train.py DATA --out ckpt --devices 2 --resume ckpt/last.ckpt

Each rank loads its own share (the World is the trainer's), Lightning sees the whole epoch's
length, and every checkpoint holds the loader's position: a resumed run yields exactly the
batches the interrupted one had left, on any launcher, and goes on with fewer ranks too
(docs/integrations.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback, ModelCheckpoint

from loaders import PAD_LABEL, LoaderOptions, TrainTransform, ValTransform
from loaders.lightning import ImgprepDataModule


class Classifier(pl.LightningModule):
    def __init__(self, num_classes: int, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(16, num_classes))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch  # normalised on the trainer's device; padding is PAD_LABEL
        return F.cross_entropy(self.net(images), labels, ignore_index=PAD_LABEL)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        images, labels = batch  # each rank its share of the split, padded to equal batches
        real = labels != PAD_LABEL
        hits = (self.net(images).argmax(1) == labels)[real].sum()
        self.log("val_acc", hits / real.sum().clamp(min=1), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def main(argv: Sequence[str] | None = None, callbacks: Sequence[Callback] = ()) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", default="auto")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--save-every", type=int, default=100, help="steps between checkpoints")
    p.add_argument("--resume", type=Path, help="a checkpoint to resume from (OUT/last.ckpt)")
    p.add_argument("--no-val", action="store_true", help="skip the val split")
    args = p.parse_args(argv)
    workers = args.workers if args.workers == "auto" else int(args.workers)
    options = LoaderOptions(batch_size=args.batch_size, workers=workers, tail="pad",
                            transform=TrainTransform(size=args.image_size))
    val = LoaderOptions(batch_size=args.batch_size, workers=workers,
                        transform=ValTransform(size=args.image_size))  # tail="pad": all once
    data = ImgprepDataModule(args.data, options, val=not args.no_val, val_options=val)
    last = ModelCheckpoint(dirpath=args.out, save_top_k=0, save_last=True,
                           every_n_train_steps=args.save_every)
    ranks = args.devices * args.nodes
    trainer = pl.Trainer(accelerator=args.accelerator, devices=args.devices, num_nodes=args.nodes,
                         strategy="ddp" if ranks > 1 else "auto", max_epochs=args.epochs,
                         callbacks=[last, *callbacks], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Classifier(args.num_classes, args.lr), datamodule=data,
                ckpt_path=args.resume)


if __name__ == "__main__":
    main()
