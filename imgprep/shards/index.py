"""The sample index: where every sample's members lie in its shard, in one checksummed file.

Loaders read samples by offset (``os.pread``), so they plan at sample granularity from counts
and need no tar scan. ``convert`` writes the index (its shard writer knows the offsets);
``imgprep index DIR`` builds it for an existing conversion by reading tar headers only. The
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
import io
import json
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from imgprep.errors import ManifestError, ShardError, UnsafeArchiveError
from imgprep.fsutil import write_bytes_atomic
from imgprep.shards.manifest import (
    IndexEntry,
    Manifest,
    ShardEntry,
    find_manifests,
    index_name,
    read_manifest,
    write_manifest,
)
from imgprep.shards.tario import _REFUSED, _header_name, _octal

MAGIC = b"IMGPIDX\0"
VERSION = 1
BLOCK = 512
_HEAD = struct.Struct("<8sII")


def fix_hint(folder: Path) -> str:
    """The command that (re)builds a folder's index: every index error ends with it."""
    return f"rebuild it with: imgprep index {folder}"


@dataclass(frozen=True)
class Layout:
    """One shard's members: per sample its member count; per member data offset, size, and
    extension (an index into ``exts``); per sample its key where it is known (the shard
    writer and the tar headers know it, the sample index does not keep it)."""

    exts: tuple[str, ...]
    counts: np.ndarray  # u8[samples]
    offset: np.ndarray  # u64[members]
    size: np.ndarray  # u32[members]
    ext: np.ndarray  # u8[members]
    keys: tuple[str, ...] | None = None  # [samples]

    @property
    def samples(self) -> int:
        return len(self.counts)


class LayoutBuilder:
    """Collects a shard's layout member by member, in tar order (used by the shard writer)."""

    def __init__(self) -> None:
        self._exts: dict[str, int] = {}
        self._counts: list[int] = []
        self._offset: list[int] = []
        self._size: list[int] = []
        self._ext: list[int] = []
        self._keys: list[str] = []
        self._key: str | None = None

    def add(self, name: str, offset: int, size: int) -> None:
        """A regular member ``name`` whose data starts at ``offset``."""
        key, _, ext = name.rsplit("/", 1)[-1].partition(".")
        self.add_member(key, ext, offset, size)

    def add_member(self, key: str, ext: str, offset: int, size: int) -> None:
        """A member of sample ``key`` with extension ``ext`` (``add`` with the name split)."""
        counts = self._counts
        if key != self._key or not counts:
            counts.append(0)
            self._keys.append(key)
            self._key = key
        e = self._exts.get(ext)
        if e is None:
            if len(self._exts) == 255:
                raise ShardError(f"sample {key}: too many members for the index")
            e = self._exts[ext] = len(self._exts)
        if counts[-1] == 255:
            raise ShardError(f"sample {key}: too many members for the index")
        counts[-1] += 1
        self._offset.append(offset)
        self._size.append(size)
        self._ext.append(e)

    def layout(self) -> Layout:
        return Layout(tuple(self._exts), np.asarray(self._counts, np.uint8),
                      np.asarray(self._offset, np.uint64), np.asarray(self._size, np.uint32),
                      np.asarray(self._ext, np.uint8), tuple(self._keys))


def scan_layout(path: Path) -> Layout:
    """A shard's layout from its tar headers alone (pread of each header, never the data)."""
    b = LayoutBuilder()
    fd = _open_shard(path)
    try:
        end = os.fstat(fd).st_size
        for name, body, size in _walk(fd, path, 0, end, end):
            b.add(name, body, size)
    finally:
        os.close(fd)
    return b.layout()


