"""DALI index files, an adapter over the sample index: one per shard, so that
``nvidia.dali.fn.readers.webdataset`` opens a conversion without scanning every tar first.
Everything about them is here: their format, names, writing, checking and the paths DALI's
reader takes; the rest of imgprep asks this module.

DALI's reader takes one index file per tar (``index_paths=``, in the order of ``paths=``);
without them it warns ("Index file not provided, it may take some time to infer it") and
reads every tar header before the first batch. The format is the one DALI's ``wds2idx``
writes, version ``v1.2``: a first line ``v1.2 <samples>``, then one line per sample in tar
order, its members in tar order, each as ``<ext> <offset> <size> <name>`` (data offset and
size in bytes, the member's file name), all separated by single spaces::

    v1.2 2
    cls 512 3 n01_10.cls jpg 1536 14722 n01_10.jpg json 16896 153 n01_10.json
    cls 17920 3 n02_7.cls jpg 18944 16370 n02_7.jpg json 35840 166 n02_7.json

The file is named like the shard up to its first dot, plus ``.idx`` (``train-000000.idx``),
the name ``wds2idx`` picks by default. It is a function of a shard's layout in the sample
index (``imgprep.shards.layout``, ``imgprep.shards.index``: offsets, sizes, extensions) and the
samples' keys, which the shard writer and the tar headers know: ``convert`` writes it from the
layouts it kept (no tar is read again), ``imgprep index --dali`` from the tar headers (both
through ``imgprep.shards.indexing``), and stage-to-node makes it on the
node from the copied sample index and one header a sample of the copied shard (the file
server is not read for it, fan-out or not). The manifest's ``index`` says ``"dali": "v1.2"``
when the shards have theirs; verify then checks each against the sample index and the keys.

A shard with no sample gets ``v1.2 0``, which DALI refuses: ``reader_paths`` leaves such
shards out.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from imgprep.errors import ManifestError
from imgprep.fsutil import fsync_dir, write_bytes_atomic
from imgprep.shards.index import read_index
from imgprep.shards.layout import Layout, sample_keys
from imgprep.shards.manifest import Manifest, ShardEntry, read_manifest

VERSION = "v1.2"
IDX_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+-\d{6}\.idx$")  # a shard's DALI index


def idx_name(shard_name: str) -> str:
    """The DALI index file of a shard: its name up to the first dot, plus ``.idx``."""
    return shard_name.partition(".")[0] + ".idx"


def fix_hint(folder: Path) -> str:
    """The command that (re)builds a folder's DALI indexes."""
    return f"rebuild it with: imgprep index {folder} --dali"


def encode_idx(layout: Layout) -> bytes:
    """The DALI index of a shard with ``layout``, whose keys must be known."""
    if layout.keys is None:
        raise ValueError("a DALI index names every member: the layout needs its keys")
    exts, off, size = layout.exts, layout.offset.tolist(), layout.size.tolist()
    ext = [exts[e] for e in layout.ext.tolist()]
    lines = [f"{VERSION} {layout.samples}\n"]
    k = 0
    for key, n in zip(layout.keys, layout.counts.tolist(), strict=True):
        lines.append(" ".join(f"{ext[j]} {off[j]} {size[j]} {key}.{ext[j]}"
                              for j in range(k, k + n)) + "\n")
        k += n
    return "".join(lines).encode("utf-8", "surrogateescape")


def write_idx(folder: Path, shard_name: str, layout: Layout) -> Path:
    """Write the DALI index of shard ``shard_name`` of ``folder`` atomically (the caller
    fsyncs the folder before a manifest names it)."""
    path = folder / idx_name(shard_name)
    write_bytes_atomic(path, encode_idx(layout), sync_dir=False)
    return path


def drop_stale(folder: Path, split: str, keep: Sequence[str]) -> None:
    """Remove DALI indexes of ``split`` in ``folder`` whose shard is not in ``keep`` (shard
    names): nothing may look like part of the split but what its manifest names."""
    wanted = {idx_name(n) for n in keep}
    for p in folder.glob(f"{split}-*.idx"):
        if IDX_NAME_RE.match(p.name) and p.name not in wanted and p.is_file():
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def has_dali(m: Manifest) -> bool:
    """Whether the conversion ``m`` describes has a DALI index beside each shard."""
    return m.index is not None and m.index.dali is not None


def sync_shards(folder: Path, m: Manifest, shards: Sequence[ShardEntry], jobs: int = 1) -> int:
    """For stage-to-node: write the DALI index of each of ``shards`` (copied and checked into
    ``folder``, with the sample index of ``m``) from the sample index and one tar header a
    sample (its key), and remove the split's other DALI indexes; where ``m`` names no DALI
    indexes, only that. The file server is not read again. Returns how many were written."""
    keep = shards if has_dali(m) else ()
    if keep:
        index = read_index(folder, m)

        def one(s: ShardEntry) -> None:
            layout = index.layout_of(s.name)
            keys = sample_keys(folder / s.name, layout)
            write_bytes_atomic(folder / idx_name(s.name), encode_idx(replace(layout, keys=keys)),
                               sync_dir=False)

        with ThreadPoolExecutor(max(1, jobs)) as ex:
            list(ex.map(one, keep))
    drop_stale(folder, m.split, [s.name for s in keep])
    fsync_dir(folder)
    return len(keep)


def idx_problem(folder: Path, shard_name: str, tar: Layout,
                index: Layout | None = None) -> str | None:
    """Why the DALI index of shard ``shard_name`` in ``folder`` is not the one it must be,
    naming the file, the first line that differs and the fix: the layout the sample index
    gives (``index``) with the keys of the tar's (``tar``), or the tar's own where the sample
    index is unusable (None, or another sample count)."""
    layout = tar
    if index is not None and index.samples == tar.samples:
        layout = replace(index, keys=tar.keys)
    path = folder / idx_name(shard_name)
    try:
        got = path.read_bytes()
    except FileNotFoundError:
        return f"{path.name}: missing (the DALI index of {shard_name}); {fix_hint(folder)}"
    except OSError as e:
        return f"{path.name}: cannot be read ({e.strerror}); {fix_hint(folder)}"
    want = encode_idx(layout)
    if got == want:
        return None
    got_lines, want_lines = got.split(b"\n"), want.split(b"\n")
    n = next((i for i, (a, b) in enumerate(zip(got_lines, want_lines, strict=False))
              if a != b), min(len(got_lines), len(want_lines)))
    said = got_lines[n][:60].decode("utf-8", "replace") if n < len(got_lines) else "nothing"
    return (f"{path.name}: line {n + 1} does not match {shard_name} and the sample index "
            f"(it reads {said!r}); DALI's reader would go wrong; {fix_hint(folder)}")


def reader_paths(folder: Path, split: str) -> tuple[list[str], list[str]]:
    """``paths`` and ``index_paths`` for ``fn.readers.webdataset`` over the shards of
    ``split`` in ``folder`` (manifest order; shards without samples left out, as DALI refuses
    an empty index)."""
    m = read_manifest(folder, split)
    if not has_dali(m):
        raise ManifestError(f"{folder}/{split}.json names no DALI indexes; build them with: "
                            f"imgprep index {folder} --dali")
    shards = [s.name for s in m.shards if s.samples > 0]
    return ([str(folder / n) for n in shards], [str(folder / idx_name(n)) for n in shards])
