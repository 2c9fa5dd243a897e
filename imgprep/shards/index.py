"""The sample index: where every sample's members lie in its shard, in one checksummed file.

Loaders read samples by offset (``os.pread``), so they plan at sample granularity from counts
and need no tar scan. ``convert`` writes the index (its shard writer knows the offsets);
``imgprep index DIR`` builds it for an existing conversion by reading tar headers only (both
through ``imgprep.shards.indexing``, from each shard's ``imgprep.shards.layout``). The
manifest names the file (``manifest.index_name(split)``) with its size and sha256, so a
damaged, truncated or foreign index is refused before anything is read through it.

File layout, little-endian::

    b"IMGPIDX\\0"  u32 version  u32 n  n bytes of JSON header  zero pad to 8
    member_offset u64[M]  member_size u32[M]  member_ext u8[M]  sample_members u8[N]

The JSON header holds the split, the extension table and every shard's ``[name, samples,
bytes, sha256]`` in manifest order; N is the sum of the shards' samples and M the member count.
Samples are numbered in shard order; a sample's members are contiguous in the member arrays
(its count in ``sample_members``); offsets are those of member data in the sample's shard.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from imgprep.errors import ManifestError, ShardError
from imgprep.fsutil import write_bytes_atomic
from imgprep.shards.layout import Layout
from imgprep.shards.manifest import IndexEntry, Manifest, ShardEntry, index_name

MAGIC = b"IMGPIDX\0"
VERSION = 1
_HEAD = struct.Struct("<8sII")


def fix_hint(folder: Path) -> str:
    """The command that (re)builds a folder's index: every index error ends with it."""
    return f"rebuild it with: imgprep index {folder}"


def encode_index(split: str, shards: Sequence[ShardEntry], layouts: Sequence[Layout]) -> bytes:
    """The index file's bytes for ``shards`` (manifest order) and their layouts."""
    exts: dict[str, int] = {}
    parts: list[tuple[np.ndarray, ...]] = []
    for s, lay in zip(shards, layouts, strict=True):
        if lay.samples != s.samples:
            raise ShardError(f"{s.name} holds {lay.samples} samples, the manifest says "
                             f"{s.samples}; verify or restage it")
        if len(lay.offset) and int((lay.offset + lay.size).max()) > s.bytes:
            raise ShardError(f"{s.name}: members end past its {s.bytes} bytes; restage it")
        remap = np.asarray([exts.setdefault(e, len(exts)) for e in lay.exts] or [0], np.uint8)
        parts.append((lay.offset, lay.size, remap[lay.ext], lay.counts))
    header = json.dumps({"version": VERSION, "split": split, "exts": list(exts),
                         "shards": [[s.name, s.samples, s.bytes, s.sha256] for s in shards]},
                        sort_keys=True).encode()
    header += b" " * (-(len(header) + _HEAD.size) % 8)
    arrays = [np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, t)
              for k, t in enumerate((np.uint64, np.uint32, np.uint8, np.uint8))]
    dtypes = ("<u8", "<u4", "u1", "u1")
    return (_HEAD.pack(MAGIC, VERSION, len(header)) + header
            + b"".join(a.astype(d).tobytes() for a, d in zip(arrays, dtypes, strict=True)))


def write_index(folder: Path, split: str, shards: Sequence[ShardEntry],
                layouts: Iterable[Layout]) -> IndexEntry:
    """Write ``<split>-index.bin`` atomically; returns the manifest's entry for it."""
    data = encode_index(split, shards, list(layouts))
    name = index_name(split)
    write_bytes_atomic(folder / name, data)
    return IndexEntry(name, len(data), hashlib.sha256(data).hexdigest())


@dataclass(frozen=True)
class SampleIndex:
    """A validated index: shard table and member arrays (see the module docstring)."""

    path: Path
    names: tuple[str, ...]
    shard_samples: np.ndarray  # i8[shards]
    shard_bytes: np.ndarray  # i8[shards]
    exts: tuple[str, ...]
    member_first: np.ndarray  # i8[samples + 1]
    offset: np.ndarray  # u64[members]
    size: np.ndarray  # u32[members]
    ext: np.ndarray  # u8[members]

    @property
    def first_sample(self) -> np.ndarray:
        """Index of each shard's first sample (and the total at the end)."""
        return np.concatenate([[0], np.cumsum(self.shard_samples)])

    def members(self, ext: str) -> tuple[np.ndarray, np.ndarray]:
        """Per sample, the data offset and size of its ``ext`` member (-1 where it has none)."""
        off = np.full(len(self.member_first) - 1, -1, np.int64)
        size = np.full(len(off), -1, np.int64)
        if ext in self.exts:
            hit = np.flatnonzero(self.ext == self.exts.index(ext))
            owner = np.searchsorted(self.member_first, hit, side="right") - 1
            off[owner], size[owner] = self.offset[hit], self.size[hit]
        return off, size

    def layout_of(self, name: str) -> Layout:
        """Shard ``name``'s layout as this index gives it, to compare with its tar headers."""
        k = self.names.index(name)
        a, b = (int(x) for x in self.first_sample[k:k + 2])
        lo, hi = int(self.member_first[a]), int(self.member_first[b])
        counts = np.diff(self.member_first[a:b + 1]).astype(np.uint8)
        return Layout(self.exts, counts, self.offset[lo:hi], self.size[lo:hi], self.ext[lo:hi])


