"""Rank-aware multiprocess loaders over imgprep shards and label lists.

Every rank yields exactly the same number of batches per epoch (stated from the manifest
before the epoch starts); epoch order is a pure function of (seed, epoch, World) and can be
resumed at any batch; batches leave as uint8 NCHW and are normalised on the device. Two
decoding backends make the same batches: ``pillow`` (the default) and ``dali`` (NVIDIA DALI,
``pip install 'imgprep[dali]'``; imported only when asked for).
"""

from pathlib import Path
from typing import Any

from imgprep.job.world import World
from imgprep.shards.manifest import read_manifest
from loaders.backends import BACKENDS
from loaders.common import PAD_LABEL, Loader, LoaderError, worker_count
from loaders.device import DeviceLoader, normalize
from loaders.epochs import PAD, job_summary, plan_epoch
from loaders.labellist import LabelListLoader, read_label_list
from loaders.shards import ShardLoader
from loaders.transforms import TrainTransform, ValTransform


def make_loader(data: str | Path, split: str, world: World, batch_size: int,
                workers: int | str = "auto", seed: int = 0, **options: Any) -> Loader:
    """The loader for ``data``.

    Args:
        data: a folder with ``<split>.json`` (shards or a label list, full or node-local), or
            a ``path label`` list file.
        split: ``"train"`` or ``"val"`` (which sets shuffling, tail and transform defaults).
        world: this rank.
        batch_size: per rank.
        workers: decoding processes per rank; ``"auto"`` sizes them from the cores this rank
            may use (``loaders.common.worker_count``); 0 decodes in the calling process.
        seed: the epoch orders' and augmentations' seed.
        options: go to the loader (``tail``, ``mode``, ``transform``, ``on_error``,
            ``shuffle``, ``backend`` (``"pillow"`` or ``"dali"``), ``device`` (``"cpu"``, or
            ``"gpu"`` with the dali backend) …).
    """
    workers = worker_count(workers, world)
    path = Path(data)
    if path.is_file():
        return LabelListLoader(path, world, batch_size, workers, seed,
                               train=split == "train", **options)
    m = read_manifest(path, split)
    if m.format == "list":
        return LabelListLoader(path / (m.list_file or f"{split}.txt"), world, batch_size,
                               workers, seed, root=path, train=split == "train",
                               num_classes=len(m.classes), mean=tuple(m.mean),
                               std=tuple(m.std), **options)
    return ShardLoader(path, split, world, batch_size, workers, seed, **options)


__all__ = ["BACKENDS", "PAD", "PAD_LABEL", "DeviceLoader", "LabelListLoader", "Loader",
           "LoaderError", "ShardLoader", "TrainTransform", "ValTransform", "job_summary",
           "make_loader", "normalize", "plan_epoch", "read_label_list", "worker_count"]
