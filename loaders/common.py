"""What the shard and label-list loaders share: their error, padding label, policies and the
typed protocol the trainer programs against (no ``hasattr`` probing)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import torch

from imgprep.errors import ImgprepError
from imgprep.job.world import World

# How an epoch ends (loaders.epochs, docs/loaders.md "Tails"): full batches only; every sample
# once with short last batches; every sample once with padding; every sample once, counts
# differing between ranks.
TAILS = ("drop", "short", "pad", "uneven")
ON_ERROR = ("raise", "skip")  # an undecodable sample: fail the epoch, or replace and count it
PAD_LABEL = -1  # the label of a padding slot (its pixels are zero)


class LoaderError(ImgprepError, RuntimeError):
    """The loader cannot go on; the message names the rank, shard (or file) and key."""


def check_policies(batch_size: int, workers: int, tail: str | None, on_error: str) -> None:
    """Refuse option values no loader understands (programming errors: ValueError); a
    ``tail`` of None is left to the split."""
    if batch_size < 1 or workers < 0:
        raise ValueError("batch_size must be >= 1 and workers >= 0")
    if tail is not None and tail not in TAILS:
        raise ValueError(f"tail must be one of {TAILS}")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}")


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
    """A rank's loader: ``(uint8 NCHW images, int64 labels)`` batches of one epoch at a time.

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

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...
