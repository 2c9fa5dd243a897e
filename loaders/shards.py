"""The shard loader: rank-aware, multiprocess, equal batches, deterministic, elastic resume.

- Planning (``loaders.epochs``) is sample-granular and a pure function of (counts, seed,
  epoch, World, start): each epoch a seeded permutation of the pool (the whole set in
  replicate mode, the node's shards in partition mode) is cut into equal steps; a rank's
  batches go to its workers round-robin, so every worker is busy whatever the shard count.
- Workers read samples by offset through the split's sample index (``imgprep.shards.index``), one
  ``pread`` per run of neighbouring samples (``loaders.reader``), and decode them into
  shared-memory slots (``loaders.ring``).
- Epochs, tails, resume (elastic too) are the base's (``loaders.base``), shared with the
  label-list loader; decoding and the error rule are the decoder backend's
  (``loaders.backends``: ``pillow``, ``dali`` or ``nvjpeg``).
- Node-local data (a manifest with a ``node`` section, from stage-to-node or a partitioned
  convert): a partition copy holds one node's share of a layout for a node count, so only
  that node of a job with that node count may load it; a replicate copy holds every shard
  and loads on any node count (an elastic resume on fewer or more nodes).

Workers get the World from the loader, never from environment variables, and read the epoch
and start from shared memory, so they stay alive across epochs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from imgprep import MODES, Manifest, ManifestError, World, WorldError, read_manifest
from imgprep.rawformat import IMAGE_EXTS
from imgprep.shards.index import SampleIndex, read_index
from loaders import rawdecode
from loaders.backends import EncodedSample
from loaders.base import PlannedLoader
from loaders.batch import PAD_LABEL
from loaders.config import LoaderOptions
from loaders.epochs import EpochPlan
from loaders.errors import LoaderError, refuse_unlabelled
from loaders.legacy import takes_loose_options
from loaders.reader import Locations, Reader

__all__ = ["PAD_LABEL", "EpochPlan", "LoaderError", "ShardLoader", "ShardSet", "open_shards"]


# ---------------------------------------------------------------------------- the shard set


@dataclass(frozen=True, eq=False, kw_only=True)
class ShardSet:
    """The whole set's shards (plans are computed from these), which are in ``folder``, and
    where every present sample lies (from the index)."""

    folder: Path
    split: str
    names: tuple[str, ...]
    samples: tuple[int, ...]
    present: frozenset[int]
    mode: str
    seed: int
    num_nodes: int | None
    node_rank: int | None
    mean: tuple[float, ...]
    std: tuple[float, ...]
    num_classes: int
    where: Locations
    store: str = "jpeg"  # how the images are kept (the manifest's store mode)

    def __post_init__(self) -> None:
        if len(self.names) != len(self.samples):
            raise ValueError(f"{len(self.names)} shard names for {len(self.samples)} counts")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")


def _whole_set(folder: Path, split: str, m: Manifest, mode: str | None
               ) -> tuple[tuple[str, ...], tuple[int, ...], str, int, int | None, int | None]:
    node = m.node
    if node is None:
        return (tuple(s.name for s in m.shards), tuple(s.samples for s in m.shards),
                mode or "replicate", -1, None, None)
    names = tuple(n for n, _ in node.all_shards)
    samples = tuple(k for _, k in node.all_shards)
    if mode is not None and mode != node.mode:
        raise WorldError(f"{folder} holds {node.mode} node-local data (node "
                         f"{node.node_rank} of {node.num_nodes}); load it "
                         f"with mode {node.mode!r}, not {mode!r}")
    return names, samples, node.mode, node.seed, node.num_nodes, node.node_rank


def open_shards(folder: Path, split: str, mode: str | None = None, seed: int = 0) -> ShardSet:
    """Read ``folder``'s manifest and sample index: a full conversion, or a node-local one
    from stage-to-node or a partitioned convert (which fixes the mode and seed)."""
    m = read_manifest(folder, split)
    refuse_unlabelled(m, folder)
    if m.format != "shards":
        raise ManifestError(f"{folder}/{split}.json describes a label list; use the "
                            "label-list loader (loaders.make_loader picks it)")
    names, samples, mode, laid_seed, nodes, node_rank = _whole_set(folder, split, m, mode)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")  # before the index is read
    pos = {n: i for i, n in enumerate(names)}
    for s in m.shards:
        i = pos.get(s.name)
        if i is None or samples[i] != s.samples:
            raise ManifestError(
                f"{folder}/{split}.json: shard {s.name} holds {s.samples} samples, the "
                f"whole set's plan says {samples[i] if i is not None else 'none'}: every "
                "rank must plan from the same counts; reconvert with --max-errors 0 or "
                "stage from the full manifest")
    return ShardSet(folder=folder, split=split, names=names, samples=samples,
                    present=frozenset(pos[s.name] for s in m.shards), mode=mode,
                    seed=laid_seed if laid_seed >= 0 else seed, num_nodes=nodes,
                    node_rank=node_rank, mean=tuple(m.mean), std=tuple(m.std),
                    num_classes=len(m.classes), where=_locations(folder, m, names, samples),
                    store=m.options.store.mode)


def _locations(folder: Path, m: Manifest, names: tuple[str, ...], samples: tuple[int, ...]
               ) -> Locations:
    """Every sample's image and cls members, in the whole set's numbering (-1 where absent):
    the image is its ``.jpg`` or, in a set that stores pixels, its stored-pixel member."""
    ix = read_index(folder, m)
    first = np.concatenate([[0], np.cumsum(np.asarray(samples, np.int64))])
    ix_first = ix.first_sample
    ix_pos = {n: i for i, n in enumerate(ix.names)}
    cols = [np.full(int(first[-1]), -1, np.int64) for _ in range(4)]
    kinds = np.zeros(int(first[-1]), np.uint8) if m.options.store.stored else None
    shard_bytes = np.zeros(len(names), np.int64)
    image, image_ext = _image_members(ix)
    cls = ix.members("cls")
    for s in m.shards:
        i, k = names.index(s.name), ix_pos[s.name]
        shard_bytes[i] = s.bytes
        src, dst = slice(ix_first[k], ix_first[k + 1]), slice(first[i], first[i + 1])
        for col, arr in zip(cols, (*image, *cls), strict=True):
            col[dst] = arr[src]
        if kinds is not None:
            kinds[dst] = image_ext[src]
    return Locations(folder, names, shard_bytes, first, (cols[0], cols[1]), (cols[2], cols[3]),
                     kinds)


def _image_members(ix: SampleIndex) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """Per sample of the index, its image member's offset and size (-1: none) and the
    extension it has (an index into ``IMAGE_EXTS``)."""
    off, size = ix.members(IMAGE_EXTS[0])
    which = np.zeros(len(off), np.uint8)
    for e, ext in enumerate(IMAGE_EXTS[1:], 1):
        o, n = ix.members(ext)
        has = o >= 0
        off[has], size[has], which[has] = o[has], n[has], e
    return (off, size), which


def check_world(shards: ShardSet, world: World) -> None:
    """Refuse a World that does not match the node-local data in the folder: a partition
    copy serves only its own node of its node count; a replicate copy holds every shard and
    serves any node of any node count."""
    if shards.num_nodes is None or shards.mode == "replicate":
        return
    if world.num_nodes != shards.num_nodes or world.node_rank != shards.node_rank:
        raise WorldError(
            f"rank {world.rank}: {shards.folder} holds the data of node {shards.node_rank} of "
            f"{shards.num_nodes}, but this rank is on node {world.node_rank} of "
            f"{world.num_nodes}; stage with the job's node count"
        )


def check_present(shards: ShardSet, world: World, plan: EpochPlan) -> None:
    """Refuse a plan that needs shards the folder lacks, before reading anything."""
    need = np.unique(plan.shards_of(plan.table))
    missing = [shards.names[i] for i in need.tolist() if i not in shards.present]
    if missing:
        raise LoaderError(
            f"rank {world.rank}: needs {len(missing)} shards that {shards.folder} does not "
            f"hold (first: {missing[0]}); stage them (imgprep stage-to-node) with this job's "
            "node count and mode")


# ---------------------------------------------------------------------------- the loader


@dataclass
class _ShardSource:
    """A worker's reads: samples by offset through the sample index (its files opened on
    first use, after the fork)."""

    where: Locations
    rank: int
    fix: str = "verify or restage the shard"
    _reader: Reader | None = None

    def fetch(self, ids: np.ndarray) -> list[EncodedSample]:
        if self._reader is None:
            self._reader = Reader(self.where, self.rank)
        return [EncodedSample(f"{shard}: sample {key}", jpg, label) if isinstance(jpg, bytes)
                else EncodedSample(f"{shard}: sample {key}", b"", label, jpg)
                for shard, key, jpg, label in self._reader.read(ids)]


class ShardLoader(PlannedLoader):
    """Iterate ``(images uint8 NCHW, labels int64)`` batches of one rank over an epoch.

    Args:
        folder: a converted or staged folder holding ``<split>.json`` and its sample index.
        split: ``"train"`` (defaults: shuffle, ``tail="drop"``, train transform) or ``"val"``
            (no shuffle, ``tail="pad"``, center crop).
        world: this rank; every rank of the job computes the same plan from it.
        options: how the loader runs (``loaders.config.LoaderOptions``: batch size, workers,
            seed, …).
        mode: ``replicate`` or ``partition`` (node-local manifests fix it).

    ``len(loader)`` (batches the next pass yields) and ``batches_per_epoch`` are stated
    before the epoch from the manifest; every rank gets the same unless ``tail="uneven"``.

    Iteration: ``iter(loader)`` gives batches of their own (copied out of the workers' shared
    memory; pinned with ``pin_memory``); ``loader.in_place()`` gives the same batches without
    that copy, each a view of the memory its worker decoded it into and valid only until the
    next batch is asked for from that iterator (or another pass starts): use it, or
    ``.clone()`` it, before ``next()`` (``PlannedLoader.in_place``; ``DeviceLoader`` on the
    CPU takes batches so).
    """

    @takes_loose_options
    def __init__(self, folder: Path, split: str, world: World, options: LoaderOptions, *,
                 mode: str | None = None) -> None:
        self.shards = open_shards(Path(folder), split, mode, options.seed)
        s = self.shards
        check_world(s, world)
        rawdecode.check_backend(s.store, options.backend, options.crop_decode,
                                f"{folder}/{split}.json")
        cfg = options.config(train=split == "train", samples=s.samples, world=world,
                             mode=s.mode, layout_seed=s.seed, num_classes=s.num_classes)
        super().__init__(cfg, _ShardSource(s.where, world.rank))

    @property
    def pixels(self) -> str | None:
        """The pixel version (``PlannedLoader.pixels``), with the set's store mode."""
        return rawdecode.pixel_version(super().pixels, self.shards.store)

    @property
    def mean(self) -> tuple[float, ...]:
        return self.shards.mean

    @property
    def std(self) -> tuple[float, ...]:
        return self.shards.std

    @property
    def num_classes(self) -> int:
        return self.shards.num_classes

    def check_plan(self, plan: EpochPlan) -> None:
        check_present(self.shards, self.world, plan)

    def describe(self, plan: EpochPlan, b: int) -> str:
        names = [self.shards.names[i] for i in
                 np.unique(plan.shards_of(plan.table[b:b + 1])).tolist()]
        more = f", … {len(names)} shards" if len(names) > 3 else ""
        return f" from {', '.join(names[:3])}{more}"
