"""The options of ``imgprep convert``: one home for their names, choices, ranges and defaults.

``ConvertOptions`` holds everything a run needs; how every image is converted is its
``transform``, a ``TransformOptions``, which lives with its choices in ``imgprep.sections``
since the manifest records it. Both are frozen, keyword-only and checked when built, so a bad
value fails where it is given rather than halfway through a run. The command line takes its
choices and defaults from here and from ``imgprep.sections``. This module imports neither
numpy nor Pillow: the command line reads it at start.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgprep.sections import (
    DEFAULT_SHARD_SIZE,
    FORMATS,
    SPLITS,
    StoreOptions,
    TransformOptions,
    one_of,
    within,
)

if TYPE_CHECKING:
    from imgprep.inputs.forms import SplitInput

OUTPUT_FORMATS = FORMATS  # the manifest's formats: webdataset shards or a label list
RANK_MODES = ("shared", "partition")
# The largest image one worker holds: over 4x the largest ILSVRC2012 JPEG (~15 MB), far under
# a worker's memory; larger recorded sizes are refused before anything is read.
DEFAULT_MAX_IMAGE_BYTES = 64 << 20


@dataclass(frozen=True, kw_only=True)
class ConvertOptions:
    """Everything ``imgprep convert`` needs; the output is a pure function of these."""

    input: Path
    out: Path
    format: str = "shards"
    split: str | None = None
    labels: tuple[Path, ...] = ()
    classes: Path | None = None
    transform: TransformOptions = field(default_factory=TransformOptions)
    store: StoreOptions = field(default_factory=StoreOptions)  # --store: how images are kept
    shard_size: int = DEFAULT_SHARD_SIZE
    num_shards: int | None = None
    seed: int = 0
    workers: int = 1
    max_errors: int = 0
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES  # refused by recorded size, never read
    meta: bool = True
    mode: str = "shared"
    wait_timeout: float = 3600.0
    overwrite: bool = False  # replace a finished split converted from other inputs/options
    label_offset: int | None = None  # subtracted from a 'name label' ground truth's labels
    trust_labels: bool = False  # take labels that differ from the published val labels as given
    form: str | None = None  # --form: read the input as this form (default: detected)
    holdout_per_class: int = 0  # --holdout-per-class: val images held out of train, per class
    holdout_seed: int = 0  # the key of the hash that picks them (imgprep.convert.holdout)
    source: SplitInput | None = None  # the split of the input to convert (set by split_inputs)

    def __post_init__(self) -> None:
        one_of("format", self.format, OUTPUT_FORMATS)
        one_of("split", self.split, (None, *SPLITS))
        one_of("mode", self.mode, RANK_MODES)
        within("shard_size", self.shard_size, 1)
        if self.num_shards is not None:
            within("num_shards", self.num_shards, 1)
        within("workers", self.workers, 1)
        within("max_errors", self.max_errors, 0)
        within("max_image_bytes", self.max_image_bytes, 1)
        within("holdout_per_class", self.holdout_per_class, 0)
        if isinstance(self.holdout_seed, bool) or not isinstance(self.holdout_seed, int):
            raise ValueError(f"holdout_seed must be an integer, not {self.holdout_seed!r}")
        if not self.wait_timeout > 0:
            raise ValueError(f"wait_timeout must be above 0 seconds, not {self.wait_timeout!r}")
        if not isinstance(self.transform, TransformOptions):
            raise ValueError(f"transform must be TransformOptions, not {self.transform!r}")
        if not isinstance(self.store, StoreOptions):
            raise ValueError(f"store must be StoreOptions, not {self.store!r}")
        if self.store.stored and self.format != "shards":
            raise ValueError(f"--store {self.store.mode} keeps pixels in shards; a label list "
                             "holds JPEG files (--format shards, or --store jpeg)")


def default(cls: type, name: str) -> Any:
    """The default of field ``name`` of the options dataclass ``cls`` (for the command line's
    ``--help``, so that each default is written once)."""
    for f in fields(cls):
        if f.name == name:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:
                return f.default_factory()
            break
    raise ValueError(f"{cls.__name__}.{name} has no default")
