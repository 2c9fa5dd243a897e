"""The manifest's sections as typed records: written and read back by the same code.

A manifest (``imgprep.shards.manifest``) says how its split was made. ``options``
(``ManifestOptions``) holds what decides the output bytes: the format, split, seed and shard
sizes, the transform every image went through (``TransformOptions``, also the transform of
``imgprep convert``'s own options) and, with ``--holdout-per-class``, the held-out validation
split (``Holdout``), then the fingerprint of it all. ``source`` (``SourceSection``) says what
was read. Convert builds these records, ``to_json`` writes them and ``from_json`` reads them
back: every reader gets the same typed values, never a dict read by key.

Each record is frozen and checked when built (ValueError). Reading one (``from_json``) checks
each field's type against the record's own annotations and names the file and field of a
problem (ManifestError). A field that a manifest written by an older imgprep lacks takes the
record's own default: the dataclass field defaults below are the one place those defaults
live. Keys that this imgprep does not know are not read.

Also the vocabulary every room shares: the splits (``SPLITS``) and output formats
(``FORMATS``). A leaf module: it imports nothing of the package but ``imgprep.errors``, so
that ``shards``, which reads manifests, and ``convert``, which writes them, both import it.
"""

from __future__ import annotations

import re
import types
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar, get_type_hints

from imgprep.errors import ManifestError

SPLITS = ("train", "val", "test")  # the splits imgprep writes; <split>.json is a split's manifest
FORMATS = ("shards", "list")  # webdataset shards or a label list
RESIZE_MODES = ("center-crop", "short-side")
FILTER_NAMES = ("lanczos", "bicubic", "bilinear", "hamming", "box")  # Pillow's, lower case
SIZE_RANGE = (8, 4096)
QUALITY_RANGE = (1, 100)
DEFAULT_MAX_PIXELS = 89_478_485  # Pillow's own bomb threshold (~0.25 GB of RGB pixels)
DEFAULT_SHARD_SIZE = 1250  # samples a shard, unless --shards gives the count
HOLDOUT_PREFIX = "holdout_"  # the holdout's fields sit in ``options`` under this prefix
STORE_PREFIX = "store_"  # so do the storage mode's (``StoreOptions``)
STORE_MODES = ("jpeg", "yuv420", "rgb", "mixed")  # how a sample's image is kept
RAW_MODES = ("yuv420", "rgb")  # the kinds of stored pixels (imgprep.rawformat)
HEX64 = re.compile(r"^[0-9a-f]{64}$")
FIX = "reconvert or restore the file"

R = TypeVar("R")


def one_of(name: str, value: object, choices: tuple[object, ...]) -> None:
    """Refuse ``value`` unless it is one of ``choices`` (ValueError naming ``name``)."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}, not {value!r}")


def within(name: str, value: int, low: int, high: int | None = None) -> None:
    """Refuse ``value`` unless it is an integer (not a bool) in ``low..high``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (
            high is not None and value > high):
        upto = f"..{high}" if high is not None else " or more"
        raise ValueError(f"{name} must be an integer {low}{upto}, not {value!r}")


def of_type(name: str, value: object, typ: type) -> None:
    """Refuse ``value`` unless it is a ``typ`` (a bool is no int)."""
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ValueError(f"{name} must be {typ.__name__}, not {value!r}")


def need(d: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str) -> Any:
    """``d[key]``, checked to be a ``typ`` (a bool is no int unless ``typ`` says bool);
    ManifestError naming ``where`` and the field when it is missing or of another type."""
    if key not in d:
        raise ManifestError(f"{where}: field {key!r} is missing; {FIX}")
    v = d[key]
    allowed = typ if isinstance(typ, tuple) else (typ,)
    if not isinstance(v, allowed) or (isinstance(v, bool) and bool not in allowed):
        raise ManifestError(f"{where}: field {key!r} has the wrong type ({type(v).__name__})")
    return v


def read_record(cls: type[R], d: Any, where: str, prefix: str = "", **given: Any) -> R:
    """The record ``cls`` from the JSON object ``d``: each field from the key of its name
    (after ``prefix``), checked against the field's annotation; a missing field takes the
    record's default (a required one is an error); ``given``: fields read elsewhere.
    ManifestError names ``where`` and the field or value at fault."""
    if not isinstance(d, dict):
        raise ManifestError(f"{where}: not a JSON object; {FIX}")
    hints = get_type_hints(cls)
    kw = dict(given)
    for f in fields(cls):  # type: ignore[arg-type]  # cls is a dataclass
        key = prefix + f.name
        if f.name in kw:
            continue
        if key in d:
            kw[f.name] = need(d, key, _runtime_types(hints[f.name]), where)
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ManifestError(f"{where}: field {key!r} is missing; {FIX}")
    try:
        return cls(**kw)
    except ValueError as e:
        raise ManifestError(f"{where}: {e}; {FIX}") from e


