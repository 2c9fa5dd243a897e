"""The manifest: what a finished conversion holds, written last and atomically.

Loaders and stage-to-node plan from the manifest alone (no tar scan). A folder without a
manifest is not a finished conversion.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from imgprep.errors import ManifestError
from imgprep.fsutil import write_json_atomic
from imgprep.job.assign import MODES
from imgprep.sections import (
    FORMATS,
    HEX64,
    SPLITS,
    ManifestOptions,
    SourceSection,
    need,
)

FORMAT_VERSION = 1
SHARD_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+-\d{6}\.tar$")
INDEX_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+-index\.bin$")


@dataclass(frozen=True)
class ShardEntry:
    """One shard: file name (relative to the manifest's folder), samples, size and checksum."""

    name: str
    samples: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class IndexEntry:
    """A split's sample index: a sidecar file beside the manifest (``index_name(split)``) that
    gives every sample's byte offset and size in its shard; copied with the shards. ``dali``:
    the version of the DALI index (``imgprep.shards.dali``) made from it beside each shard,
    None when there is none."""

    name: str
    bytes: int
    sha256: str
    dali: str | None = None


@dataclass(frozen=True)
class NodeSection:
    """Which part of a whole set a node-local manifest holds (written by stage-to-node and by
    a partitioned convert): this node's place, the layout's mode and seed, and the whole set's
    sample count and shards (``all_shards``: name and samples of every shard of every node),
    from which loaders compute every node's share. Invalid values raise ManifestError."""

    node_rank: int
    num_nodes: int
    mode: str
    seed: int
    total_samples: int  # of the whole set, all nodes together
    shards: int  # of the whole set
    all_shards: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "all_shards",
                           tuple((str(n), int(k)) for n, k in self.all_shards))
        if not 0 <= self.node_rank < self.num_nodes:
            raise ManifestError(f"node_rank {self.node_rank} is not in 0..num_nodes-1 "
                                f"({self.num_nodes} nodes)")
        if self.mode not in MODES:
            raise ManifestError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.shards != len(self.all_shards) or self.shards < 1:
            raise ManifestError(f"shards {self.shards} != {len(self.all_shards)} all_shards")
        if any(k < 0 or not SHARD_NAME_RE.match(n) for n, k in self.all_shards):
            raise ManifestError("all_shards holds a malformed shard name or a negative count")
        if self.total_samples < 0:
            raise ManifestError(f"total_samples {self.total_samples} is negative")

    def to_json(self) -> dict[str, Any]:
        return {"node_rank": self.node_rank, "num_nodes": self.num_nodes, "mode": self.mode,
                "seed": self.seed, "total_samples": self.total_samples, "shards": self.shards,
                "all_shards": [[n, k] for n, k in self.all_shards]}


def parse_node(d: Any, where: str) -> NodeSection:
    """Validate a manifest's ``node`` object; raises ManifestError naming ``where``."""
    w = f"{where}: node"
    if not isinstance(d, dict):
        raise ManifestError(f"{w}: not an object; reconvert or restage the node's data")
    pairs = need(d, "all_shards", list, w)
    if not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
               and isinstance(p[1], int) and not isinstance(p[1], bool) for p in pairs):
        raise ManifestError(f"{w}: all_shards must be [name, samples] pairs")
    rank, nodes = need(d, "node_rank", int, w), need(d, "num_nodes", int, w)
    mode, seed = need(d, "mode", str, w), need(d, "seed", int, w)
    total, shards = need(d, "total_samples", int, w), need(d, "shards", int, w)
    try:
        return NodeSection(rank, nodes, mode, seed, total, shards, tuple(map(tuple, pairs)))
    except ManifestError as e:
        raise ManifestError(f"{w}: {e}; reconvert or restage the node's data") from e


def index_name(split: str) -> str:
    """The file name of a split's sample index (the one spelling of it)."""
    return f"{split}-index.bin"


@dataclass(frozen=True)
class Manifest:
    """A finished conversion of one split, in either output format.

    A node-local manifest (written by stage-to-node or a partitioned convert) lists only the
    shards on that node and carries ``node`` (a ``NodeSection``): which part of what it is.
    ``labelled`` is False for a split converted without labels (``--split test``): its samples
    have no ``.cls`` (its list lines no label), and loaders refuse it. A manifest without the
    field is labelled (every split before it was). ``options`` and ``source`` are the typed
    sections of ``imgprep.sections``; ``source`` is None where the file's is empty. ``mean``
    and ``std`` (per channel, on the 0-1 scale, from ``stats_images`` images) are three
    numbers each in any manifest read.
    """

    split: str
    format: str
    total_samples: int
    classes: list[list[str]]
    mean: list[float]
    std: list[float]
    options: ManifestOptions
    tool_version: str
    shards: list[ShardEntry] = field(default_factory=list)
    list_file: str | None = None
    list_sha256: str | None = None
    errors: int = 0
    error_log: str | None = None
    source: SourceSection | None = None
    stats_images: int = 0
    node: NodeSection | None = None
    index: IndexEntry | None = None
    labelled: bool = True
    transform_version: int = 1  # how the images were made (imgprep.convert.image); 1 if absent
    format_version: int = FORMAT_VERSION

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        # field by field, not asdict(): that deep-copies the 1000 classes and every shard
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["options"] = self.options.to_json()
        d["source"] = self.source.to_json() if self.source is not None else {}
        d["shards"] = [asdict(s) for s in self.shards]
        d["node"] = self.node.to_json() if self.node is not None else None
        if self.index is None:
            del d["index"]
        else:
            d["index"] = {k: v for k, v in asdict(self.index).items() if v is not None}
        return d


def manifest_path(folder: Path, split: str) -> Path:
    return folder / f"{split}.json"


