"""``imgprep convert --from-shards DIR -o OUT --store MODE``: a conversion's shards kept
another way (stored pixels, or a mix), without the original download.

Every shard split of ``DIR`` (each ``<split>.json``) is rewritten into ``OUT`` shard by
shard, sample by sample in order, under the same names: the ``.jpg`` member replaced by the
member ``imgprep.convert.store`` gives for it (the same rule as ``convert --store``, so the
bytes are those a conversion from the originals with the same options writes), every other
member as it was. Then the sample index and the DALI indexes are built, and the manifest is
written last: ``DIR``'s, with the shards' new sizes and sha256, the index, ``store`` in its
options and a fingerprint made of ``DIR``'s and the store's. A rerun that finds that manifest
converts nothing; any other ``OUT`` split is refused unless ``--overwrite``. Shards are
rewritten on ``workers`` forked processes (``imgprep.shards.indexing.in_shard_order``):
the output is the same for any number.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from imgprep.convert import store
from imgprep.errors import ImageError, ManifestError, OutputError, ShardError
from imgprep.fsutil import fsync_dir
from imgprep.sections import StoreOptions
from imgprep.shards.dali import has_dali
from imgprep.shards.indexing import in_shard_order, index_shards
from imgprep.shards.manifest import (
    Manifest,
    ShardEntry,
    find_manifests,
    manifest_path,
    read_manifest,
    write_manifest,
)
from imgprep.shards.tario import iter_samples
from imgprep.shards.writers import ShardWriter

Tick = Callable[[int], None]


@dataclass(frozen=True, kw_only=True)
class Restored:
    """One split rewritten: its manifest, samples, how many kept as stored pixels, and the
    bytes of its shards before and after; ``done`` False when a finished one was found."""

    split: str
    manifest: str
    samples: int
    stored: int
    bytes_before: int
    bytes_after: int
    done: bool = True


def fingerprint(m: Manifest, opts: StoreOptions) -> str:
    """What identifies the rewrite of ``m`` under ``opts``."""
    text = json.dumps({"from": m.options.fingerprint, "store": opts.to_json()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _rewrite(src: Path, out: Path, opts: StoreOptions, max_pixels: int,
             entry: ShardEntry) -> tuple[ShardEntry, int]:
    """Shard ``entry`` of ``src`` rewritten into ``out``; its entry and the samples stored."""
    stored = 0
    with ShardWriter(out / entry.name) as w:
        for key, fields in iter_samples(src / entry.name):
            jpeg = fields.pop("jpg", None)
            if jpeg is None:
                raise ShardError(f"{src / entry.name}: sample {key} has no .jpg to keep "
                                 "otherwise; verify the source set")
            try:
                ext, image = store.image_member(opts, key, jpeg, max_pixels)
            except ImageError as e:
                raise ShardError(f"{src / entry.name}: sample {key}: {e}") from e
            stored += ext != store.JPEG_EXT
            w.add(key, {ext: image, **fields})
    return ShardEntry(entry.name, w.samples, w.bytes, w.sha256), stored


def _check(src: Path, out: Path, m: Manifest, overwrite: bool, want: str) -> bool:
    """Whether the split is to be written (False: finished already); refusals first."""
    if m.format != "shards":
        raise ManifestError(f"{src}/{m.split}.json is a label list; --from-shards rewrites "
                            "shards")
    if m.options.store.stored:
        raise ManifestError(f"{src}/{m.split}.json keeps stored pixels already "
                            f"({m.options.store.mode}); rewrite a set that keeps JPEGs")
    if m.node is not None:
        raise ManifestError(f"{src}/{m.split}.json is one node's part of a set; rewrite the "
                            "whole set, then stage it")
    path = manifest_path(out, m.split)
    if not path.is_file():
        return True
    try:
        there = read_manifest(path).options.fingerprint
    except ManifestError:
        there = None
    if there == want:
        return False
    if not overwrite:
        raise OutputError(f"{path} is another conversion of {m.split}; pass --overwrite to "
                          "replace it, or pick another --out")
    path.unlink()
    return True


def from_shards(src: Path, out: Path, opts: StoreOptions, *, workers: int = 1,
            overwrite: bool = False, tick: Tick | None = None) -> list[Restored]:
    """Rewrite every shard split of ``src`` into ``out`` as ``opts`` says (module docstring);
    one ``Restored`` a split, in the order of its manifests."""
    store.check_available(opts)
    if src.resolve() == out.resolve():
        raise OutputError(f"--out {out} is the source set; pick another folder")
    paths = find_manifests(src)
    if not paths:
        raise ManifestError(f"no manifest in {src}: --from-shards reads a finished conversion")
    out.mkdir(parents=True, exist_ok=True)
    return [_restore_split(src, out, read_manifest(p), opts, workers, overwrite, tick)
            for p in paths]


def _restore_split(src: Path, out: Path, m: Manifest, opts: StoreOptions, workers: int,
                   overwrite: bool, tick: Tick | None) -> Restored:
    want = fingerprint(m, opts)
    before = m.total_bytes
    if not _check(src, out, m, overwrite, want):
        done = read_manifest(out, m.split)
        return Restored(split=m.split, manifest=str(manifest_path(out, m.split)),
                        samples=done.total_samples, stored=-1, bytes_before=before,
                        bytes_after=done.total_bytes, done=False)
    job = partial(_rewrite, src, out, opts, m.options.transform.max_pixels)
    results = list(in_shard_order(job, m.shards, workers, tick or (lambda n: None)))
    shards = [e for e, _ in results]
    index = index_shards(out, m.split, shards, dali=has_dali(m), workers=workers)
    options = replace(m.options, store=opts, fingerprint=want)
    if m.error_log is not None and (src / m.error_log).is_file():
        shutil.copyfile(src / m.error_log, out / m.error_log)  # the manifest names it
    fsync_dir(out)  # every shard's rename is on disk before the manifest names it
    written = write_manifest(out, replace(m, shards=shards, options=options, index=index))
    return Restored(split=m.split, manifest=str(written), samples=sum(e.samples for e in shards),
                    stored=sum(n for _, n in results), bytes_before=before,
                    bytes_after=sum(e.bytes for e in shards))
