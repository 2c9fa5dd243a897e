"""Listing one tar in place: every member's name, data offset and size, nothing extracted.

A tar is listed with ``imgprep.inputs.tarscan`` (a few microseconds a member) and, when that
leaves it to ``tarfile`` (links, long names, damage …), with ``tarfile`` itself, whose answer is
the reference. The class tars inside an outer train tar, or in a folder, are separate ``TarJob``s
that ``run_jobs`` lists on forked processes and returns in order, so the listing is the same
for any number of processes. Members that must not be read (links, devices, names escaping
the archive: ``imgprep.shards.tarfmt.refusal``) are refused and recorded as errors.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from imgprep.errors import SourceFormatError
from imgprep.inputs import tarscan
from imgprep.inputs.keys import member_key
from imgprep.inputs.keys import sanitize_key as sanitize_key  # re-exported
from imgprep.inputs.synsets import WNID_RE
from imgprep.job.cpus import rank_cores, read_limits
from imgprep.procs import die_with_parent
from imgprep.shards.tarfmt import FOLDER, REGULAR, refusal

IMAGE_EXTS = (".jpeg", ".jpg", ".png")
COLUMN_TYPES: dict[str, Any] = {"container": np.int32, "offset": np.int64, "size": np.int64,
                                "member": bytes, "key": bytes, "wnid": "S9"}
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class ListingError:
    """A member refused or unusable at listing time: recorded, counted, reported; ``key``:
    the image's key, where the member is an image (the errors log names it)."""

    source: str
    reason: str
    key: str = ""


@dataclass
class Columns:
    """Listed items, appended as lists and frozen into numpy chunks (cheap to ship between
    processes and to join)."""

    containers: list[str] = field(default_factory=list)
    container: list[int] = field(default_factory=list)
    offset: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    member: list[bytes] = field(default_factory=list)
    key: list[bytes] = field(default_factory=list)
    wnid: list[bytes] = field(default_factory=list)
    errors: list[ListingError] = field(default_factory=list)
    skipped: int = 0
    chunks: list[dict[str, np.ndarray]] = field(default_factory=list)
    _last_wnid: tuple[str, bytes] = ("", b"")

    def add(self, container: int, offset: int, size: int, member: str, wnid: str,
            stem: str | None = None) -> None:
        """One image; ``stem``: its file name when the caller has it split off already."""
        self.container.append(container)
        self.offset.append(offset)
        self.size.append(size)
        self.member.append(member.encode("utf-8"))
        self.key.append(member_key(stem if stem is not None else member).encode("utf-8"))
        if wnid != self._last_wnid[0]:
            self._last_wnid = (wnid, wnid.encode("ascii") if WNID_RE.match(wnid) else b"")
        self.wnid.append(self._last_wnid[1])

    def freeze(self) -> Columns:
        """Move the items added so far into a chunk of arrays."""
        if self.key:
            self.chunks.append({name: np.array(getattr(self, name), dtype=dtype)
                                for name, dtype in COLUMN_TYPES.items()})
            for name in COLUMN_TYPES:
                getattr(self, name).clear()
        return self

    def __len__(self) -> int:
        return len(self.key) + sum(len(c["key"]) for c in self.chunks)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every column as one array, in the order the items were found."""
        self.freeze()
        return {name: np.concatenate([c[name] for c in self.chunks]) if self.chunks
                else np.zeros(0, dtype="S1" if dtype is bytes else dtype)
                for name, dtype in COLUMN_TYPES.items()}

    def merge(self, other: Columns, at: int, shift: int) -> None:
        """Append ``other``'s items; its errors go in at ``at`` (+ ``shift`` already added)."""
        self.freeze()
        self.chunks += other.freeze().chunks
        self.errors[at + shift:at + shift] = other.errors
        self.skipped += other.skipped

    def container_id(self, path: str) -> int:
        self.containers.append(path)
        return len(self.containers) - 1


class _Window(io.RawIOBase):
    """A read-only view of ``[start, start+length)`` of an open file, for nested tars."""

    def __init__(self, f: io.BufferedReader, start: int, length: int) -> None:
        super().__init__()
        self._f, self._start, self._len, self._pos = f, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._len}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(b), self._len - self._pos)
        if n <= 0:
            return 0
        self._f.seek(self._start + self._pos)
        data = self._f.read(n)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


def is_image_name(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTS)


def refused(kind: bytes, name: str, archive: str) -> str | None:
    """What is recorded for member ``name`` (tar type ``kind``) of ``archive`` when it must
    not be read (``tarfmt.refusal``: links, devices, fifos, sparse files, names escaping the
    archive), or None."""
    why = refusal(kind, name)
    return None if why is None else f"{archive}: member {name!r} {why}; refused"


