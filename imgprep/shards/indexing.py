"""Building a conversion's indexes: the sample index (``imgprep.shards.index``) of a split
and, where asked, the DALI index beside each shard (``imgprep.shards.dali``), from the layouts
``convert``'s shard writers kept or from the shards' tar headers; ``imgprep index``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from imgprep.errors import ManifestError
from imgprep.fsutil import write_bytes_atomic
from imgprep.shards.dali import VERSION as DALI_VERSION
from imgprep.shards.dali import drop_stale, write_idx
from imgprep.shards.index import write_index
from imgprep.shards.layout import Layout, scan_layout
from imgprep.shards.manifest import (
    IndexEntry,
    ShardEntry,
    find_manifests,
    read_manifest,
    write_manifest,
)


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


def index_shards(folder: Path, split: str, shards: Sequence[ShardEntry],
                 saved: Path | None = None, dali: bool = False) -> IndexEntry:
    """Index ``shards`` of ``folder``: from layouts saved under ``saved`` (by convert) where
    they match the shard, else by scanning the shard's tar headers. With ``dali``, each
    shard's DALI index is written beside it from the same layout (``imgprep.shards.dali``)."""

    def layout(s: ShardEntry) -> Layout:
        got = load_layout(layout_path(saved, s.name), s) if saved is not None else None
        if got is None or (dali and got.keys is None):
            got = scan_layout(folder / s.name)
        if dali:
            write_idx(folder, s.name, got)
        return replace(got, keys=None)  # the sample index keeps no keys

    entry = write_index(folder, split, shards, (layout(s) for s in shards))
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


def index_folder(folder: Path, split: str | None = None,
                 dali: bool = False) -> list[IndexedSplit]:
    """``imgprep index``: (re)build the sample index of each shard split in ``folder`` (or of
    ``split``) from tar headers, then rewrite its manifest atomically to name the index. The
    DALI indexes beside the shards are rebuilt too where the manifest names them, and
    written where it does not with ``dali``."""
    paths = [folder / f"{split}.json"] if split is not None else find_manifests(folder)
    if not paths:
        raise ManifestError(f"no manifest in {folder}: the conversion did not finish; rerun "
                            "imgprep convert")
    done = []
    for p in paths:
        m = read_manifest(p)
        if m.format != "shards":
            continue
        with_dali = dali or (m.index is not None and m.index.dali is not None)
        entry = index_shards(folder, m.split, m.shards, dali=with_dali)
        write_manifest(folder, replace(m, index=entry))
        done.append(IndexedSplit(split=m.split, index=entry.name, bytes=entry.bytes,
                                 shards=len(m.shards), samples=m.total_samples,
                                 dali=entry.dali))
    if not done:
        raise ManifestError(f"{folder} holds no shards to index (label lists need none)")
    return done