def _decode(data: bytes, path: Path, folder: Path
            ) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    bad = f"index {path} is damaged ({{}}); {fix_hint(folder)}"
    if len(data) < _HEAD.size:
        raise ManifestError(bad.format("too short"))
    magic, version, n = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise ManifestError(bad.format("not an imgprep index"))
    if version != VERSION:
        raise ManifestError(f"index {path} has version {version}, this imgprep reads "
                            f"{VERSION}; {fix_hint(folder)}")
    try:
        head = json.loads(data[_HEAD.size:_HEAD.size + n])
        total = sum(int(s[1]) for s in head["shards"])
    except (ValueError, KeyError, TypeError, IndexError):
        raise ManifestError(bad.format("unreadable header")) from None
    pos = _HEAD.size + n
    counts_end = len(data)
    members = (counts_end - pos - total) // 13
    if members < 0 or pos + members * 13 + total != counts_end:
        raise ManifestError(bad.format(f"{len(data)} bytes do not fit {total} samples"))
    offset = np.frombuffer(data, "<u8", members, pos)
    size = np.frombuffer(data, "<u4", members, pos + 8 * members)
    ext = np.frombuffer(data, "u1", members, pos + 12 * members)
    counts = np.frombuffer(data, "u1", total, pos + 13 * members)
    return head, offset, size, ext, counts


def read_index(folder: Path, m: Manifest) -> SampleIndex:
    """The index of ``m`` (a manifest of ``folder``), checked against the manifest and the
    shard sizes; ManifestError naming the file and ``imgprep index`` otherwise."""
    if m.index is None:
        raise ManifestError(f"{folder}/{m.split}.json lists no sample index "
                            f"({index_name(m.split)}); build it with: imgprep index {folder}")
    path = folder / m.index.name
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ManifestError(f"cannot read index {path} ({e.strerror}); stage it with the "
                            f"shards, or {fix_hint(folder)}") from e
    if len(data) != m.index.bytes or hashlib.sha256(data).hexdigest() != m.index.sha256:
        what = "truncated" if len(data) < m.index.bytes else "altered"
        try:
            table = {str(s[0]): list(s) for s in _decode(data, path, folder)[0]["shards"]}
            if any(table.get(s.name) != [s.name, s.samples, s.bytes, s.sha256]
                   for s in m.shards):
                what = "from another conversion (its shards differ from the manifest's)"
        except ManifestError:
            pass
        raise ManifestError(f"index {path} is {what}: it does not match {m.split}.json; "
                            f"{fix_hint(folder)}")
    head, offset, size, ext, counts = _decode(data, path, folder)
    return _check(path, folder, m, head, offset, size, ext, counts)


def _check(path: Path, folder: Path, m: Manifest, head: dict[str, Any], offset: np.ndarray,
           size: np.ndarray, ext: np.ndarray, counts: np.ndarray) -> SampleIndex:
    names = tuple(str(s[0]) for s in head["shards"])
    samples = np.asarray([int(s[1]) for s in head["shards"]], np.int64)
    nbytes = np.asarray([int(s[2]) for s in head["shards"]], np.int64)
    table = dict(zip(names, zip(samples.tolist(), nbytes.tolist(), strict=True), strict=True))
    for s in m.shards:
        if table.get(s.name) != (s.samples, s.bytes):
            raise ManifestError(f"index {path} is from another conversion: shard {s.name} "
                                f"is {table.get(s.name)} (samples, bytes) there and "
                                f"({s.samples}, {s.bytes}) in {m.split}.json; "
                                f"{fix_hint(folder)}")
    member_first = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    if member_first[-1] != len(offset) or (len(ext) and int(ext.max()) >= len(head["exts"])):
        raise ManifestError(f"index {path} is damaged (member table); {fix_hint(folder)}")
    shard_of = np.repeat(np.arange(len(names)), samples)
    owner = np.repeat(shard_of, counts)
    past = np.flatnonzero(offset + size.astype(np.uint64) > nbytes[owner].astype(np.uint64))
    if len(past):
        bad = names[int(owner[past[0]])]
        raise ManifestError(f"index {path} points past the end of shard {bad} "
                            f"({len(past)} members); {fix_hint(folder)}")
    return SampleIndex(path, names, samples, nbytes, tuple(head["exts"]), member_first,
                       offset, size, ext)