def _iter_members(tf: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """Iterate members without tarfile's ever-growing member list (bounded memory)."""
    while True:
        m = tf.next()
        if m is None:
            return
        tf.members.clear()  # type: ignore[attr-defined]
        yield m


def _open_tar(fileobj: io.RawIOBase | io.BufferedReader, label: str) -> tarfile.TarFile:
    head = fileobj.read(2)
    fileobj.seek(0)
    if head == GZIP_MAGIC:
        raise SourceFormatError(
            f"{label} is gzip-compressed; ILSVRC2012 tars are plain tars: "
            "decompress it first (gunzip) or pass the extracted folder"
        )
    try:
        return tarfile.open(fileobj=fileobj, mode="r:")
    except tarfile.TarError as e:
        raise SourceFormatError(f"{label} is not a readable tar ({e}); check the download") from e


def _only_zeros(fileobj: io.RawIOBase | io.BufferedReader, start: int, end: int) -> bool:
    fileobj.seek(start)
    remaining = end - start
    while remaining > 0:
        chunk = fileobj.read(min(remaining, 1 << 20))
        if not chunk:
            return False
        if chunk.strip(b"\0"):
            return False
        remaining -= len(chunk)
    return True


@dataclass(frozen=True)
class TarJob:
    """One tar to list: ``[base, base+length)`` of ``path`` (the whole file when None)."""

    path: str
    cid: int
    base: int
    length: int | None
    label: str
    prefix: str
    wnid: str
    at: int = 0  # where its errors go among the errors of the listing that found it


class _Tar:
    """Listing one tar into ``cols``; inner tars of an outer one become ``jobs``."""

    def __init__(self, cols: Columns, job: TarJob, depth: int,
                 jobs: list[TarJob] | None) -> None:
        self.cols, self.job, self.depth, self.jobs = cols, job, depth, jobs

    def member(self, name: str, offset_data: int, size: int) -> None:
        """One regular file member (``offset_data`` from the start of this tar)."""
        job, cols = self.job, self.cols
        folder, _, base = name.rpartition("/")
        where = f"{job.prefix}{name}"
        if base.lower().endswith(".tar") and self.depth == 0 and self.jobs is not None:
            self.jobs.append(TarJob(job.path, job.cid, job.base + offset_data, size,
                                     f"{job.label}/{name}", f"{where}/", base[:-4],
                                     len(cols.errors)))
        elif base.lower().endswith(IMAGE_EXTS):
            cols.add(job.cid, job.base + offset_data, size, where,
                     job.wnid or folder.rpartition("/")[2], base)
        else:
            cols.skipped += 1

    def fast(self, f: io.BufferedReader, limit: int) -> tuple[int, int]:
        """List with ``tarscan`` (which reads every header before anything is added);
        returns (where the closing zero blocks start, files listed)."""
        entries, end = tarscan.scan(f.fileno(), self.job.base, limit)
        count = 0
        member = self.member
        for name, offset_data, size, is_file in entries:
            if ".." in name or name[:1] == "/" or name[1:2] == ":":  # decided without a call
                why = refused(REGULAR if is_file else FOLDER, name, self.job.label)
                if why is not None:
                    self.cols.errors.append(ListingError(f"{self.job.prefix}{name}", why))
                    continue
            if is_file:
                member(name, offset_data, size)
                count += 1
        return end, count

    def slow(self, fileobj: io.RawIOBase | io.BufferedReader,
             limit: int) -> tuple[int | None, int]:
        """List with ``tarfile``; the end is None when an error is already recorded."""
        job, cols = self.job, self.cols
        tf = _open_tar(fileobj, job.label)
        count = 0
        try:
            for m in _iter_members(tf):
                why = refused(b"S" if m.issparse() else m.type, m.name, job.label)
                if why is not None:
                    cols.errors.append(ListingError(f"{job.prefix}{m.name}", why))
                    continue
                if not m.isfile():
                    continue
                if m.offset_data + m.size > limit:
                    cols.errors.append(ListingError(
                        f"{job.prefix}{m.name}",
                        f"{job.label} is truncated inside this member; re-download it"))
                    return None, count  # nothing can follow a member cut short
                self.member(m.name, m.offset_data, m.size)
                count += 1
        except tarfile.TarError as e:
            cols.errors.append(ListingError(job.prefix.rstrip("/"), (
                f"{job.label} is damaged after {count} members ({e}); re-download it")))
            return None, count
        return int(tf.offset), count


def list_tar(cols: Columns, f: io.BufferedReader, job: TarJob, depth: int,
              jobs: list[TarJob] | None = None) -> None:
    """List the images of the tar ``job`` names in the open file ``f``: with the fast header
    reader when it can, else with ``tarfile`` (hostile or unusual archives)."""
    fileobj: io.RawIOBase | io.BufferedReader = (
        f if job.length is None else _Window(f, job.base, job.length))
    limit = job.length if job.length is not None else os.fstat(f.fileno()).st_size
    head = fileobj.read(2)
    fileobj.seek(0)
    if head == GZIP_MAGIC:
        _open_tar(fileobj, job.label)  # refused with the gzip message
    lister = _Tar(cols, job, depth, jobs)
    end: int | None
    try:
        end, count = lister.fast(f, limit)
    except tarscan.Fallback:
        end, count = lister.slow(fileobj, limit)
    # tarfile ends quietly on a header cut short: whatever follows the last member must be the
    # zero blocks that close an archive, else the tar was truncated or damaged.
    if end is not None and not _only_zeros(fileobj, end, limit):
        cols.errors.append(ListingError(
            job.prefix.rstrip("/"),
            f"{job.label} is truncated or damaged after {count} members; re-download it",
        ))


def tar_job(job: TarJob) -> Columns:
    """List one tar (an inner class tar, or a tar of a folder) into fresh columns."""
    cols = Columns()
    try:
        with open(job.path, "rb") as f:
            list_tar(cols, f, job, 1)
    except OSError as e:
        cols.errors.append(ListingError(job.prefix.rstrip("/"), f"cannot read: {e.strerror}"))
    except SourceFormatError as e:
        cols.errors.append(ListingError(job.prefix.rstrip("/"), str(e)))
    return cols.freeze()


def run_jobs(jobs: list[TarJob], workers: int | None) -> list[Columns]:
    """List ``jobs`` in order, on forked processes when there are several (in this process
    when it is a daemon, which may not have children)."""
    n = min(len(jobs), workers or rank_cores(read_limits(), 1))
    if n <= 1 or mp.current_process().daemon:
        return [tar_job(j) for j in jobs]
    with mp.get_context("fork").Pool(n, die_with_parent, (os.getpid(),)) as pool:
        return pool.map(tar_job, jobs, chunksize=max(1, min(16, len(jobs) // (4 * n))))
