"""List the images of an ILSVRC2012 source without extracting anything.

Understood layouts, detected from what the path holds:
- ``ILSVRC2012_img_train.tar``: an outer tar of per-class ``<wnid>.tar`` (read in place; inner
  tars are opened as windows of the outer file, never copied out);
- a folder of per-class tars; an extracted tree ``<root>/<wnid>/*.JPEG``;
- ``ILSVRC2012_img_val.tar`` or a flat folder of ``ILSVRC2012_val_*.JPEG`` (any flat tar/folder).

The listing is columnar (numpy arrays), so a 1.28 M-image listing costs ~100 MB, not GBs of
Python objects, and it is sorted by key, so it is the same whatever order the disk returns.
Members that must not be read (links, devices, names escaping the archive) are refused and
recorded as errors; nothing is ever extracted by member name.
"""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from imgprep.errors import InputMissingError, SourceFormatError, UnsafeArchiveError
from imgprep.synsets import WNID_RE

IMAGE_EXTS = (".jpeg", ".jpg", ".png")
GZIP_MAGIC = b"\x1f\x8b"
VAL_PREFIX = "ILSVRC2012_val_"  # validation image names: never in a train split by accident
# Folder (or tar) names that say which split their images are, compared case-insensitively.
SPLIT_NAMES = {
    "train": ("train", "training", "ilsvrc2012_img_train"),
    "val": ("val", "valid", "validation", "ilsvrc2012_img_val"),
}


def split_of_name(name: str) -> str | None:
    """``train`` or ``val`` when a folder or tar name says so (any case), else None."""
    stem = name[:-4] if name.lower().endswith(".tar") else name
    for split, names in SPLIT_NAMES.items():
        if stem.casefold() in names:
            return split
    return None


def split_folders(root: Path) -> tuple[dict[str, Path], list[Path]]:
    """For a folder holding split folders (``train/``, ``val/``, ``validation/``,
    ``ILSVRC2012_img_val.tar`` …): ({split: its folder or tar}, the other entries, which are
    not converted). Empty when ``root`` is not such a folder. Two entries naming one split
    are refused, since which to convert is anyone's guess."""
    found: dict[str, Path] = {}
    others: list[Path] = []
    if not root.is_dir():
        return found, others
    for p in sorted(root.iterdir()):
        split = split_of_name(p.name) if (p.is_dir() or p.name.lower().endswith(".tar")) \
            else None
        if split is None:
            if not p.name.startswith("."):
                others.append(p)
        elif split in found:
            raise SourceFormatError(
                f"{root} holds both {found[split].name} and {p.name} for the {split} split; "
                f"convert the one you mean on its own (imgprep convert {p} …)")
        else:
            found[split] = p
    classes = [p.name for p in others if p.is_dir() and WNID_RE.match(p.name)]
    if found and classes:
        more = " …" if len(classes) > 3 else ""
        raise SourceFormatError(
            f"{root} holds class folders ({', '.join(classes[:3])}{more}) beside the split "
            f"folder(s) {', '.join(p.name for p in found.values())}: splits must not be "
            f"merged; move the class folders into {root}/train, or convert each folder on its "
            "own")
    return found, (others if found else [])


@dataclass(frozen=True)
class ListingError:
    """A member refused or unusable at listing time: recorded, counted, reported."""

    source: str
    reason: str


@dataclass(frozen=True)
class Listing:
    """Every image found under ``root``, sorted by key.

    Item i is read from ``containers[container[i]]``: at byte ``offset[i]`` for ``size[i]`` bytes
    when the container is a tar, or as the file ``member[i]`` below it when ``offset[i] < 0``.
    ``member`` is the item's path relative to the source root (for messages and metadata);
    ``wnid`` is the class its folder or inner tar names, or empty.
    """

    root: str
    kind: str
    containers: tuple[str, ...]
    container: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    member: np.ndarray
    key: np.ndarray
    wnid: np.ndarray
    errors: tuple[ListingError, ...] = ()
    skipped: int = 0

    def __len__(self) -> int:
        return len(self.key)

    def key_str(self, i: int) -> str:
        return bytes(self.key[i]).decode("utf-8")

    def member_str(self, i: int) -> str:
        return bytes(self.member[i]).decode("utf-8")

    def wnid_str(self, i: int) -> str:
        return bytes(self.wnid[i]).decode("ascii")