def write_manifest(folder: Path, m: Manifest) -> Path:
    path = manifest_path(folder, m.split)
    write_json_atomic(path, m.to_json())
    return path


def _stats(d: dict[str, Any], key: str, where: str) -> list[float]:
    """A per-channel statistic: three numbers."""
    v = need(d, key, list, where)
    if len(v) != 3 or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in v):
        raise ManifestError(f"{where}: field {key!r} must be three numbers (one a channel)")
    return v


def _shards(d: dict[str, Any], where: str) -> list[ShardEntry]:
    shards = []
    for i, s in enumerate(need(d, "shards", list, where)):
        w = f"{where}: shards[{i}]"
        if not isinstance(s, dict):
            raise ManifestError(f"{w}: not an object")
        e = ShardEntry(need(s, "name", str, w), need(s, "samples", int, w),
                       need(s, "bytes", int, w), need(s, "sha256", str, w))
        if not SHARD_NAME_RE.match(e.name):
            raise ManifestError(f"{w}: shard name {e.name!r} is not a plain shard file name")
        if e.samples < 0 or e.bytes < 0 or not HEX64.match(e.sha256):
            raise ManifestError(f"{w}: negative count or malformed sha256")
        shards.append(e)
    return shards


def _index(d: dict[str, Any], where: str) -> IndexEntry | None:
    if d.get("index") is None:
        return None
    w = f"{where}: index"
    ix = need(d, "index", dict, where)
    index = IndexEntry(need(ix, "name", str, w), need(ix, "bytes", int, w),
                       need(ix, "sha256", str, w),
                       need(ix, "dali", str, w) if ix.get("dali") is not None else None)
    if not INDEX_NAME_RE.match(index.name) or index.bytes < 0 or not HEX64.match(index.sha256):
        raise ManifestError(f"{w}: malformed name, size or sha256")
    return index


def parse_manifest(d: Any, where: str) -> Manifest:
    """Validate a decoded manifest; raises ManifestError naming the first problem. A field
    that an older imgprep did not write takes its default (``labelled``: True; in a section,
    the record's own: ``imgprep.sections``)."""
    if not isinstance(d, dict):
        raise ManifestError(f"{where}: not a JSON object")
    version = need(d, "format_version", int, where)
    if version != FORMAT_VERSION:
        raise ManifestError(
            f"{where}: format version {version} is not supported (this imgprep reads "
            f"{FORMAT_VERSION}); use the imgprep that wrote it or reconvert"
        )
    fmt = need(d, "format", str, where)
    if fmt not in FORMATS:
        raise ManifestError(f"{where}: unknown format {fmt!r}")
    shards = _shards(d, where)
    total = need(d, "total_samples", int, where)
    if fmt == "shards" and total != sum(s.samples for s in shards):
        raise ManifestError(f"{where}: total_samples {total} != sum of shard samples")
    classes = need(d, "classes", list, where)
    if not all(isinstance(c, list) and len(c) == 2 for c in classes):
        raise ManifestError(f"{where}: classes must be [wnid, name] pairs")
    split = need(d, "split", str, where)
    transform = need(d, "transform_version", int, where) if "transform_version" in d else 1
    if transform < 1:
        raise ManifestError(f"{where}: transform_version {transform} is not 1 or more")
    return Manifest(
        split=split, format=fmt, total_samples=total, classes=classes,
        mean=_stats(d, "mean", where), std=_stats(d, "std", where),
        options=ManifestOptions.from_json(need(d, "options", dict, where), where, fmt=fmt,
                                          split=split),
        tool_version=need(d, "tool_version", str, where),
        shards=shards, list_file=d.get("list_file"), list_sha256=d.get("list_sha256"),
        errors=need(d, "errors", int, where), error_log=d.get("error_log"),
        source=SourceSection.from_json(d["source"], where) if d.get("source") else None,
        stats_images=need(d, "stats_images", int, where) if "stats_images" in d else 0,
        node=parse_node(d["node"], where) if d.get("node") is not None else None,
        index=_index(d, where),
        labelled=need(d, "labelled", bool, where) if "labelled" in d else True,
        transform_version=transform, format_version=version,
    )


def find_manifests(folder: Path) -> list[Path]:
    """The manifest files in ``folder``: ``<split>.json`` with an imgprep format field, and a
    ``train.json`` or ``val.json`` even when it is damaged, so that reading it names the damage
    rather than calling the conversion unfinished."""
    found = []
    for p in sorted(folder.glob("*.json")):
        try:
            d = json.loads(p.read_text("utf-8"))
        except (OSError, ValueError):
            d = None
        if p.stem in SPLITS or (
                isinstance(d, dict) and "format_version" in d and d.get("format") in FORMATS):
            found.append(p)
    return found


def read_manifest(path: Path, split: str | None = None) -> Manifest:
    """Read ``path`` (a manifest file, or a folder holding one; ``split`` picks among several)."""
    if path.is_dir():
        if split is not None:
            path = manifest_path(path, split)
        else:
            found = find_manifests(path)
            if not found:
                raise ManifestError(
                    f"no manifest in {path}: the conversion did not finish; rerun imgprep convert"
                )
            if len(found) > 1:
                names = ", ".join(p.stem for p in found)
                raise ManifestError(
                    f"{path} holds several splits ({names}); choose one with --split"
                )
            path = found[0]
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError as e:
        raise ManifestError(
            f"no manifest {path}: the conversion did not finish; rerun imgprep convert"
        ) from e
    except OSError as e:
        raise ManifestError(f"cannot read manifest {path}: {e.strerror}") from e
    try:
        d = json.loads(text)
    except ValueError as e:
        raise ManifestError(f"{path} is not valid JSON ({e}); reconvert or restore it") from e
    return parse_manifest(d, str(path))
