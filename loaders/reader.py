"""Reading samples by offset: one ``os.pread`` per run of neighbouring samples of a shard.

A batch's samples are sorted by (shard, offset); samples whose byte spans lie within
``GAP`` of each other are read in one call (up to ``MAX_READ``), so sequential orders read
shards in large blocks and random orders cost one small read per sample. A batch's reads
are announced to the kernel (``POSIX_FADV_WILLNEED``, ``MAX_OPEN`` at a time) before the
first is waited for: on a set larger than the page cache the disk then serves them at its
queue depth instead of one sample's latency at a time. Each member's tar
header (the 512 bytes before its data) is checked against the index: its checksum, its
extension and its size, so a shard changed since it was indexed is named, never misread. A
batch's headers are checked at once where they are byte for byte what imgprep writes
(``tarfmt.headers_written``), any other one alone.

A stored-pixel record (``imgprep.rawformat``: ~100-200 KB, of which a crop reads only the
rows it covers) is not read into memory: it is announced the same way, and handed over as a
view of the shard's read-only mapping (``mmap``), so that only the pages the decoder touches
are brought in and nothing is copied; its label and both tar headers are read from the
mapping too, and checked as any other's.
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from imgprep.rawformat import IMAGE_EXTS
from imgprep.shards.tarfmt import (
    BLOCK,
    HeaderError,
    checksum_ok,
    header_bytes,
    headers_written,
    octal,
)
from loaders.errors import LoaderError

GAP = 64 << 10  # read across a gap this small rather than make another call
MAX_READ = 8 << 20
MAX_OPEN = 64  # shard files a reader keeps open

Raw = tuple[str, str, bytes | memoryview, int]  # shard, key, image (a record: a view), label


@dataclass(frozen=True, eq=False)
class Locations:
    """Per sample id of the whole set: its shard, and its image and cls members (-1:
    absent); the image is the ``.jpg``, or where ``image_ext`` says, the member of that
    extension (stored pixels: ``imgprep.rawformat.IMAGE_EXTS``)."""

    folder: Path
    names: tuple[str, ...]
    shard_bytes: np.ndarray  # i8[shards]
    first: np.ndarray  # i8[shards + 1]
    jpg: tuple[np.ndarray, np.ndarray]  # the image member's data offset, size
    cls: tuple[np.ndarray, np.ndarray]
    image_ext: np.ndarray | None = None  # u1[samples]: index into IMAGE_EXTS; None: all jpg

    def shard_of(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.first, ids, side="right") - 1


_SUFFIX = tuple(f".{e}".encode() for e in IMAGE_EXTS)  # the image member's, by index
_SUFFIX_CLS = b".cls"


def _key(name: bytes) -> str:
    """The sample key of a member named ``name`` (its last path part, up to its first dot)."""
    return name.decode("utf-8", "replace").rsplit("/", 1)[-1].partition(".")[0]


class _Got:
    """A batch's members as they are read: per sample its image (bytes, or a view of the
    mapping) and its cls text; its two tar headers (every image header, then every cls
    header), where each lies in its shard, and the size its member must have."""

    def __init__(self, shard: list[int], jo: list[int], js: list[int], co: list[int],
                 cs: list[int]) -> None:
        n = len(shard)
        self.shard, self.jo, self.js, self.co, self.cs = shard, jo, js, co, cs
        self.images: list[bytes | memoryview] = [b""] * n
        self.texts: list[bytes] = [b""] * n
        self.heads: list[bytes] = [b""] * (2 * n)
        self.at = [o - BLOCK for o in jo] + [o - BLOCK for o in co]
        self.sizes = js + cs

    def take(self, j: int, buf: bytes | mmap.mmap, base: int, image: bytes | memoryview
             ) -> None:
        """Sample ``j``'s members from ``buf``, which holds the shard from its byte ``base``
        (``image``: ``buf`` itself, or a view of it)."""
        a, c, n = self.jo[j] - base, self.co[j] - base, len(self.texts)
        self.heads[j], self.heads[n + j] = buf[a - BLOCK:a], buf[c - BLOCK:c]
        self.images[j] = image[a:a + self.js[j]]
        self.texts[j] = buf[c:c + self.cs[j]]


@dataclass
class Reader:
    """One process's reader (file descriptors are opened lazily, after fork)."""

    loc: Locations
    rank: int
    _fds: OrderedDict[int, int] = field(default_factory=OrderedDict)
    _maps: OrderedDict[int, mmap.mmap] = field(default_factory=OrderedDict)

    def close(self) -> None:
        self._maps.clear()  # dropped, not closed: a view handed out keeps its mapping alive
        while self._fds:
            os.close(self._fds.popitem()[1])

    def _map(self, shard: int) -> mmap.mmap:
        """Shard ``shard`` mapped read-only (its stored-pixel records are views of it)."""
        mm = self._maps.get(shard)
        if mm is not None:
            self._maps.move_to_end(shard)
            return mm
        mm = mmap.mmap(self._fd(shard), 0, access=mmap.ACCESS_READ)
        if len(self._maps) >= MAX_OPEN:
            self._maps.popitem(last=False)  # dropped, not closed (see close)
        self._maps[shard] = mm
        return mm

    def _fd(self, shard: int) -> int:
        fd = self._fds.get(shard)
        if fd is not None:
            self._fds.move_to_end(shard)
            return fd
        path = self.loc.folder / self.loc.names[shard]
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise LoaderError(f"rank {self.rank}: cannot open shard {path} ({e.strerror}); "
                              "stage it (imgprep stage-to-node) or verify the folder") from e
        size, want = os.fstat(fd).st_size, int(self.loc.shard_bytes[shard])
        if size != want:
            os.close(fd)
            raise LoaderError(f"rank {self.rank}: {path} is {size} bytes, the manifest and "
                              f"index say {want}: the shard changed; verify or restage it")
        if len(self._fds) >= MAX_OPEN:
            os.close(self._fds.popitem(last=False)[1])
        self._fds[shard] = fd
        return fd

    def read(self, ids: np.ndarray) -> list[Raw]:
        """The samples ``ids`` (global sample ids), in that order."""
        loc = self.loc
        shard = loc.shard_of(ids)
        (jo, js), (co, cs) = (loc.jpg[0][ids], loc.jpg[1][ids]), (loc.cls[0][ids], loc.cls[1][ids])
        if (jo < 0).any() or (co < 0).any():
            k = int(np.flatnonzero((jo < 0) | (co < 0))[0])
            raise LoaderError(f"rank {self.rank}: {loc.names[shard[k]]}: sample "
                              f"{int(ids[k] - loc.first[shard[k]])} has no image or no cls "
                              "member; verify or restage the shard")
        exts = np.zeros(len(ids), np.uint8) if loc.image_ext is None else loc.image_ext[ids]
        mapped = exts != 0
        got = _Got(shard.tolist(), jo.tolist(), js.tolist(), co.tolist(), cs.tolist())
        lo, hi = np.minimum(jo, co) - BLOCK, np.maximum(jo + js, co + cs)
        for j in np.flatnonzero(mapped).tolist():  # stored pixels: mapped (module docstring)
            start = int(lo[j])
            os.posix_fadvise(self._fd(got.shard[j]), start, int(hi[j]) - start,
                             os.POSIX_FADV_WILLNEED)
        for j in np.flatnonzero(mapped).tolist():
            mm = self._map(got.shard[j])
            got.take(j, mm, 0, memoryview(mm))
        plain = np.flatnonzero(~mapped)
        runs, at_plain = _runs(shard[plain], lo[plain], hi[plain]), plain.tolist()
        for at in range(0, len(runs), MAX_OPEN):  # up to MAX_OPEN reads in flight at once
            chunk = runs[at:at + MAX_OPEN]
            for run, start, end in chunk:
                os.posix_fadvise(self._fd(got.shard[at_plain[run[0]]]), start, end - start,
                                 os.POSIX_FADV_WILLNEED)
            for run, start, end in chunk:
                buf = self._pread(got.shard[at_plain[run[0]]], start, end - start)
                for r in run:
                    got.take(at_plain[r], buf, start, buf)
        keys = self._keys(got, exts)
        return [(loc.names[s], key, image, self._label(text, loc.names[s], key))
                for s, key, image, text in zip(got.shard, keys, got.images, got.texts,
                                               strict=True)]

    def _keys(self, got: _Got, exts: np.ndarray) -> list[str]:
        """Every sample's key, once its two tar headers (image, then cls) are checked: all of
        them at once where they are byte for byte what imgprep writes (``headers_written``),
        the others one by one (``_header``, which names a header that is not its member's)."""
        n = len(got.texts)
        blocks = np.frombuffer(b"".join(got.heads), np.uint8).reshape(2 * n, BLOCK)
        suffixes = [_SUFFIX[e] for e in exts.tolist()] + [_SUFFIX_CLS] * n
        ok, length = headers_written(blocks, np.asarray(got.sizes, np.int64), suffixes)
        names = blocks[:n, :100].tobytes()
        keys = [_key(names[100 * j:100 * j + x]) for j, x in enumerate(length[:n].tolist())]
        for row in np.flatnonzero(~ok).tolist():
            j = row % n
            ext = IMAGE_EXTS[int(exts[j])] if row < n else "cls"
            key = self._header(got.heads[row], got.at[row], BLOCK, ext, got.sizes[row],
                               self.loc.names[got.shard[j]])
            if row < n:
                keys[j] = key
        return keys

    def _label(self, text: bytes, shard: str, key: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise LoaderError(f"rank {self.rank}: {shard}: sample {key} has label {text!r}; "
                              "verify or restage the shard") from None

    def _pread(self, shard: int, offset: int, size: int) -> bytes:
        fd = self._fd(shard)
        try:
            data = os.pread(fd, size, offset)
        except OSError as e:
            raise LoaderError(f"rank {self.rank}: cannot read {self.loc.names[shard]} "
                              f"({e.strerror}); verify or restage it") from e
        if len(data) != size:
            raise LoaderError(f"rank {self.rank}: {self.loc.names[shard]} ends before byte "
                              f"{offset + size} the index names; verify or restage it")
        return data

    def _header(self, buf: bytes | mmap.mmap, base: int, at: int, ext: str, size: int,
                shard: str) -> str:
        """Check the tar header before member data at ``at`` in ``buf`` (read from byte
        ``base`` of the shard); the sample's key."""
        h = buf[at - BLOCK:at]
        raw = h[:100].split(b"\0", 1)[0]
        key = _key(raw)
        named = len(raw) >= 100 or raw.endswith(b"." + ext.encode())  # 100: a pax name
        if named and raw.isascii() and h == header_bytes(raw.decode("ascii"), size):
            return key  # byte for byte the header imgprep writes for this name and size
        try:
            ok = named and checksum_ok(h) and octal(h[124:136]) == size
        except HeaderError:
            ok = False
        if not ok:
            raise LoaderError(
                f"rank {self.rank}: {shard}: the tar header at byte {base + at - BLOCK} is not the "
                f"{ext} member of {size} bytes the sample index names: the shard changed "
                f"since it was indexed; verify or restage it, or rebuild the index "
                f"(imgprep index {self.loc.folder})")
        return key


def _runs(shard: np.ndarray, lo: np.ndarray, hi: np.ndarray
          ) -> list[tuple[list[int], int, int]]:
    """The reads for samples spanning ``lo[k]:hi[k]`` of shard ``shard[k]``: (the samples,
    start, end) per read, neighbours within ``GAP`` of each other joined up to ``MAX_READ``."""
    order = np.lexsort((lo, shard)).tolist()
    runs, i = [], 0
    while i < len(order):
        k = order[i]
        start, end, run = int(lo[k]), int(hi[k]), [k]
        i += 1
        while i < len(order):  # by index: no copy of the rest of the order per read
            j = order[i]
            if shard[j] != shard[k] or lo[j] - end > GAP or hi[j] - start > MAX_READ:
                break
            end = max(end, int(hi[j]))
            run.append(j)
            i += 1
        runs.append((run, start, end))
    return runs

