"""The trainer's loaders (``trainkit.data.make_loaders``) hand over channels_last batches, the
model's layout, so no batch is transposed on the CPU on its way to the model."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from imgprep.job.world import World
from loaders import DeviceLoader
from scripts.trainkit.data import loader_options, make_loaders
from tests.support import jpeg
from tests.support.shards import write_split


def test_the_trainers_batches_come_channels_last(tmp_path: Path) -> None:
    for split in ("train", "val"):
        write_split(tmp_path, split, (5, 3), lambda i: jpeg((64, 64), seed=i))
    args = argparse.Namespace(data=tmp_path, batch_size=2, seed=0, image_size=32,
                              res_schedule=None, val_size=32, val_crop_ratio=0.875,
                              validate=True, stage_from=None, loader_backend="pillow",
                              auto_augment=None, random_erase=0.0, mixup=0.0, cutmix=0.0,
                              ra_reps=1, val_resize=None)
    options = loader_options(args, torch.device("cpu"), workers=0)
    train, val = make_loaders(args, World(), options)
    assert val is not None
    for loader in (train, val):
        images, _ = next(iter(loader))
        assert images.shape == (2, 3, 32, 32)
        assert images.is_contiguous(memory_format=torch.channels_last)
        x, _ = next(iter(DeviceLoader(loader, "cpu", loader.mean, loader.std)))
        assert x.is_contiguous(memory_format=torch.channels_last)