@dataclass
class _Columns:
    containers: list[str] = field(default_factory=list)
    container: list[int] = field(default_factory=list)
    offset: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    member: list[bytes] = field(default_factory=list)
    wnid: list[bytes] = field(default_factory=list)
    errors: list[ListingError] = field(default_factory=list)
    skipped: int = 0

    def add(self, container: int, offset: int, size: int, member: str, wnid: str) -> None:
        self.container.append(container)
        self.offset.append(offset)
        self.size.append(size)
        self.member.append(member.encode("utf-8"))
        self.wnid.append(wnid.encode("ascii") if WNID_RE.match(wnid) else b"")

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


def check_member(m: tarfile.TarInfo, archive: str) -> None:
    """Refuse members that a careless extractor would turn into an attack."""
    where = f"{archive}: member {m.name!r}"
    name = m.name
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchiveError(f"{where} has an absolute name; refused")
    if ".." in posixpath.normpath(name).split("/"):
        raise UnsafeArchiveError(f"{where} escapes the archive with '..'; refused")
    if m.issym() or m.islnk():
        raise UnsafeArchiveError(f"{where} is a link (to {m.linkname!r}); refused")
    if m.ischr() or m.isblk() or m.isfifo():
        raise UnsafeArchiveError(f"{where} is a device or fifo; refused")


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


def _list_tar(
    cols: _Columns, f: io.BufferedReader, cid: int, base: int, length: int | None,
    label: str, prefix: str, wnid: str, depth: int,
) -> None:
    """List the images of the tar at ``[base, base+length)`` of ``f``; recurse into inner tars."""
    fileobj: io.RawIOBase | io.BufferedReader = (
        f if length is None else _Window(f, base, length)
    )
    tf = _open_tar(fileobj, label)
    limit = length if length is not None else os.fstat(f.fileno()).st_size
    count = 0
    try:
        for m in _iter_members(tf):
            where = f"{prefix}{m.name}"
            try:
                check_member(m, label)
            except UnsafeArchiveError as e:
                cols.errors.append(ListingError(where, str(e)))
                continue
            if not m.isfile():
                continue
            if m.offset_data + m.size > limit:
                cols.errors.append(ListingError(
                    where, f"{label} is truncated inside this member; re-download it"))
                return  # nothing can follow a member cut short
            name = posixpath.basename(m.name)
            if name.lower().endswith(".tar") and depth == 0:
                try:
                    _list_tar(cols, f, cid, base + m.offset_data, m.size, f"{label}/{m.name}",
                              f"{where}/", name[:-4], depth + 1)
                except SourceFormatError as e:
                    cols.errors.append(ListingError(where, str(e)))
            elif is_image_name(name):
                parent = posixpath.basename(posixpath.dirname(m.name))
                cols.add(cid, base + m.offset_data, m.size, where, wnid or parent)
            else:
                cols.skipped += 1
            count += 1
    except tarfile.TarError as e:
        cols.errors.append(ListingError(
            prefix.rstrip("/"), f"{label} is damaged after {count} members ({e}); re-download it"
        ))
        return
    # tarfile ends quietly on a header cut short: whatever follows the last member must be the
    # zero blocks that close an archive, else the tar was truncated or damaged.
    if not _only_zeros(fileobj, tf.offset, limit):
        cols.errors.append(ListingError(
            prefix.rstrip("/"),
            f"{label} is truncated or damaged after {count} members; re-download it",
        ))


