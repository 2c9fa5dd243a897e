"""What the shard and label-list loaders share: their error, padding label, policies and the
typed protocol the trainer programs against (no ``hasattr`` probing)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from imgprep.errors import ImgprepError
from imgprep.job.world import World
from imgprep.shards.manifest import Manifest, manifest_path

# How an epoch ends (loaders.epochs, docs/loaders.md "Tails"): full batches only; every sample
# once with short last batches; every sample once with padding; every sample once, counts
# differing between ranks.
TAILS = ("drop", "short", "pad", "uneven")
ON_ERROR = ("raise", "skip")  # an undecodable sample: fail the epoch, or replace and count it
PAD_LABEL = -1  # the label of a padding slot (its pixels are zero)
# How a batch's pixels lie in memory (docs/loaders.md "Memory format"): NCHW contiguous, or
# NCHW-shaped with torch.channels_last strides (the rows stored H x W x 3, as convolutions
# that run channels_last read them).
MEMORY_FORMATS = ("contiguous", "channels_last")


class LoaderError(ImgprepError, RuntimeError):
    """The loader cannot go on; the message names the rank, shard (or file) and key."""


def refuse_unlabelled(m: Manifest, folder: Path) -> None:
    """Refuse a split converted without labels (``--split test``): its batches would have no
    labels to train or validate on."""
    if not m.labelled:
        raise LoaderError(
            f"{manifest_path(folder, m.split)}: the {m.split} split was converted without "
            "labels (imgprep convert --split test), so there is nothing to train or validate "
            "on; train on the train split and validate on val (ILSVRC2012_img_val.tar converts "
            "with the published labels, no --labels needed)")


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


def row_shape(size: int, channels_last: bool) -> tuple[int, int, int]:
    """One image of a batch as it is stored: 3 x size x size, or size x size x 3 when the
    batch is channels_last."""
    return (size, size, 3) if channels_last else (3, size, size)


def as_nchw(rows: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """A batch of rows stored as ``row_shape`` says, shaped NCHW: the rows themselves, or a
    permuted view of channels_last rows (its strides are torch.channels_last; nothing is
    copied)."""
    return rows.permute(0, 3, 1, 2) if channels_last else rows


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


class Loader(Protocol):
    """A rank's loader: ``(uint8 NCHW images, int64 labels)`` batches of one epoch at a time
    (``memory_format="channels_last"``: NCHW-shaped, channels_last strides).

    ``batches_per_epoch`` is a whole epoch's count for this World, stated before the epoch
    and unchanged by ``load_state_dict`` (a schedule's steps per epoch); ``len()`` is what the
    next pass yields (less after a mid-epoch resume).
    """

    @property
    def mean(self) -> tuple[float, ...]: ...

    @property
    def std(self) -> tuple[float, ...]: ...

    @property
    def num_classes(self) -> int: ...

    @property
    def batches_per_epoch(self) -> int: ...

    @property
    def skipped(self) -> int: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def in_place(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def lock_pages(self) -> bool: ...

    @property
    def page_locked(self) -> bool: ...

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...
