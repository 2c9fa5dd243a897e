"""Building a conversion's indexes: the sample index (``imgprep.shards.index``) of a split
and, where asked, the DALI index beside each shard (``imgprep.shards.dali``), from the layouts
``convert``'s shard writers kept or from the shards' tar headers; ``imgprep index``.

The shards are read by ``workers`` forked processes that die with their parent, one shard a
task, each writing its shard's DALI index and sending back its layout; the parent takes the
layouts in shard order and alone writes the sample index and the manifest, so every file is
byte-identical whatever the number of workers. A shard that cannot be read fails the run with
the error its worker raised (the first such shard in manifest order), before anything but
DALI indexes is written.
"""

from __future__ import annotations

import functools
import io
import multiprocessing as mp
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import numpy as np

from imgprep.errors import ImgprepError, ManifestError
from imgprep.fsutil import write_bytes_atomic
from imgprep.job.world import World
from imgprep.procs import die_with_parent
from imgprep.shards.dali import VERSION as DALI_VERSION
from imgprep.shards.dali import drop_stale, write_idx
from imgprep.shards.index import write_index
from imgprep.shards.layout import Layout, scan_layout
from imgprep.shards.manifest import (
    IndexEntry,
    Manifest,
    ShardEntry,
    find_manifests,
    read_manifest,
    write_manifest,
)

Tick = Callable[[int], None]
R = TypeVar("R")


def save_layout(path: Path, layout: Layout, shard: ShardEntry) -> None:
    """Keep a shard's layout beside its task record, tied to the shard's size and sha256."""
    buf = io.BytesIO()
    np.savez(buf, counts=layout.counts, offset=layout.offset, size=layout.size,
             ext=layout.ext, exts=np.asarray(layout.exts, dtype=str),
             keys=np.asarray(layout.keys or (), dtype=str),
             shard=np.asarray([shard.name, str(shard.bytes), shard.sha256], dtype=str))
    write_bytes_atomic(path, buf.getvalue(), durable=False)