def _list_dir(cols: _Columns, root: Path) -> None:
    cid = cols.container_id(str(root))
    for dirpath, dirnames, filenames in os.walk(root, onerror=None):
        dirnames.sort()
        for fname in sorted(filenames):
            full = Path(dirpath) / fname
            rel = full.relative_to(root).as_posix()
            if fname.lower().endswith(".tar"):
                tcid = cols.container_id(str(full))
                try:
                    with open(full, "rb") as f:
                        _list_tar(cols, f, tcid, 0, None, rel, f"{rel}/", fname[:-4], 1)
                except OSError as e:
                    cols.errors.append(ListingError(rel, f"cannot read: {e.strerror}"))
                except SourceFormatError as e:
                    cols.errors.append(ListingError(rel, str(e)))
            elif is_image_name(fname):
                try:
                    size = full.stat().st_size
                except OSError as e:
                    cols.errors.append(ListingError(rel, f"cannot stat: {e.strerror}"))
                    continue
                cols.add(cid, -1, size, rel, Path(dirpath).name)
            else:
                cols.skipped += 1


def sanitize_key(stem: str) -> str:
    """A webdataset- and label-list-safe key: no dots (webdataset splits on them), no spaces."""
    return "".join("_" if (c == "." or c.isspace() or c == "/") else c for c in stem)


def list_source(path: Path) -> Listing:
    """List every image under ``path`` (a tar or a folder), sorted by key."""
    if not path.exists():
        raise InputMissingError(
            f"input {path} does not exist; point --input at ILSVRC2012_img_train.tar, "
            "ILSVRC2012_img_val.tar or an extracted folder"
        )
    cols = _Columns()
    if path.is_dir():
        _list_dir(cols, path)
        has_tars = any(c.lower().endswith(".tar") for c in cols.containers[1:])
        kind = "class-tars" if has_tars else "folder"
    else:
        try:
            f = open(path, "rb")
        except OSError as e:
            raise InputMissingError(f"cannot read input {path}: {e.strerror}") from e
        with f:
            cid = cols.container_id(str(path))
            _list_tar(cols, f, cid, 0, None, str(path), "", "", 0)
        kind = "tar"
    if not cols.member and not cols.errors:
        raise SourceFormatError(
            f"no images (.JPEG/.jpg/.png) found in {path}; point --input at ImageNet data"
        )
    return _build(path, kind, cols)


def _build(path: Path, kind: str, cols: _Columns) -> Listing:
    member = np.array(cols.member, dtype=bytes) if cols.member else np.zeros(0, dtype="S1")
    keys = [
        sanitize_key(posixpath.splitext(posixpath.basename(m.decode("utf-8")))[0]).encode("utf-8")
        for m in cols.member
    ]
    key = np.array(keys, dtype=bytes) if keys else np.zeros(0, dtype="S1")
    order = np.lexsort((member, key)) if len(key) else np.zeros(0, dtype=np.int64)
    errors = list(cols.errors)
    # Duplicate keys would collide in shards and lists: keep the first, refuse the rest.
    if len(order):
        sk = key[order]
        dup = np.zeros(len(order), dtype=bool)
        dup[1:] = sk[1:] == sk[:-1]
        for j in np.flatnonzero(dup):
            errors.append(ListingError(
                member[order[j]].decode("utf-8"),
                f"duplicate key {sk[j].decode('utf-8')!r} (already used by "
                f"{member[order[j - 1]].decode('utf-8')}); refused",
            ))
        order = order[~dup]
    return Listing(
        root=str(path),
        kind=kind,
        containers=tuple(cols.containers),
        container=np.asarray(cols.container, dtype=np.int32)[order],
        offset=np.asarray(cols.offset, dtype=np.int64)[order],
        size=np.asarray(cols.size, dtype=np.int64)[order],
        member=member[order],
        key=key[order],
        wnid=(np.array(cols.wnid, dtype="S9") if cols.wnid else np.zeros(0, dtype="S9"))[order],
        errors=tuple(errors),
        skipped=cols.skipped,
    )


class SourceReader:
    """Reads item bytes with ``pread`` from a handful of cached file descriptors."""

    def __init__(self, containers: tuple[str, ...]) -> None:
        self._containers = containers
        self._fds: dict[int, int] = {}

    def read(self, container: int, offset: int, size: int, member: str) -> bytes:
        root = self._containers[container]
        if offset < 0:
            with open(os.path.join(root, member), "rb") as f:
                return f.read()
        fd = self._fds.get(container)
        if fd is None:
            fd = self._fds[container] = os.open(root, os.O_RDONLY)
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise OSError(f"short read from {root} at {offset}: source changed or truncated")
        return data

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> SourceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
