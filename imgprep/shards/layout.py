"""Where a shard's members lie: per sample its member count, per member its data offset,
size and extension, and the samples' keys where they are known.

The shard writer builds a layout as it writes (``LayoutBuilder``); ``scan_layout`` reads one
from a shard's tar headers alone and ``sample_keys`` the keys a sample index leaves out, both
through ``imgprep.shards.tario`` (headers read by ``os.pread``, never the data). The sample
index (``imgprep.shards.index``) is made of layouts, and so is each DALI index
(``imgprep.shards.dali``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from imgprep.errors import ShardError
from imgprep.shards.tarfmt import padded
from imgprep.shards.tario import shard_members


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

    def extend(self, other: Layout, shift: int) -> None:
        """The samples of ``other`` (a layout with keys), their offsets moved by ``shift``:
        a piece of the shard written elsewhere and appended here."""
        if other.keys is None:
            raise ValueError("a layout without keys cannot be appended")
        ext = [self._exts.setdefault(e, len(self._exts)) for e in other.exts]
        if len(self._exts) > 255:
            raise ShardError(f"sample {other.keys[0]}: too many members for the index")
        self._counts += other.counts.tolist()
        self._keys += other.keys
        self._key = other.keys[-1] if other.keys else self._key
        self._offset += (other.offset + np.uint64(shift)).tolist()
        self._size += other.size.tolist()
        self._ext += [ext[e] for e in other.ext.tolist()]

    def layout(self) -> Layout:
        return Layout(tuple(self._exts), np.asarray(self._counts, np.uint8),
                      np.asarray(self._offset, np.uint64), np.asarray(self._size, np.uint32),
                      np.asarray(self._ext, np.uint8), tuple(self._keys))


def scan_layout(path: Path) -> Layout:
    """A shard's layout from its tar headers alone (pread of each header, never the data)."""
    b = LayoutBuilder()
    fd = _open_shard(path)
    try:
        for name, _, _, offset, size, _, _ in shard_members(
                path, functools.partial(os.pread, fd), os.fstat(fd).st_size):
            b.add(name, offset, size)
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
        read_at, end, pos = functools.partial(os.pread, fd), os.fstat(fd).st_size, 0
        for first, after in zip(firsts[:-1], firsts[1:], strict=True):
            found = list(shard_members(path, read_at, end, start=pos, stop=offset[first]))
            name, body = (found[-1][0], found[-1][3]) if found else ("", -1)
            key, _, got = name.rsplit("/", 1)[-1].partition(".")
            want = layout.exts[ext[first]]
            if body != offset[first] or got != want:
                raise ShardError(f"{path}: no .{want} member's data at byte {offset[first]}, "
                                 "where the sample index puts one; verify or restage it")
            keys.append(key)
            pos = offset[after - 1] + padded(size[after - 1])
    finally:
        os.close(fd)
    return tuple(keys)


def _open_shard(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as e:
        raise ShardError(f"cannot read shard {path}: {e.strerror}; restage it") from e
