"""The options of ``imgprep convert``: one home for their names, choices, ranges and defaults.

``TransformOptions`` says how every image is converted and ``ConvertOptions`` everything a
run needs; both are frozen, keyword-only and checked when built, so a bad value fails where it
is given rather than halfway through a run. The command line takes its choices and defaults
from here. This module imports neither numpy nor Pillow: the command line reads it at start.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgprep.shards.manifest import FORMATS, SPLITS

if TYPE_CHECKING:
    from imgprep.inputs.forms import SplitInput

OUTPUT_FORMATS = FORMATS  # the manifest's formats: webdataset shards or a label list
RANK_MODES = ("shared", "partition")
RESIZE_MODES = ("center-crop", "short-side")
FILTER_NAMES = ("lanczos", "bicubic", "bilinear", "hamming", "box")  # Pillow's, lower case
SIZE_RANGE = (8, 4096)
QUALITY_RANGE = (1, 100)
DEFAULT_MAX_PIXELS = 89_478_485  # Pillow's own bomb threshold (~0.25 GB of RGB pixels)
# The largest image one worker holds: over 4x the largest ILSVRC2012 JPEG (~15 MB), far under
# a worker's memory; larger recorded sizes are refused before anything is read.
DEFAULT_MAX_IMAGE_BYTES = 64 << 20


def _one_of(name: str, value: object, choices: tuple[object, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}, not {value!r}")


def _within(name: str, value: int, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (
            high is not None and value > high):
        upto = f"..{high}" if high is not None else " or more"
        raise ValueError(f"{name} must be an integer {low}{upto}, not {value!r}")


@dataclass(frozen=True, kw_only=True)
class TransformOptions:
    """How every image is converted; part of the manifest so a conversion is reproducible.
    The field order is the manifest's (``options.transform``)."""

    size: int = 256
    resize: str = "center-crop"
    filter: str = "lanczos"
    quality: int = 90
    max_pixels: int = DEFAULT_MAX_PIXELS
    exif_transpose: bool = False

    def __post_init__(self) -> None:
        _within("size", self.size, *SIZE_RANGE)
        _one_of("resize", self.resize, RESIZE_MODES)
        _one_of("filter", self.filter, FILTER_NAMES)
        _within("quality", self.quality, *QUALITY_RANGE)
        _within("max_pixels", self.max_pixels, 1)


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
    shard_size: int = 1250
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
        _one_of("format", self.format, OUTPUT_FORMATS)
        _one_of("split", self.split, (None, *SPLITS))
        _one_of("mode", self.mode, RANK_MODES)
        _within("shard_size", self.shard_size, 1)
        if self.num_shards is not None:
            _within("num_shards", self.num_shards, 1)
        _within("workers", self.workers, 1)
        _within("max_errors", self.max_errors, 0)
        _within("max_image_bytes", self.max_image_bytes, 1)
        _within("holdout_per_class", self.holdout_per_class, 0)
        if isinstance(self.holdout_seed, bool) or not isinstance(self.holdout_seed, int):
            raise ValueError(f"holdout_seed must be an integer, not {self.holdout_seed!r}")
        if not self.wait_timeout > 0:
            raise ValueError(f"wait_timeout must be above 0 seconds, not {self.wait_timeout!r}")
        if not isinstance(self.transform, TransformOptions):
            raise ValueError(f"transform must be TransformOptions, not {self.transform!r}")


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
