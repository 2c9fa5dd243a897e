"""Reading samples by offset: one ``os.pread`` per run of neighbouring samples of a shard.

A batch's samples are sorted by (shard, offset); samples whose byte spans lie within
``GAP`` of each other are read in one call (up to ``MAX_READ``), so sequential orders read
shards in large blocks and random orders cost one small read per sample. A batch's reads
are announced to the kernel (``POSIX_FADV_WILLNEED``, ``MAX_OPEN`` at a time) before the
first is waited for: on a set larger than the page cache the disk then serves them at its
queue depth instead of one sample's latency at a time. Each member's tar
header (the 512 bytes before its data) is checked against the index: its checksum, its
extension and its size, so a shard changed since it was indexed is named, never misread.

A stored-pixel record (``imgprep.rawformat``: ~100-200 KB, of which a crop reads only the
rows it covers) is not read into memory: it is announced the same way, and handed over as a
view of the shard's read-only mapping (``mmap``), so that only the pages the decoder touches
are brought in and nothing is copied; its tar header is checked as any other's.
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from imgprep.rawformat import IMAGE_EXTS
from imgprep.shards.tarfmt import BLOCK, HeaderError, checksum_ok, header_bytes, octal
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
        mapped = exts != 0  # stored pixels: the record is mapped, not read (module docstring)
        for j in np.flatnonzero(mapped).tolist():
            os.posix_fadvise(self._fd(int(shard[j])), int(jo[j]) - BLOCK, int(js[j]) + BLOCK,
                             os.POSIX_FADV_WILLNEED)
        runs = _runs(shard, np.where(mapped, co, np.minimum(jo, co)) - BLOCK,
                     np.where(mapped, co + cs, np.maximum(jo + js, co + cs)))
        out: list[Raw | None] = [None] * len(ids)
        for at in range(0, len(runs), MAX_OPEN):  # up to MAX_OPEN reads in flight at once
            chunk = runs[at:at + MAX_OPEN]
            for run, start, end in chunk:
                os.posix_fadvise(self._fd(int(shard[run[0]])), start, end - start,
                                 os.POSIX_FADV_WILLNEED)
            for run, start, end in chunk:
                buf = self._pread(int(shard[run[0]]), start, end - start)
                for j in run:
                    out[j] = self._sample(buf, start, int(shard[j]), int(jo[j]), int(js[j]),
                                          int(co[j]), int(cs[j]), IMAGE_EXTS[int(exts[j])])
        return out  # type: ignore[return-value]

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

    def _sample(self, buf: bytes, base: int, shard: int, jo: int, js: int, co: int,
                cs: int, ext: str = "jpg") -> Raw:
        name = self.loc.names[shard]
        data: bytes | memoryview
        if ext == "jpg":
            key = self._header(buf, base, jo - base, ext, js, name)
            data = buf[jo - base:jo - base + js]
        else:  # a view of the mapping: only the pages the decoder reads are touched
            mm = self._map(shard)
            key = self._header(mm, 0, jo, ext, js, name)
            data = memoryview(mm)[jo:jo + js]
        self._header(buf, base, co - base, "cls", cs, name)
        text = buf[co - base:co - base + cs]
        try:
            label = int(text)
        except ValueError:
            raise LoaderError(f"rank {self.rank}: {name}: sample {key} has label {text!r}; "
                              "verify or restage the shard") from None
        return name, key, data, label

    def _header(self, buf: bytes | mmap.mmap, base: int, at: int, ext: str, size: int,
                shard: str) -> str:
        """Check the tar header before member data at ``at`` in ``buf`` (read from byte
        ``base`` of the shard); the sample's key."""
        h = buf[at - BLOCK:at]
        raw = h[:100].split(b"\0", 1)[0]
        key = raw.decode("utf-8", "replace").rsplit("/", 1)[-1].partition(".")[0]
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