def _runtime_types(hint: Any) -> tuple[type, ...]:
    """The classes ``isinstance`` checks for an annotation: ``int | None`` -> (int, NoneType)."""
    if isinstance(hint, types.UnionType):
        return tuple(hint.__args__)
    return (hint,)


@dataclass(frozen=True, kw_only=True)
class TransformOptions:
    """How every image is converted; part of the manifest (``options.transform``) so a
    conversion is reproducible. The defaults are ``imgprep convert``'s."""

    size: int = 256
    resize: str = "center-crop"
    filter: str = "lanczos"
    quality: int = 90
    max_pixels: int = DEFAULT_MAX_PIXELS
    exif_transpose: bool = False

    def __post_init__(self) -> None:
        within("size", self.size, *SIZE_RANGE)
        one_of("resize", self.resize, RESIZE_MODES)
        one_of("filter", self.filter, FILTER_NAMES)
        within("quality", self.quality, *QUALITY_RANGE)
        within("max_pixels", self.max_pixels, 1)
        of_type("exif_transpose", self.exif_transpose, bool)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: Any, where: str) -> TransformOptions:
        return read_record(cls, d, f"{where}: transform")


@dataclass(frozen=True, kw_only=True)
class Holdout:
    """A validation split held out of a train split (``--holdout-per-class``): the images a
    class, the hash key that picked them, how many in all, and the sha256 of the per-class
    counts (``imgprep.convert.holdout``). In ``options`` as ``holdout_<field>``."""

    per_class: int
    seed: int
    images: int
    counts_sha256: str

    def __post_init__(self) -> None:
        within("holdout_per_class", self.per_class, 1)
        of_type("holdout_seed", self.seed, int)
        within("holdout_images", self.images, 0)
        if not isinstance(self.counts_sha256, str) or not HEX64.match(self.counts_sha256):
            raise ValueError(f"holdout_counts_sha256 must be a sha256 in hex, not "
                             f"{self.counts_sha256!r}")

    def to_json(self) -> dict[str, Any]:
        return {HOLDOUT_PREFIX + f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, kw_only=True)
class StoreOptions:
    """How a sample's image is kept in its shard (``--store``): the converted JPEG (``jpeg``),
    its full-scale decode as stored pixels (``yuv420``: the JPEG's own planes; ``rgb``), or a
    mix, image by image (``mixed``: stored as ``raw`` where ``fraction`` of the images are,
    picked by a hash of the key, or where the JPEG is at least ``min_ratio`` of the stored
    pixels' bytes: where decoding costs most for the bytes it saves). In ``options`` as
    ``store_<field>``, and only when not ``jpeg``: a JPEG conversion's manifest is as before.
    """

    mode: str = "jpeg"
    raw: str = "yuv420"
    fraction: float | None = None
    min_ratio: float | None = None

    def __post_init__(self) -> None:
        one_of("store mode", self.mode, STORE_MODES)
        one_of("raw", self.raw, RAW_MODES)
        rules = [r for r in (self.fraction, self.min_ratio) if r is not None]
        if (self.mode == "mixed") != (len(rules) == 1) or len(rules) > 1:
            raise ValueError("--store mixed takes one rule, --raw-fraction or --raw-ratio, and "
                             "the other modes none")
        if self.fraction is not None and (isinstance(self.fraction, bool) or not
                                          0.0 <= self.fraction <= 1.0):
            raise ValueError(f"raw fraction must be within 0..1, not {self.fraction!r}")
        if self.min_ratio is not None and (isinstance(self.min_ratio, bool) or not
                                           self.min_ratio > 0.0):
            raise ValueError(f"raw ratio must be above 0, not {self.min_ratio!r}")
        if self.mode in RAW_MODES and self.raw != self.mode:
            object.__setattr__(self, "raw", self.mode)

    @property
    def stored(self) -> bool:
        """Whether any image is kept as stored pixels."""
        return self.mode != "jpeg"

    def to_json(self) -> dict[str, Any]:
        return {STORE_PREFIX + f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}