def sample_keys(path: Path, layout: Layout) -> tuple[str, ...]:
    """The key of each sample of shard ``path`` whose ``layout`` (from the sample index) is
    known: the name in the header of its first member, read from the end of the sample
    before it to that member's data (one 512-byte block, more for a long or non-ASCII name).
    ShardError where the tar has no member there or one of another extension."""
    offset, size, ext = layout.offset.tolist(), layout.size.tolist(), layout.ext.tolist()
    firsts = np.concatenate([[0], np.cumsum(layout.counts, dtype=np.int64)]).tolist()
    keys: list[str] = []
    fd = _open_shard(path)
    try:
        end, pos = os.fstat(fd).st_size, 0
        for first, after in zip(firsts[:-1], firsts[1:], strict=True):
            found = list(_walk(fd, path, pos, offset[first], end))
            name, body = found[-1][:2] if found else ("", -1)
            key, _, got = name.rsplit("/", 1)[-1].partition(".")
            want = layout.exts[ext[first]]
            if body != offset[first] or got != want:
                raise ShardError(f"{path}: no .{want} member's data at byte {offset[first]}, "
                                 "where the sample index puts one; verify or restage it")
            keys.append(key)
            pos = offset[after - 1] + -(-size[after - 1] // BLOCK) * BLOCK
    finally:
        os.close(fd)
    return tuple(keys)


def _open_shard(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as e:
        raise ShardError(f"cannot read shard {path}: {e.strerror}; restage it") from e


def _walk(fd: int, path: Path, pos: int, stop: int, end: int) -> Iterator[tuple[str, int, int]]:
    """``(name, data offset, size)`` of each regular member whose header starts at ``pos``
    or later and before ``stop`` (tar headers only; ``end``: the file's size)."""
    long_name = None
    while pos + BLOCK <= stop:
        h = os.pread(fd, BLOCK, pos)
        if not h.strip(b"\0"):
            break
        where = f"{path} at byte {pos}"
        if sum(h[:148]) + 256 + sum(h[156:]) != _octal(h[148:156], where):
            raise ShardError(f"{where}: tar header checksum mismatch; verify or restage it")
        size, kind, body = _octal(h[124:136], where), h[156:157], pos + BLOCK
        if body + size > end:
            raise ShardError(f"{path}: truncated inside a member; verify or restage it")
        if kind in (b"x", b"L"):
            text = os.pread(fd, size, body)
            long_name = text.rstrip(b"\0").decode("utf-8", "replace") if kind == b"L" \
                else _pax_path(text, long_name)
        elif kind in (b"0", b"\0", b"7"):
            yield long_name if long_name is not None else _header_name(h), body, size
            long_name = None
        elif kind in _REFUSED:
            raise UnsafeArchiveError(f"{path}: member at byte {pos} is a {_REFUSED[kind]}; "
                                     "refused: this is no shard imgprep wrote")
        else:
            long_name = None
        pos = body + -(-size // BLOCK) * BLOCK


def _pax_path(data: bytes, default: str | None) -> str | None:
    for rec in data.decode("utf-8", "replace").split("\n"):
        key, _, value = rec.partition(" ")[2].partition("=")
        if key == "path":
            return value
    return default


# ---------------------------------------------------------------------------- layouts on disk


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


# ---------------------------------------------------------------------------- the index file


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


def index_shards(folder: Path, split: str, shards: Sequence[ShardEntry],
                 saved: Path | None = None, dali: bool = False) -> IndexEntry:
    """Index ``shards`` of ``folder``: from layouts saved under ``saved`` (by convert) where
    they match the shard, else by scanning the shard's tar headers. With ``dali``, each
    shard's DALI index is written beside it from the same layout (``imgprep.shards.dali``)."""
    from imgprep.shards.dali import VERSION, drop_stale, write_idx  # it builds on this module

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
    return replace(entry, dali=VERSION)


def layout_path(state: Path, shard_name: str) -> Path:
    return state / f"{shard_name}.layout.npz"


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



def index_folder(folder: Path, split: str | None = None,
                 dali: bool = False) -> list[dict[str, Any]]:
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
        done.append({"split": m.split, "index": entry.name, "bytes": entry.bytes,
                     "shards": len(m.shards), "samples": m.total_samples,
                     "dali": entry.dali})
    if not done:
        raise ManifestError(f"{folder} holds no shards to index (label lists need none)")
    return done
