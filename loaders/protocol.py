"""The typed protocol of a rank's loader, which the trainer programs against (no ``hasattr``
probing): both ``ShardLoader`` and ``LabelListLoader`` keep it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from loaders.backends import Batch
from loaders.config import PlannedEpoch


class Loader(Protocol):
    """A rank's loader: ``(uint8 NCHW images, int64 labels)`` batches of one epoch at a time
    (``memory_format="channels_last"``: NCHW-shaped, channels_last strides); with
    ``random_erase`` or ``mixup`` set, ``(images, labels, draws)`` (``loaders.mixing``).

    ``batches_per_epoch`` is a whole epoch's count for this World, stated before the epoch
    and unchanged by ``load_state_dict`` (a schedule's steps per epoch); ``len()`` is what the
    next pass yields (less after a mid-epoch resume). ``plan(epoch)`` is the epoch's record
    (``PlannedEpoch``: its output ``size`` and transform; by default the current epoch's),
    ``output_sizes`` every size its epochs are made at: what the trainer reads of sizes.
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
    def output_sizes(self) -> tuple[int, ...]: ...

    def plan(self, epoch: int | None = None) -> PlannedEpoch: ...

    @property
    def skipped(self) -> int: ...

    @property
    def active_workers(self) -> int: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Batch]: ...

    def in_place(self) -> Iterator[Batch]: ...

    def lock_pages(self) -> bool: ...

    @property
    def page_locked(self) -> bool: ...

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...
