"""The decoder backends (``dali``, ``nvjpeg``) against the Pillow backend: what their tests
share. The data: 57 samples in UNEQUAL shards (each a 256x256 JPEG whose label is its sample
id, train and val), and 12 converted-size images (256 px on the short side, landscape and
portrait: even margins, so every backend's center crop has the same box). A loader of any
backend at small sizes, explicit Worlds, labels step by step, and a JPEG corrupted in place."""

from __future__ import annotations

import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from imgprep import World
from loaders import LoaderOptions, ShardLoader
from loaders.transforms import TrainTransform, ValTransform
from tests.support.images import jpeg
from tests.support.shards import UNEQUAL_SIZES, key_of, write_split

SIZES = UNEQUAL_SIZES
TOTAL = sum(SIZES)
BATCH = 3
SMALL_TRAIN = TrainTransform(size=32)
SMALL_VAL = ValTransform(size=32)
LAYOUTS = {"1x2": (1, 2, "replicate"), "1x3": (1, 3, "replicate"),
           "2x2": (2, 2, "replicate"), "2x2-partition": (2, 2, "partition")}

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class Backend:
    """A decoder backend as its tests run it, and the promises that differ between them."""

    name: str
    workers: tuple[int, ...]  # the worker counts it is run with (the first by default)
    val_mean_abs_diff: float  # of 255, per image: val crops of 256 px images against Pillow's
    resumes_pixels: bool  # a mid-epoch resume gives the uninterrupted run's pixels too
    trainer_line: str  # the trainer's loader line with --workers 1 on the CPU


DALI = Backend(name="dali", workers=(2,), val_mean_abs_diff=1.0, resumes_pixels=False,
               trainer_line="loader: dali backend, decoding on the cpu, 1 DALI thread per rank")
NVJPEG = Backend(name="nvjpeg", workers=(0, 2), val_mean_abs_diff=0.0, resumes_pixels=True,
                 trainer_line="loader: nvjpeg backend, decoding on the cpu, 1 worker per rank")


def write_samples(folder: Path) -> Path:
    """The 57 samples as a train and a val split in ``folder``."""
    for split in ("train", "val"):
        write_split(folder, split, SIZES, lambda i: jpeg((256, 256), seed=i))
    return folder


def write_wide(folder: Path) -> Path:
    """The 12 converted-size images as a train and a val split in ``folder``."""
    for split in ("train", "val"):
        write_split(folder, split, (5, 7),
                    lambda i: jpeg((320, 256) if i % 2 else (256, 384), seed=100 + i))
    return folder


def corrupt(folder: Path, sample: int) -> str:
    """Flip the first 16 bytes of ``sample``'s JPEG (not its tar header); its shard."""
    for shard in sorted(folder.glob("train-*.tar")):
        with tarfile.open(shard) as tf:
            if f"{key_of(sample)}.jpg" not in tf.getnames():
                continue
            at = tf.getmember(f"{key_of(sample)}.jpg").offset_data
        with open(shard, "r+b") as f:
            f.seek(at)
            chunk = f.read(16)
            f.seek(at)
            f.write(bytes(b ^ 0xFF for b in chunk))
        return shard.name
    raise AssertionError(f"sample {sample} is in no shard")


def worlds(nodes: int, local: int) -> list[World]:
    return [World(rank=r, world_size=nodes * local, local_rank=r % local,
                  local_world_size=local, node_rank=r // local, num_nodes=nodes)
            for r in range(nodes * local)]


def loader(folder: Path, split: str, world: World, backend: str, **kw: Any) -> ShardLoader:
    """A loader of any backend at 32 px: the Pillow one decodes in the calling process, the
    others with their first worker count, unless ``workers`` says otherwise."""
    mode = kw.pop("mode", None)
    workers = {b.name: b.workers[0] for b in (DALI, NVJPEG)}.get(backend, 0)
    given = {"batch_size": BATCH, "transform": SMALL_TRAIN if split == "train" else SMALL_VAL,
             "workers": workers, "backend": backend} | kw
    return ShardLoader(folder, split, world, LoaderOptions(**given), mode=mode)


def steps(batches: Sequence[Batch]) -> list[list[int]]:
    """The labels of each batch."""
    return [labels.tolist() for _, labels in batches]


def same_pixels(a: Sequence[Batch], b: Sequence[Batch]) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) for x, y in zip(a, b, strict=True))
