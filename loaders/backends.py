"""Decoder backends: how a rank's batches are decoded, one contract and the backends by name.

A *source* says where samples come from (a shard set: ``loaders.shards``; a label list:
``loaders.labellist``): it numbers its samples and fetches them by number (``Source``). A
*decoder backend* (a *backend*) turns a rank's plan into batches, reading the plan's samples
through the source (``Backend``). Every backend makes the same plan's batches (plans, tails
and resume are the base's, ``loaders.base``), each epoch from the record the base hands it
(``loaders.config.PlannedEpoch``: the samples, the epoch's transform and output size, the
batches' seeds); they differ only in how samples are decoded:

- ``pillow``: CPU decoding in persistent worker processes (``loaders.pillow``): imgprep's
  extension (crop-aware libjpeg-turbo decode and its resampler), or Pillow with
  ``crop_decode=False`` (``loaders.decode``);
- ``dali``: NVIDIA DALI in threads of the loader's process, on the CPU or, with
  ``device="gpu"``, with nvJPEG on this rank's GPU (``loaders.dali``); an optional extra,
  ``pip install 'imgprep[dali]'``;
- ``nvjpeg``: torchvision's nvJPEG, a batch at a time, with ``device="gpu"`` on this
  rank's GPU (torchvision needed only there), crops batched on the device
  (``loaders.nvjpeg``); its CPU form decodes with Pillow;
- ``nvimgcodec``: the nvjpeg backend with the GPU's hardware JPEG decoders (NVJPG, through
  nvImageCodec, needed only there) in place of nvJPEG on the SMs, a share of each batch
  decoded on the CPU beside them (``loaders.nvimgcodec``).

All keep one error rule: an undecodable sample raises a ``LoaderError`` naming it, or with
``on_error="skip"`` its slot takes a good sample of the same batch (``stand_ins``; a batch of
none: padding) and is counted. A backend's module is imported when the backend is first
asked for, so ``import loaders`` never imports DALI. Those that decode in threads of the
loader's process (``dali``, ``nvjpeg``, ``nvimgcodec``) share ``InProcessBackend``: where
batches go, and the contract's members that have nothing to say there (no worker processes,
no memory of their own to page-lock).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from loaders import placement
from loaders.config import Config, PlannedEpoch
from loaders.epochs import EpochPlan
from loaders.errors import LoaderError

BACKENDS = {"pillow": "loaders.pillow:PillowBackend", "dali": "loaders.dali:DaliBackend",
            "nvjpeg": "loaders.nvjpeg:NvjpegBackend",
            "nvimgcodec": "loaders.nvimgcodec:NvimgcodecBackend"}
# the backends that decode on a GPU with device="gpu"
GPU_BACKENDS = ("dali", "nvjpeg", "nvimgcodec")
EXTRAS = {"dali": ("nvidia.dali", "NVIDIA DALI", "imgprep[dali]")}  # what a backend needs

# uint8 NCHW-shaped images, int64 labels, and with random_erase or mixup set the batch's
# packed draws (a uint8 tensor: loaders.mixing.BatchDraws)
Batch = tuple[torch.Tensor, ...]


@dataclass(frozen=True, slots=True)
class EncodedSample:
    """One sample as a source fetches it, before decoding."""

    where: str  # the sample, for messages (shard and key, or list line and path)
    data: bytes  # the encoded image
    label: int
    view: memoryview | None = None  # a stored-pixel record, in place of data (loaders.reader)


class Source(Protocol):
    """Where a backend reads samples (a worker: through its own open files, made after the
    fork)."""

    fix: str  # what to do about an undecodable sample, for the error message

    def fetch(self, ids: np.ndarray) -> list[EncodedSample]: ...


class Backend(Protocol):
    """How a decoder backend makes a rank's batches: ``run(plan, skip)`` yields the plan's
    batches from ``skip`` on, in order, laid out as the options' ``memory_format`` says;
    with ``in_place`` a batch may be a view of the backend's own memory, valid until the
    next one is asked for."""

    @property
    def skipped(self) -> int: ...  # samples replaced this pass (on_error="skip")

    @property
    def pids(self) -> tuple[int, ...]: ...  # decoding processes (0: not started)

    @property
    def active(self) -> int: ...  # workers (or threads) decoding now (loaders.sizing)

    def run(self, plan: PlannedEpoch, skip: int, in_place: bool = False) -> Iterator[Batch]: ...

    def dead(self, plan: EpochPlan, describe: Callable[[EpochPlan, int], str]) -> str: ...

    def lock_pages(self) -> bool: ...  # in-place batches' memory page-locked for CUDA copies

    @property
    def page_locked(self) -> bool: ...  # whether it is (known once a pass has begun)


class MakeBackend(Protocol):
    """A backend's class: made once per loader, before anything is read, from the loader's
    ``Config`` (whose ``options`` say where batches go and what may be kept in flight)."""

    def __call__(self, cfg: Config, source: Source) -> Backend: ...


class InProcessBackend:
    """The part of a backend that decodes in threads of the loader's process (``dali``,
    ``nvjpeg``): its batches go to this rank's GPU with ``device="gpu"`` (refused where torch
    sees no CUDA device), else stay on the CPU; every batch is its own memory (nothing to
    page-lock, whether asked ``in_place`` or not), and there is no worker process to report
    or to find dead. A subclass makes the batches (``run``), counting in ``_skipped`` the
    samples it replaced this pass."""

    def __init__(self, cfg: Config, source: Source) -> None:
        o = cfg.options
        if o.device == "gpu" and not torch.cuda.is_available():
            raise LoaderError(f"rank {cfg.world.rank}: device='gpu' decodes on a CUDA GPU and "
                              "torch sees none here; load with device='cpu'")
        self.cfg, self.source, self.options = cfg, source, o
        self.device = (torch.device("cuda", cfg.world.local_rank) if o.device == "gpu"
                       else torch.device("cpu"))
        placement.enter(o)  # the decoding threads place themselves (placement.thread_init)
        self._skipped = 0

    @property
    def skipped(self) -> int:
        return self._skipped

    @property
    def pids(self) -> tuple[int, ...]:
        return ()  # decoding runs in threads of this process

    @property
    def active(self) -> int:
        return self.options.workers

    def dead(self, plan: EpochPlan, describe: Callable[[EpochPlan, int], str]) -> str:
        return ""

    def lock_pages(self) -> bool:
        return False

    @property
    def page_locked(self) -> bool:
        return False


def stand_ins(count: int, bad: list[int]) -> dict[int, int]:
    """on_error="skip": the good sample of the same batch (of ``count``) that takes each bad
    slot, in turn; -1 where the batch has none (the slot becomes padding)."""
    good = sorted(set(range(count)) - set(bad))
    return {b: good[n % len(good)] if good else -1 for n, b in enumerate(bad)}


def backend_class(name: str) -> MakeBackend:
    """The class of backend ``name``; a ``LoaderError`` naming the extra to install when its
    library cannot be imported, a ``ValueError`` for a name no backend has."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {tuple(BACKENDS)}, not {name!r}")
    if name in EXTRAS:
        module, what, extra = EXTRAS[name]
        try:
            importlib.import_module(module)
        except (ImportError, OSError) as e:  # not installed, or its libraries do not load
            reason = (str(e).splitlines() or [type(e).__name__])[0]
            raise LoaderError(f"backend={name!r} needs {what}, which cannot be imported "
                              f"({reason}); install it with pip install '{extra}'") from None
    path, _, attr = BACKENDS[name].partition(":")
    made: MakeBackend = getattr(importlib.import_module(path), attr)
    return made