def load_layout(path: Path, shard: ShardEntry) -> Layout | None:
    """The saved layout of ``shard``, or None when absent, unreadable or of other bytes."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if z["shard"].tolist() != [shard.name, str(shard.bytes), shard.sha256]:
                return None
            keys = tuple(z["keys"].tolist()) if "keys" in z.files else ()
            return Layout(tuple(z["exts"].tolist()), z["counts"], z["offset"], z["size"],
                          z["ext"], keys if len(keys) == len(z["counts"]) else None)
    except (OSError, ValueError, KeyError):
        return None


def layout_path(state: Path, shard_name: str) -> Path:
    """Where ``convert`` keeps the layout of shard ``shard_name`` (``state``: its task
    records' folder)."""
    return state / f"{shard_name}.layout.npz"


def _worker_init(parent: int) -> None:
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def in_shard_order(job: Callable[[ShardEntry], R], shards: Sequence[ShardEntry],
                   workers: int, tick: Tick) -> Iterator[R]:
    """``job`` of each shard on ``workers`` forked processes that die with this one (in this
    process for one worker or one shard), yielded in shard order whatever order they finish
    in; ``tick(samples)`` after each. The error a job raised is raised here as it was in the
    worker: that of the first shard in order that failed."""
    if workers <= 1 or len(shards) <= 1:
        for s in shards:
            yield job(s)
            tick(s.samples)
        return
    ex = ProcessPoolExecutor(min(workers, len(shards)), mp_context=mp.get_context("fork"),
                             initializer=_worker_init, initargs=(os.getpid(),))
    try:
        futures: list[Future[R]] = [ex.submit(job, s) for s in shards]
        for s, f in zip(shards, futures, strict=True):
            try:
                got = f.result()
            except BrokenProcessPool as e:
                raise ImgprepError(
                    f"an index worker died (killed or out of memory) before shard {s.name} "
                    "was indexed; no sample index was written: rerun imgprep index, with "
                    "fewer --workers if memory is short") from e
            yield got
            tick(s.samples)
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def shard_layout(folder: Path, shard: ShardEntry, saved: Path | None = None,
                 dali: bool = False) -> Layout:
    """The layout of ``shard`` of ``folder`` as the sample index keeps it (no keys): from the
    layout saved under ``saved`` (by convert) where it matches the shard, else from the
    shard's tar headers. With ``dali``, the shard's DALI index is written beside it from the
    same layout (``imgprep.shards.dali``)."""
    got = load_layout(layout_path(saved, shard.name), shard) if saved is not None else None
    if got is None or (dali and got.keys is None):
        got = scan_layout(folder / shard.name)
    if dali:
        write_idx(folder, shard.name, got)
    return replace(got, keys=None)  # the sample index keeps no keys


def index_shards(folder: Path, split: str, shards: Sequence[ShardEntry],
                 saved: Path | None = None, dali: bool = False, workers: int = 1,
                 tick: Tick | None = None) -> IndexEntry:
    """Index ``shards`` of ``folder`` (``shard_layout`` of each, on ``workers`` processes,
    combined in shard order: the same bytes for any number); ``tick(n)`` counts the samples
    of each shard done. With ``dali``, each shard's DALI index is written beside it."""
    job = functools.partial(shard_layout, folder, saved=saved, dali=dali)
    layouts = in_shard_order(job, shards, workers, tick or (lambda n: None))
    entry = write_index(folder, split, shards, layouts)
    if not dali:
        return entry
    drop_stale(folder, split, [s.name for s in shards])
    return replace(entry, dali=DALI_VERSION)


@dataclass(frozen=True, kw_only=True)
class IndexedSplit:
    """What ``imgprep index`` built for one split: its sample index file (``index``, of
    ``bytes`` bytes) over ``shards`` shards and ``samples`` samples, and the version of the
    DALI indexes beside the shards (None when there are none)."""

    split: str
    index: str
    bytes: int
    shards: int
    samples: int
    dali: str | None


@dataclass(frozen=True, kw_only=True)
class IndexSummary:
    """What ``imgprep index`` did: the ``folder``, the ``workers`` that scanned its shards
    and each split indexed, in the order of its manifests."""

    folder: str
    workers: int
    splits: list[IndexedSplit]


@dataclass(frozen=True)
class IndexPlan:
    """The shard splits of ``folder`` that ``imgprep index`` rebuilds (their manifests)."""

    folder: Path
    manifests: tuple[Manifest, ...]

    @property
    def samples(self) -> int:
        """Samples in all, what the progress bar counts."""
        return sum(m.total_samples for m in self.manifests)


def plan_index(folder: Path, split: str | None = None) -> IndexPlan:
    """The shard splits of ``folder`` (or ``split`` alone) to index; ManifestError naming the
    folder when it holds no finished conversion, or only label lists."""
    paths = [folder / f"{split}.json"] if split is not None else find_manifests(folder)
    if not paths:
        raise ManifestError(f"no manifest in {folder}: the conversion did not finish; rerun "
                            "imgprep convert")
    manifests = tuple(m for m in map(read_manifest, paths) if m.format == "shards")
    if not manifests:
        raise ManifestError(f"{folder} holds no shards to index (label lists need none)")
    return IndexPlan(folder, manifests)


def run_index(plan: IndexPlan, dali: bool = False, workers: int | None = None,
              tick: Tick | None = None) -> IndexSummary:
    """``imgprep index``: (re)build the sample index of each split of ``plan`` from tar
    headers on ``workers`` processes (default: the CPUs this process may use), then rewrite
    its manifest atomically to name the index. The DALI indexes beside the shards are rebuilt
    too where the manifest names them, and written where it does not with ``dali``.
    ``tick(n)``: n more samples indexed."""
    n = workers or World().cores_per_rank()
    folder, done = plan.folder, []
    for m in plan.manifests:
        with_dali = dali or (m.index is not None and m.index.dali is not None)
        entry = index_shards(folder, m.split, m.shards, dali=with_dali, workers=n, tick=tick)
        write_manifest(folder, replace(m, index=entry))
        done.append(IndexedSplit(split=m.split, index=entry.name, bytes=entry.bytes,
                                 shards=len(m.shards), samples=m.total_samples,
                                 dali=entry.dali))
    return IndexSummary(folder=str(folder), workers=n, splits=done)


def index_folder(folder: Path, split: str | None = None, dali: bool = False,
                 workers: int | None = None) -> list[IndexedSplit]:
    """``imgprep index`` as a library call (``plan_index`` then ``run_index``): each split
    indexed, in the order of its manifests."""
    return run_index(plan_index(folder, split), dali, workers).splits
