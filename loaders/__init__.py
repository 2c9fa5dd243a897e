"""Rank-aware multiprocess loaders over imgprep shards and label lists.

Every rank yields exactly the same number of batches per epoch (stated from the manifest
before the epoch starts); epoch order is a pure function of (seed, epoch, World) and can be
resumed at any batch; batches leave as uint8 NCHW (contiguous, or with channels_last strides:
``memory_format``), copied out of the workers' shared memory or handed over in place
(``loader.in_place()``), and are normalised on the device. Samples
come from a *source* (a shard set or a label list); decoder *backends* make the same
batches from them: ``pillow`` (the default), ``dali`` (NVIDIA DALI,
``pip install 'imgprep[dali]'``) and ``nvjpeg`` (torchvision's nvJPEG on the GPU); each
imported only when asked for. Training transforms may add an automatic augmentation policy
(``TrainTransform(augment=augment_policy("ta_wide"))``: ``loaders.augment``, the pillow
backend). Batch-level augmentation (random erasing, mixup, cutmix:
``LoaderOptions.random_erase``, ``mixup``) is drawn with each batch and carried out by
``DeviceLoader`` on the device (``loaders.mixing``).
"""

from pathlib import Path

from imgprep import World, read_manifest
from loaders.augment import POLICIES as AUGMENT_POLICIES
from loaders.augment import policy as augment_policy
from loaders.backends import BACKENDS, GPU_BACKENDS
from loaders.batch import PAD_LABEL
from loaders.config import LoaderOptions, PlannedEpoch, pins_cpus, worker_count
from loaders.decode import SampleDecoder
from loaders.device import DeviceLoader, normalize
from loaders.epochs import PAD, job_summary, plan_epoch
from loaders.errors import LoaderError, refuse_unlabelled
from loaders.labellist import LabelListLoader, read_label_list
from loaders.legacy import takes_loose_options
from loaders.mixing import BatchDraws, Mixup, RandomErasing, draw_batch
from loaders.order import ORDER_KEY, ORDER_VERSION
from loaders.placement import cpu_line
from loaders.protocol import Loader
from loaders.resumable import ResumableLoader
from loaders.schedule import SizeSchedule
from loaders.shards import ShardLoader
from loaders.sizing import DemandSizing
from loaders.transforms import TrainTransform, Transform, ValTransform


@takes_loose_options
def make_loader(data: str | Path, split: str, world: World, options: LoaderOptions, *,
                mode: str | None = None, root: Path | None = None,
                num_classes: int | None = None, mean: tuple[float, ...] | None = None,
                std: tuple[float, ...] | None = None) -> Loader:
    """The loader for ``data``: a ``ShardLoader`` or a ``LabelListLoader``.

    Args:
        data: a folder with ``<split>.json`` (shards or a label list, full or node-local), or
            a ``path label`` list file.
        split: ``"train"`` or ``"val"``, which sets the defaults of ``options.transform``,
            ``tail`` and ``shuffle``.
        world: this rank.
        options: how the loader runs (``LoaderOptions``: batch size, workers, seed, …).
        mode: shards only: ``"replicate"`` or ``"partition"`` (node-local manifests fix it).
        root, num_classes, mean, std: a list file only (a folder's manifest says them): the
            folder its paths are relative to (default: the list's), the class count (default:
            its ``classes.txt``, else the largest label + 1), the normalisation statistics.
    """
    path = Path(data)
    train = split == "train"
    if not path.is_file():
        m = read_manifest(path, split)
        refuse_unlabelled(m, path)
        given = {"root": root, "num_classes": num_classes, "mean": mean, "std": std}
        if named := [k for k, v in given.items() if v is not None]:
            raise ValueError(f"{', '.join(named)}: {path}/{split}.json says them; pass them "
                             "only with a list file")
        if m.format != "list":
            return ShardLoader(path, split, world, options, mode=mode)
        path, root = path / (m.list_file or f"{split}.txt"), path
        num_classes, mean, std = len(m.classes), tuple(m.mean), tuple(m.std)
    if mode not in (None, "replicate"):
        raise ValueError(f"mode={mode!r}: every rank loads a label list whole (replicate); "
                         "leave mode unset")
    return LabelListLoader(path, world, options, root=root, train=train,
                           num_classes=num_classes, mean=mean or (), std=std or ())


__all__ = ["AUGMENT_POLICIES", "BACKENDS", "GPU_BACKENDS", "ORDER_KEY", "ORDER_VERSION",
           "PAD", "PAD_LABEL", "BatchDraws", "DemandSizing", "DeviceLoader", "LabelListLoader",
           "Loader", "LoaderError", "LoaderOptions", "Mixup", "PlannedEpoch",
           "RandomErasing", "ResumableLoader", "SampleDecoder", "ShardLoader",
           "SizeSchedule", "TrainTransform", "Transform", "ValTransform",
           "augment_policy", "cpu_line", "draw_batch", "job_summary", "make_loader", "normalize",
           "pins_cpus", "plan_epoch", "read_label_list", "worker_count"]
