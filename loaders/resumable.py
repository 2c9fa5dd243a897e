"""A loader as a training framework sees it: the epoch's full length, the epoch started at
each epoch's start and not on a mid-epoch restart, and a state that every rank can resume.

Frameworks (PyTorch Lightning, Hugging Face Accelerate) do not re-shard or re-seed an
iterable that is not a ``DataLoader``: they iterate it, take ``len()`` and, where it has
``state_dict``/``load_state_dict``, put its state in their checkpoint. What they assume of
it, and what ``ResumableLoader`` does about each:

- **Length.** A framework counts the batches of an epoch itself, restores its count from its
  checkpoint and ends the epoch when the count reaches ``len()``, asking for no batch after
  that. A shard or label-list loader's ``len()`` is what its next pass yields (the rest of
  the epoch after a resume), so here ``len()`` is that plus the steps of the epoch already
  counted: the full epoch, as the framework counts it. After an elastic resume (another
  number of ranks) it is the framework's count so far plus what this World has left, so the
  epoch ends where the loader's batches do. The loader's pass is run to its end before its
  last batch is handed out, so the epoch is done (its state says so, ``len()`` is a whole
  epoch again) without the framework asking for one more batch.
- **Epochs.** Lightning calls ``set_epoch`` on a loader's ``sampler`` at the start of every
  epoch, a restart in the middle of one included; ``set_epoch`` starts an epoch over. Here
  ``sampler.set_epoch(e)`` is ``start_epoch(e)``: it keeps a position restored for epoch
  ``e`` that no pass has begun from yet, and starts the epoch otherwise. A hand-written loop
  takes the same rule from ``epochs(end)``. ``set_epoch`` itself always starts the epoch.
- **State.** ``state_dict()`` is ``{"loader": the wrapped loader's state, "steps": the steps
  of this epoch counted so far}``; ``load_state_dict`` takes it, or a bare loader state
  (whose ``batch`` is then the steps). The wrapped loader's state holds the positions of the
  epoch's order done, the same on every rank: frameworks write rank 0's alone, and every rank
  resumes from it.

Wrap a ``ShardLoader``, a ``LabelListLoader`` or a ``DeviceLoader`` over one (whose state is
as of the batches it has handed out), before any state is loaded into it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import torch

from loaders.errors import LoaderError

Batch = tuple[torch.Tensor, ...]  # (images, labels), or (images, labels, draws) before DeviceLoader


class Stateful(Protocol):
    """What ``ResumableLoader`` wraps: a loader with an epoch and an exact resume."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Batch]: ...

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class EpochStart:
    """What a framework finds as ``loader.sampler``: its ``set_epoch`` is the loader's
    ``start_epoch`` (Lightning calls it at every epoch's start, restarts included)."""

    def __init__(self, loader: ResumableLoader) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.start_epoch(epoch)


class ResumableLoader:
    """``loader`` for a training framework (module docstring): ``len()`` the full epoch as
    the framework counts it, ``sampler.set_epoch``/``start_epoch`` that keep a restored
    position, and a state any rank resumes from.

    Args:
        loader: a ``ShardLoader``, ``LabelListLoader`` or ``DeviceLoader`` over one, with no
            state loaded yet.
        at_most_an_epoch: refuse a state whose epoch would count more steps than a whole
            epoch on this World (an elastic resume on more ranks: the framework's count is
            of the smaller World's steps). Lightning reads the length before it loads the
            state and never runs an epoch longer than that; it would drop the rest.
    """

    def __init__(self, loader: Stateful, *, at_most_an_epoch: bool = False) -> None:
        missing = [m for m in ("state_dict", "load_state_dict", "set_epoch")
                   if not callable(getattr(loader, m, None))]
        if missing:
            raise TypeError(f"ResumableLoader: {type(loader).__name__} has no "
                            f"{', '.join(missing)}; wrap a ShardLoader or LabelListLoader "
                            "(or a DeviceLoader over one)")
        self.loader, self.at_most_an_epoch = loader, at_most_an_epoch
        self.epoch = int(loader.state_dict()["epoch"])
        self.sampler = EpochStart(self)
        self._base = 0  # steps of this epoch counted before the next pass (a resume's)
        self._yielded = 0  # batches handed out by the current pass
        self._restored = False  # a loaded position that no pass has begun from yet

    @property
    def steps(self) -> int:
        """The steps of the current epoch handed out so far (a resumed run's included)."""
        return self._base + self._yielded

    def __len__(self) -> int:
        return self._base + len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        self._restored, self._yielded = False, 0
        left, finished = len(self.loader), False
        batches = iter(self.loader)
        for batch in batches:
            if self._yielded + 1 == left:  # the pass's last batch
                self._finish(batches)
                finished = True
            self._yielded += 1
            yield batch
        if not finished:
            self._finish(batches)

    def _finish(self, batches: Iterator[Batch]) -> None:
        """Run the loader's pass to its end: the epoch is done and its next pass starts it
        over."""
        for _ in batches:
            raise LoaderError(f"{type(self.loader).__name__} gave more batches than its "
                              f"len() said ({len(self.loader)})")
        self._base, self._yielded = 0, self._base + self._yielded

    def set_epoch(self, epoch: int) -> None:
        """Iterate ``epoch`` next, from its first batch (a restored position is dropped)."""
        self.loader.set_epoch(epoch)
        self.epoch, self._base, self._yielded, self._restored = epoch, 0, 0, False

    def start_epoch(self, epoch: int) -> bool:
        """What to call at the start of epoch ``epoch``: keeps a position restored for it
        (by ``load_state_dict``, no pass begun since), else ``set_epoch(epoch)``. True when
        the epoch was started from its first batch."""
        if self._restored and epoch == self.epoch:
            return False
        self.set_epoch(epoch)
        return True

    def epochs(self, end: int) -> Iterator[int]:
        """The epochs from the current one (a restored one, or the first) up to ``end``,
        each begun with ``start_epoch``: ``for epoch in loader.epochs(n): for batch in
        loader: ...`` goes on where a loaded state stands."""
        for epoch in range(self.epoch, end):
            self.start_epoch(epoch)
            yield epoch

    def state_dict(self) -> dict[str, Any]:
        """``{"loader": the wrapped loader's state, "steps": this epoch's steps so far}``."""
        return {"loader": self.loader.state_dict(), "steps": self.steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume where ``state`` stands (ours, or a bare loader state), on this World or,
        in replicate mode, on another; the next pass yields the rest of its epoch."""
        inner = state["loader"] if "loader" in state else state
        steps = int(state["steps"] if "loader" in state else inner["batch"])
        if steps < 0:
            raise ValueError(f"steps {steps} is below 0")
        whole = len(self)  # what Lightning reads before it loads the state: its limit
        self.loader.load_state_dict(inner)
        left = len(self.loader)
        if self.at_most_an_epoch and left and steps + left > whole:
            raise LoaderError(
                f"the checkpoint counts {steps} steps of epoch {inner['epoch']} done and this "
                f"World has {left} batches of it left: {steps + left} steps, more than a "
                f"whole epoch here ({whole}), where the framework would end the epoch and "
                "drop the rest (the checkpoint is from fewer ranks); resume on as many ranks "
                "as wrote it or fewer, or from a checkpoint at an epoch's end")
        self.epoch, self._base, self._yielded = int(inner["epoch"]), steps, 0
        self._restored = True
