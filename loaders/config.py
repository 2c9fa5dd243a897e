"""What a loader is told, and what its decoder backend computes batches from.

- ``LoaderOptions``: how a loader runs, whatever its source (shards or a label list): the
  options of ``loaders.make_loader`` past the data, split and World, with their defaults,
  validated when made, so that a wrong value fails before anything is read.
- ``Config``: what a loader and its backend (its workers too) both need to compute a rank's
  batches: the sample counts plans are made from, the World, and the options with the
  split's defaults filled in (``LoaderOptions.config``).
- ``BackendOptions``: how a decoder backend runs: where batches go and what it may keep in
  flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from imgprep.job.assign import MODES
from imgprep.job.world import World
from loaders.batch import MEMORY_FORMATS
from loaders.epochs import PAD, TAILS, EpochPlan, plan_epoch
from loaders.order import ORDER_VERSION, check_order_version
from loaders.transforms import TrainTransform, Transform, ValTransform

DEVICES = ("cpu", "gpu")  # where batches are decoded ("gpu": this rank's, the dali backend)
ON_ERROR = ("raise", "skip")  # an undecodable sample: fail the epoch, or replace and count it


def check_policies(batch_size: int, workers: int, tail: str | None, on_error: str,
                   memory_format: str) -> None:
    """Refuse option values no loader understands (programming errors: ValueError); a
    ``tail`` of None is left to the split."""
    if batch_size < 1 or workers < 0:
        raise ValueError("batch_size must be >= 1 and workers >= 0")
    if tail is not None and tail not in TAILS:
        raise ValueError(f"tail must be one of {TAILS}")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}")
    if memory_format not in MEMORY_FORMATS:
        raise ValueError(f"memory_format must be one of {MEMORY_FORMATS}, not "
                         f"{memory_format!r}")


def worker_count(workers: int | str, world: World) -> int:
    """Loader workers for one rank: ``workers`` itself, or for ``"auto"`` the cores this
    rank may use (``World.cores_per_rank``: the process's CPU affinity shared by the ranks of
    its node) less one that stays with the rank's own process, which runs the training step
    and copies every batch out of the ring; at least one worker, so decoding never stalls
    the step (docs/loaders.md, "Worker count")."""
    if workers == "auto":
        return max(1, world.cores_per_rank() - 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be 'auto' or an integer >= 0, not {workers!r}")
    return workers


def _check_transform(transform: object) -> None:
    if not isinstance(transform, TrainTransform | ValTransform):
        raise ValueError(f"transform must be a TrainTransform or a ValTransform, not "
                         f"{transform!r}")


@dataclass(frozen=True, eq=False, kw_only=True)
class Config:
    """What a loader and its backend both need to compute a rank's batches."""

    samples: tuple[int, ...]  # per shard (a list: one entry, all of its lines)
    world: World
    mode: str  # replicate or partition
    layout_seed: int  # places shards on nodes and orders each epoch
    seed: int  # augmentation draws
    batch_size: int
    workers: int
    transform: Transform
    tail: str
    shuffle: bool
    on_error: str
    memory_format: str
    order_version: int = ORDER_VERSION  # how epoch orders are drawn (loaders.order)

    def __post_init__(self) -> None:
        check_policies(self.batch_size, self.workers, self.tail, self.on_error,
                       self.memory_format)
        check_order_version(self.order_version)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")
        if not self.samples or min(self.samples) < 0:
            raise ValueError(f"samples must be one count >= 0 a shard, not {self.samples}")
        _check_transform(self.transform)

    def plan(self, epoch: int, starts: tuple[int, ...]) -> EpochPlan:
        return plan_epoch(self.samples, self.world, self.mode, self.layout_seed, epoch,
                          self.batch_size, self.workers, self.tail, self.shuffle, starts,
                          self.order_version)

    @property
    def channels_last(self) -> bool:
        """Whether batch rows are stored H x W x 3 (``memory_format="channels_last"``)."""
        return self.memory_format == "channels_last"

    def slots(self, plan: EpochPlan, b: int) -> np.ndarray:
        """Batch ``b``'s slots: sample ids, and PAD for padding (tail="pad"; the others'
        last batches are shorter instead)."""
        row = plan.table[b]
        return row if self.tail == "pad" else row[row != PAD]


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """How a loader runs, whatever its source (the keyword options of ``make_loader``,
    ``ShardLoader`` and ``LabelListLoader``, which take their defaults from here).

    Attributes:
        batch_size: per rank.
        workers: decoding processes per rank; 0 decodes in the calling process.
        seed: the epoch orders' and augmentations' seed.
        transform: a ``TrainTransform`` or ``ValTransform`` (size, crop, flip).
        tail: how an epoch ends: ``"drop"`` (full batches only), ``"short"`` (every sample
            once, short last batches), ``"pad"`` (every sample once; padding slots: label
            ``PAD_LABEL``, zero pixels) or ``"uneven"`` (every sample once, counts differ
            between ranks).
        shuffle: a new seeded order every epoch, or the data's own order.
        on_error: an undecodable sample: ``"raise"``, or ``"skip"`` (a good sample of the
            same batch takes its slot; counted in ``skipped``).
        pin_memory: CPU batches in pinned memory; None: when torch sees a CUDA device.
        prefetch_factor: batches made ahead (per worker with the pillow backend).
        backend: the decoder backend, a name of ``loaders.backends.BACKENDS``: ``"pillow"``
            (worker processes) or ``"dali"`` (NVIDIA DALI, the optional extra
            ``imgprep[dali]``): the same batches, decoded another way.
        device: where samples are decoded: ``"cpu"``, or with the dali backend ``"gpu"``
            (GPU ``local_rank``, CUDA batches out).
        memory_format: how the images of a batch lie in memory, a name of
            ``loaders.batch.MEMORY_FORMATS``: ``"contiguous"`` (NCHW) or
            ``"channels_last"`` (decoded as H x W x 3 rows and handed over NCHW-shaped with
            ``torch.channels_last`` strides: the same values, no transpose anywhere on the CPU
            for a model that runs channels_last).
        order_version: how epoch orders are drawn (``loaders.order``): 2 (the default: each
            rank computes only its own share of the order) or 1 (the order of checkpoints
            written before versions were recorded: make the loader with 1 to resume one).

    ``None`` leaves the choice to the split: training augments (``TrainTransform()``),
    ends with ``tail="drop"`` and shuffles; validation center-crops (``ValTransform()``),
    pads (``tail="pad"``) and keeps the order.
    """

    batch_size: int
    workers: int = 4
    seed: int = 0
    transform: Transform | None = None
    tail: str | None = None
    shuffle: bool | None = None
    on_error: str = "raise"
    pin_memory: bool | None = None
    prefetch_factor: int = 2
    backend: str = "pillow"
    device: str = "cpu"
    memory_format: str = "contiguous"
    order_version: int = ORDER_VERSION

    def __post_init__(self) -> None:
        check_policies(self.batch_size, self.workers, self.tail, self.on_error,
                       self.memory_format)
        check_order_version(self.order_version)
        if self.transform is not None:
            _check_transform(self.transform)
        if self.prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be >= 1, not {self.prefetch_factor}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, not {self.device!r}")

    def config(self, *, train: bool, samples: Sequence[int], world: World, mode: str,
               layout_seed: int) -> Config:
        """The ``Config`` of a loader with these options over ``samples``, the split's
        defaults filled in (``train``: the training split's)."""
        return Config(samples=tuple(int(n) for n in samples), world=world, mode=mode,
                      layout_seed=layout_seed, seed=self.seed, batch_size=self.batch_size,
                      workers=self.workers,
                      transform=self.transform or (TrainTransform() if train else ValTransform()),
                      tail=self.tail or ("drop" if train else "pad"),
                      shuffle=train if self.shuffle is None else self.shuffle,
                      on_error=self.on_error, memory_format=self.memory_format,
                      order_version=self.order_version)


@dataclass(frozen=True, kw_only=True)
class BackendOptions:
    """How a decoder backend runs: where batches go, and what it may keep in flight."""

    device: str  # "cpu", or "gpu" (decoded on this rank's GPU: the dali backend)
    pin: bool  # CPU batches in pinned memory (for fast copies to a GPU)
    prefetch_factor: int  # batches made ahead (per worker for the pillow backend)
    pools: int  # pools of the plans (a ring counter each)

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, not {self.device!r}")
        if self.prefetch_factor < 1 or self.pools < 1:
            raise ValueError("prefetch_factor and pools must be >= 1")
