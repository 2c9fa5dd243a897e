"""What a loader is told, and what its decoder backend computes batches from.

- ``LoaderOptions``: how a loader runs, whatever its source (shards or a label list): the one
  record ``loaders.make_loader``, ``ShardLoader`` and ``LabelListLoader`` take past the data,
  split and World, with every default, validated when made, so that a wrong value fails
  before anything is read. A new option is a field here (with its line in the docstring)
  and its use.
- ``ResolvedOptions``: the same record with what ``None`` (and ``workers="auto"``) leaves
  open decided for one loader: the split's transform, tail and order, this rank's worker
  count and CPUs (``cpus``: its process on a core of its own, its workers on the rest of its
  share, ``imgprep.job.cpus``), pinned memory when CUDA is present
  (``LoaderOptions.resolve``).
- ``Config``: what a loader and its backend (its workers too) both need to compute a rank's
  batches: the sample counts plans are made from, the World, the node layout and the
  resolved options; ``Config.plan`` makes an epoch's ``PlannedEpoch``.
- ``PlannedEpoch``: one epoch of a rank's loader, the one record every backend makes batches
  from and the trainer reads: the epoch's sample plan, its transform (hence its output size)
  and each batch's augmentation generators (the samples', and the batch-level draws' of
  ``loaders.mixing``: ``Config.draws``).

The output size has one home: ``ResolvedOptions.sizes`` (the size schedule, or the
transform's own size every epoch) decides each epoch's, ``Config.plan`` puts it in the
epoch's transform, and nothing else derives a size.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from imgprep import MODES, CpuPlan, World, jpegcrop
from imgprep.augment import AVAILABLE as AUGMENT_BUILT
from loaders.batch import MEMORY_FORMATS
from loaders.epochs import PAD, TAILS, EpochPlan, plan_epoch, pools
from loaders.mixing import Mixup, RandomErasing, draw_batch
from loaders.order import ORDER_VERSION, check_order_version
from loaders.repeats import check_repeats
from loaders.schedule import SizeSchedule
from loaders.sizing import DemandSizing
from loaders.transforms import TrainTransform, Transform, ValTransform, check_transform

DEVICES = ("cpu", "gpu")  # where batches are decoded ("gpu": this rank's; dali and nvjpeg)
ON_ERROR = ("raise", "skip")  # an undecodable sample: fail the epoch, or replace and count it
AUTO = "auto"  # workers: sized from the cores this rank may use (worker_count)
PINNED_NICE = 10  # worker_nice where the loader pins and none is given (docs/loaders.md)
UNPINNED = ("dali",)  # backends whose decoding threads are not theirs to place
DRAWS_SALT = 0x4D1C  # sets the batch-level draws' generator apart from the samples'


def worker_count(workers: int | str, world: World, pin: bool = False) -> int:
    """Loader workers for one rank: ``workers`` itself, or for ``"auto"`` the cores this
    rank may use (``World.cores_per_rank``: the process's CPU affinity shared by the ranks of
    its node) less one that stays with the rank's own process, which runs the training step
    and copies every batch out of the ring; at least one worker, so decoding never stalls
    the step. With ``pin`` (and a CPU plan for this rank, ``World.cpu_plan``) the CPUs its
    workers are pinned to: the same less the SMT siblings of the process's core
    (docs/loaders.md, "Worker count")."""
    if workers == AUTO:
        plan = world.cpu_plan() if pin else None
        if isinstance(plan, CpuPlan):
            return len(plan.workers)
        return max(1, world.cores_per_rank() - 1)
    return _fixed_count(workers)


def pins_cpus(pin_cpus: bool | None, workers: int | str, backend: str) -> bool:
    """Whether a loader pins its process and workers to CPUs (``LoaderOptions.pin_cpus``):
    as asked, or by default with ``workers="auto"`` where torch sees a CUDA device (the
    process then launches the GPU's work; on the CPU it trains, and keeps every core), but
    never with ``dali`` (its pipelines start their own threads: ``UNPINNED``)."""
    if pin_cpus is not None:
        return pin_cpus
    return workers == AUTO and backend not in UNPINNED and torch.cuda.is_available()


def _fixed_count(workers: object) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be 'auto' or an integer >= 0, not {workers!r}")
    return workers


def _check_augment(t: Transform, backend: str) -> None:
    """Refuse augmentation where it would not be carried out: another backend than pillow
    (dali and nvjpeg draw and decode their own way), or no extension (its C ops)."""
    if not isinstance(t, TrainTransform) or t.augment is None:
        return
    name = t.augment.name
    if backend != "pillow":
        raise ValueError(f"backend={backend!r} does not carry out augmentation policies "
                         f"(transform.augment {name!r}); the pillow backend does: load with "
                         "backend='pillow', or without augment")
    if not AUGMENT_BUILT:
        raise ValueError(f"transform.augment {name!r} runs in imgprep's C extension, which is "
                         f"{jpegcrop.status()}")


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """How a loader runs, whatever its source: the record ``make_loader``, ``ShardLoader``
    and ``LabelListLoader`` take.

    Attributes:
        batch_size: the batch of one rank (the global batch is ``batch_size`` x world size).
        workers: decoding processes per rank (threads with the dali and nvjpeg backends);
            0 decodes in the calling process; ``"auto"``: the cores this rank may use less
            one (``worker_count``). With ``sizing``, the most it runs.
        pin_cpus: keep a core of this rank's share for the loader's own process (the one
            that launches the GPU's work) and pin the workers to the rest
            (``World.cpu_plan``; ``worker_count`` counts them); None: with
            ``workers="auto"`` where torch sees a CUDA device. Where the rank has one core,
            or a mask that does not say which CPUs are its own, nothing is pinned.
        worker_nice: added to the workers' nice value, 0-19: the kernel gives the loader's
            own process the CPU first where both are ready, on a core they share or beside
            other processes; None: ``PINNED_NICE`` (10) where the loader pins, else 0.
        sizing: a ``loaders.sizing.DemandSizing``: the pillow backend starts ``workers``
            and then runs as many as the consumer's demand needs (fewer while the step never
            waits and the workers idle, more when it waits), changed every ``every`` batches;
            the batches, pixels and resume are those of any fixed count. None: ``workers``
            all along.
        hw_decoder_load: the nvimgcodec backend's share of each batch decoded by the GPU's
            hardware JPEG decoders, 0-1 (the rest by the CPU threads beside them); None:
            ``loaders.nvimgcodec.HW_LOAD``.
        seed: the epoch orders' and augmentations' seed.
        transform: a ``TrainTransform`` or ``ValTransform`` (size, crop, flip; a train
            transform's ``augment`` policy, ``loaders.augment``, which only the pillow backend
            carries out, with imgprep's extension built); with a ``size_schedule`` it is held
            at the schedule's first size.
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
            (worker processes), ``"dali"`` (NVIDIA DALI, the optional extra
            ``imgprep[dali]``), ``"nvjpeg"`` (torchvision's nvJPEG) or ``"nvimgcodec"``
            (the GPU's hardware JPEG decoders, through nvImageCodec): the same samples in
            every batch, decoded another way.
        device: where samples are decoded: ``"cpu"``, or with the dali and nvjpeg backends
            ``"gpu"`` (GPU ``local_rank``, CUDA batches out).
        memory_format: how the images of a batch lie in memory, a name of
            ``loaders.batch.MEMORY_FORMATS``: ``"contiguous"`` (NCHW) or
            ``"channels_last"`` (decoded as H x W x 3 rows and handed over NCHW-shaped with
            ``torch.channels_last`` strides: the same values, no transpose anywhere on the CPU
            for a model that runs channels_last).
        order_version: how epoch orders are drawn (``loaders.order``): 2 (the default: each
            rank computes only its own share of the order) or 1 (the order of checkpoints
            written before versions were recorded: make the loader with 1 to resume one).
        crop_decode: the pillow backend's crop-aware JPEG decode (``loaders.decode``, over
            imgprep's C extension): None uses it where the extension is built; False never
            (Pillow decodes every image: the same pixels, slower); True refuses to run where
            it is not built, so that a host that built imgprep without a compiler or the
            libjpeg-turbo headers does not decode at Pillow's speed unnoticed.
        size_schedule: a ``loaders.schedule.SizeSchedule`` (epoch -> output size:
            progressive resizing), which sets the transform's ``size`` epoch by epoch
            (``transform.at_size``; a ``ValTransform`` keeps its crop ratio); None: the
            transform's own size every epoch. Recorded in ``state_dict``: a state of another
            schedule is refused. Each epoch's size is read from the epoch's plan
            (``loader.plan(epoch).size``), never from these fields.
        repeats: repeated augmentation (``loaders.repeats``, as RASampler): each epoch keeps
            its length and holds about n / ``repeats`` distinct samples, each ``repeats``
            times with its own draws, the copies on different ranks where the group has at
            least ``repeats`` ranks; 1: every sample once. Recorded in ``state_dict`` when
            above 1: a state of another count is refused.
        random_erase: a ``loaders.mixing.RandomErasing`` (timm's random erasing of the
            normalised images), None: none.
        mixup: a ``loaders.mixing.Mixup`` (timm's mixup and cutmix, soft targets; its
            ``num_classes`` None: the loader's class count), None: none. With either set,
            each batch's draws are made with it (``loaders.mixing``) and the loader yields
            ``(images, labels, draws)``; ``DeviceLoader`` carries them out on the device.
            Set them for the training split only (a validation loader's options without
            them).

    ``None`` leaves the choice to the split: training augments (``TrainTransform()``),
    ends with ``tail="drop"`` and shuffles; validation center-crops (``ValTransform()``),
    pads (``tail="pad"``) and keeps the order.
    """

    batch_size: int
    workers: int | str = AUTO
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
    crop_decode: bool | None = None
    size_schedule: SizeSchedule | None = None
    repeats: int = 1
    random_erase: RandomErasing | None = None
    mixup: Mixup | None = None
    pin_cpus: bool | None = None
    worker_nice: int | None = None
    sizing: DemandSizing | None = None
    hw_decoder_load: float | None = None

    def __post_init__(self) -> None:
        """Refuse values no loader understands (programming errors: ValueError)."""
        if isinstance(self.batch_size, bool) or self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {self.batch_size!r}")
        if self.workers != AUTO:
            _fixed_count(self.workers)
        if self.tail is not None and self.tail not in TAILS:
            raise ValueError(f"tail must be one of {TAILS}, not {self.tail!r}")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, not {self.on_error!r}")
        if self.memory_format not in MEMORY_FORMATS:
            raise ValueError(f"memory_format must be one of {MEMORY_FORMATS}, not "
                             f"{self.memory_format!r}")
        check_order_version(self.order_version)
        check_repeats(self.repeats)
        if self.transform is not None:
            check_transform(self.transform)
            _check_augment(self.transform, self.backend)
        if self.prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be >= 1, not {self.prefetch_factor}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, not {self.device!r}")
        if self.crop_decode and not jpegcrop.AVAILABLE:
            raise ValueError(f"crop_decode=True, but the crop-aware decoder is "
                             f"{jpegcrop.status()}, or leave crop_decode unset")
        if self.size_schedule is not None and not isinstance(self.size_schedule, SizeSchedule):
            raise ValueError(f"size_schedule must be a SizeSchedule, not "
                             f"{self.size_schedule!r}")
        for name, kind in (("random_erase", RandomErasing), ("mixup", Mixup)):
            if (value := getattr(self, name)) is not None and not isinstance(value, kind):
                raise ValueError(f"{name} must be a loaders.mixing.{kind.__name__} or None, "
                                 f"not {value!r}")
        self._check_placement()
        if self.size_schedule is not None and self.transform is not None:  # one size, not two
            object.__setattr__(self, "transform",
                               self.transform.at_size(self.size_schedule.size_at(0)))

    def _check_placement(self) -> None:
        """Refuse a nice value the kernel does not have, or demand sizing where there is
        nothing to size (no workers, or a backend whose threads it does not size)."""
        nice = self.worker_nice
        if nice is not None and (isinstance(nice, bool) or not isinstance(nice, int)
                                 or not 0 <= nice <= 19):
            raise ValueError(f"worker_nice must be an integer from 0 to 19, not {nice!r}")
        load = self.hw_decoder_load
        if load is not None and (self.backend != "nvimgcodec" or isinstance(load, bool)
                                 or not isinstance(load, (int, float)) or not 0 <= load <= 1):
            raise ValueError(f"hw_decoder_load must be a share from 0 to 1 with "
                             f"backend='nvimgcodec', not {load!r} with {self.backend!r}")
        if self.pin_cpus and self.backend in UNPINNED:
            raise ValueError(f"backend={self.backend!r} starts its own decoding threads, which "
                             "pin_cpus cannot place; leave pin_cpus unset (DALI places its "
                             "threads itself: DALI_AFFINITY_MASK)")
        if self.sizing is None:
            return
        if not isinstance(self.sizing, DemandSizing):
            raise ValueError(f"sizing must be a loaders.sizing.DemandSizing or None, not "
                             f"{self.sizing!r}")
        if self.backend != "pillow" or self.workers == 0:
            raise ValueError(f"sizing sizes the pillow backend's worker processes; backend="
                             f"{self.backend!r} with workers={self.workers!r} has none to "
                             "size: leave sizing unset, or load with backend='pillow' and "
                             "workers >= 1")

    @property
    def channels_last(self) -> bool:
        """Whether batch rows are stored H x W x 3 (``memory_format="channels_last"``)."""
        return self.memory_format == "channels_last"

    def resolve(self, *, train: bool, world: World, num_classes: int | None = None
                ) -> ResolvedOptions:
        """These options for one loader: what ``None`` and ``"auto"`` leave open decided for
        the split (``train``: the training split's defaults), this rank and the loader's
        ``num_classes`` (``Mixup.num_classes``)."""
        given = {f.name: getattr(self, f.name) for f in fields(self)}
        pin = pins_cpus(self.pin_cpus, self.workers, self.backend)
        plan = world.cpu_plan() if pin else None
        return ResolvedOptions(**given | {
            "mixup": None if self.mixup is None else self.mixup.for_classes(num_classes),
            "workers": worker_count(self.workers, world, pin),
            "pin_cpus": pin, "cpus": plan if isinstance(plan, CpuPlan) else None,
            "worker_nice": (self.worker_nice if self.worker_nice is not None
                            else PINNED_NICE if pin else 0),
            "transform": self.transform or (TrainTransform() if train else ValTransform()),
            "tail": self.tail or ("drop" if train else "pad"),
            "shuffle": train if self.shuffle is None else self.shuffle,
            "pin_memory": (torch.cuda.is_available() if self.pin_memory is None
                           else self.pin_memory)})

    def config(self, *, train: bool, samples: Sequence[int], world: World, mode: str,
               layout_seed: int, num_classes: int | None = None) -> Config:
        """The ``Config`` of a loader with these options over ``samples`` (of
        ``num_classes`` classes), resolved for its split (``train``: the training split's
        defaults) and rank."""
        resolved = self.resolve(train=train, world=world, num_classes=num_classes)
        return Config(samples=tuple(int(n) for n in samples), world=world, mode=mode,
                      layout_seed=layout_seed, options=resolved)


@dataclass(frozen=True, kw_only=True)
class ResolvedOptions(LoaderOptions):
    """``LoaderOptions`` resolved for one loader (``LoaderOptions.resolve``): the fields the
    split or the rank decides, declared again below, are never ``None`` or ``"auto"``;
    ``cpus``, this rank's CPU plan where the loader pins (None: it does not)."""

    workers: int
    transform: Transform
    tail: str
    shuffle: bool
    pin_memory: bool
    pin_cpus: bool
    worker_nice: int
    cpus: CpuPlan | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        narrowed = [n for n in ResolvedOptions.__annotations__ if n != "cpus"]  # declared again
        open_ = [name for name in narrowed if getattr(self, name) in (None, AUTO)]
        if self.mixup is not None and self.mixup.num_classes is None:
            open_.append("mixup.num_classes")
        if open_:
            raise ValueError(f"{', '.join(open_)} left open: make resolved options with "
                             "LoaderOptions.resolve")

    @property
    def sizes(self) -> SizeSchedule:
        """Every epoch's output size, decided here only: the size schedule, or the
        transform's own size every epoch (``largest``: what batch buffers are made for)."""
        return self.size_schedule or SizeSchedule.constant(self.transform.size)


@dataclass(frozen=True, eq=False, kw_only=True)
class PlannedEpoch(EpochPlan):
    """One epoch of a rank's loader (``Config.plan``), the record every backend makes its
    batches from and the trainer reads: the ``EpochPlan`` (which samples each batch holds),
    the epoch's ``transform`` (what each sample becomes, at the epoch's output ``size``) and
    the augmentation seed each batch's generator is drawn from (``batch_rng``)."""

    transform: Transform
    seed: int  # the options' seed (LoaderOptions.seed)

    @classmethod
    def of(cls, plan: EpochPlan, transform: Transform, seed: int) -> PlannedEpoch:
        given: dict[str, Any] = {f.name: getattr(plan, f.name) for f in fields(EpochPlan)}
        return cls(**given, transform=transform, seed=seed)

    @property
    def size(self) -> int:
        """The epoch's output size: its images are ``size`` x ``size``."""
        return self.transform.size

    def batch_rng(self, b: int) -> np.random.Generator:
        """Batch ``b``'s augmentation generator, seeded by (seed, epoch, pool, the batch's
        first position in the epoch's order): any worker count makes the same batches, and a
        resume at batch k draws nothing for the batches before it."""
        return np.random.default_rng([self.seed, self.epoch, self.group.pool,
                                      int(self.first[b])])

    def batch_draws_rng(self, b: int) -> np.random.Generator:
        """Batch ``b``'s generator of its batch-level draws (``loaders.mixing``), seeded as
        ``batch_rng`` and ``DRAWS_SALT``: apart from the samples' draws, and like them the
        same for any worker count and on a resume."""
        return np.random.default_rng([self.seed, self.epoch, self.group.pool,
                                      int(self.first[b]), DRAWS_SALT])


@dataclass(frozen=True, eq=False, kw_only=True)
class Config:
    """What a loader and its backend both need to compute a rank's batches."""

    samples: tuple[int, ...]  # per shard (a list: one entry, all of its lines)
    world: World
    mode: str  # replicate or partition
    layout_seed: int  # places shards on nodes and orders each epoch
    options: ResolvedOptions

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")
        if not self.samples or min(self.samples) < 0:
            raise ValueError(f"samples must be one count >= 0 a shard, not {self.samples}")

    @functools.cached_property
    def pool_sizes(self) -> tuple[int, ...]:
        """The samples of each pool of the plans (one for replicate, one a node for
        partition: ``loaders.epochs.pools``)."""
        return tuple(len(p) for p in pools(self.samples, self.world.num_nodes, self.mode,
                                           self.layout_seed))

    def plan(self, epoch: int, starts: tuple[int, ...]) -> PlannedEpoch:
        """This rank's ``epoch`` from ``starts`` (per pool: positions of its order done), at
        that epoch's size (``ResolvedOptions.sizes``)."""
        o = self.options
        plan = plan_epoch(self.samples, self.world, self.mode, self.layout_seed, epoch,
                          o.batch_size, o.workers, o.tail, o.shuffle, starts, o.order_version,
                          o.repeats)
        return PlannedEpoch.of(plan, o.transform.at_size(o.sizes.size_at(epoch)), o.seed)

    def draws(self, plan: PlannedEpoch, b: int, labels: np.ndarray) -> bytes | None:
        """Batch ``b``'s batch-level draws (``loaders.mixing``), made once its ``labels``
        are known (``PAD_LABEL``: padding), packed to travel with it; None when the options
        ask for none."""
        o = self.options
        if o.random_erase is None and o.mixup is None:
            return None
        return draw_batch(labels, plan.size, plan.size, plan.batch_draws_rng(b),
                          erase=o.random_erase, mixup=o.mixup).pack()

    def slots(self, plan: EpochPlan, b: int) -> np.ndarray:
        """Batch ``b``'s slots: sample ids, and PAD for padding (tail="pad"; the others'
        last batches are shorter instead)."""
        row = plan.table[b]
        return row if self.options.tail == "pad" else row[row != PAD]