@dataclass(frozen=True, kw_only=True)
class ManifestOptions:
    """The manifest's ``options``: every option that decides the output bytes, and their
    ``fingerprint`` (with the class table, the listing and the labels: what a rerun compares;
    None before it is computed, and then not written)."""

    format: str
    split: str
    seed: int = 0
    meta: bool = True
    shard_size: int = DEFAULT_SHARD_SIZE
    num_shards: int | None = None
    transform: TransformOptions = field(default_factory=TransformOptions)
    holdout: Holdout | None = None
    store: StoreOptions = field(default_factory=StoreOptions)
    fingerprint: str | None = None

    def __post_init__(self) -> None:
        one_of("format", self.format, FORMATS)
        of_type("store", self.store, StoreOptions)
        if self.store.stored and self.format != "shards":
            raise ValueError(f"--store {self.store.mode} keeps pixels in shards; a label list "
                             "holds JPEG files (--format shards, or --store jpeg)")
        one_of("split", self.split, SPLITS)
        of_type("seed", self.seed, int)
        of_type("meta", self.meta, bool)
        within("shard_size", self.shard_size, 1)
        if self.num_shards is not None:
            within("num_shards", self.num_shards, 1)
        of_type("transform", self.transform, TransformOptions)
        if self.holdout is not None:
            of_type("holdout", self.holdout, Holdout)
        if self.fingerprint is not None:
            of_type("fingerprint", self.fingerprint, str)

    def to_json(self) -> dict[str, Any]:
        """The JSON object, holdout fields flat beside the others, and the fingerprint when
        there is one (without it: what the fingerprint itself is computed from)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)
             if f.name not in ("transform", "holdout", "store", "fingerprint")}
        d["transform"] = self.transform.to_json()
        if self.holdout is not None:
            d.update(self.holdout.to_json())
        if self.store.stored:
            d.update(self.store.to_json())
        if self.fingerprint is not None:
            d["fingerprint"] = self.fingerprint
        return d

    def flat(self) -> dict[str, Any]:
        """Every option by its own name, the transform's among them, without the fingerprint:
        what two conversions are compared by, option by option."""
        d = {k: v for k, v in self.to_json().items() if k not in ("transform", "fingerprint")}
        d.update(self.transform.to_json())
        return d

    @classmethod
    def from_json(cls, d: Any, where: str, *, fmt: str, split: str) -> ManifestOptions:
        """Read ``options``; ``fmt`` and ``split``: the manifest's own format and split, for an
        options object that lacks them."""
        w = f"{where}: options"
        if not isinstance(d, dict):
            raise ManifestError(f"{w}: not a JSON object; {FIX}")
        transform = TransformOptions.from_json(d["transform"], w) if "transform" in d \
            else TransformOptions()
        holdout = read_record(Holdout, d, w, HOLDOUT_PREFIX) \
            if f"{HOLDOUT_PREFIX}per_class" in d else None
        store = read_record(StoreOptions, d, w, STORE_PREFIX) \
            if f"{STORE_PREFIX}mode" in d else StoreOptions()
        known = {k: v for k, v in (("format", fmt), ("split", split)) if k not in d}
        return read_record(cls, d, w, transform=transform, holdout=holdout, store=store,
                           **known)


@dataclass(frozen=True, kw_only=True)
class SourceSection:
    """The manifest's ``source``: what was read: the listing's kind, the input's name, the
    images listed and the non-image members skipped; which check the labels passed
    (``label_check``, as convert's summary says it: ``trusted`` for labels taken as given
    with ``--trust-labels``; empty in manifests written before it was recorded); and, when a
    ground truth labelled the split, the images it lists (``expected``), how many of them
    the input lacked (``missing``) and the first of their names (``missing_first``, comma
    separated)."""

    kind: str
    name: str
    images: int
    skipped_non_images: int = 0
    label_check: str = ""
    expected: int | None = None
    missing: int = 0
    missing_first: str = ""

    def __post_init__(self) -> None:
        of_type("kind", self.kind, str)
        of_type("name", self.name, str)
        of_type("label_check", self.label_check, str)
        of_type("missing_first", self.missing_first, str)
        within("images", self.images, 0)
        within("skipped_non_images", self.skipped_non_images, 0)
        within("missing", self.missing, 0)
        if self.expected is not None:
            within("expected", self.expected, self.missing)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: Any, where: str) -> SourceSection:
        return read_record(cls, d, f"{where}: source")
