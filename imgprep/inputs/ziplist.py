"""Listing a zip archive in place: its central directory, read once, into columns.

``read_index`` parses the central directory with ``zipfile`` (zip64 included) and keeps, per
image member, only what a worker needs to read it by offset (``imgprep.inputs.reader``):
the local header's offset and guessed length, the stored and image sizes, the codec and the
CRC-32, as numpy columns; the ``ZipInfo`` objects are dropped as soon as they are read. Small
non-image files near the top (ground truth, class maps) are kept as ``ArchiveMember``s, and
other files are counted by folder, for what is skipped. Members that must not be read are
refused and recorded, never extracted: absolute or ``..`` names, encryption, symlinks and
devices, a name seen twice, a compression other than stored or deflated.

The layout is checked once, as ``unzip -t`` does, before any member is read: every member
(its local header, name and recorded compressed data) must lie inside the file, before the
central directory, and no two members may share bytes (members sorted by offset, each
ending before the next begins). An archive that breaks this is refused whole, naming the
members: which of two overlapping members owns the bytes cannot be told, and overlaps are
how a central-directory entry is pointed at another image (a mislabelled sample) or a small
file is made to inflate many times over. Each member's end (the next one's offset) goes with
its columns, so that the reader checks its local header's real length against it.

An archive that is not a whole readable zip is refused saying what it is: cut short (no
end-of-central-directory record), one part of a split archive, or made with zip features
this reader does not have.
"""

from __future__ import annotations

import functools
import os
import stat
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from imgprep.errors import SourceFormatError
from imgprep.inputs.reader import (
    LOCAL_HEADER,
    UTF8_NAME,
    ZIP_DEFLATED,
    ZIP_STORED,
    ArchiveMember,
    Codecs,
    ZipEntry,
)
from imgprep.inputs.tarlist import IMAGE_EXTS, ListingError, refused
from imgprep.shards.tarfmt import REGULAR

ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a first local header, or an empty archive
METHODS = {zipfile.ZIP_STORED: ZIP_STORED, zipfile.ZIP_DEFLATED: ZIP_DEFLATED}
METHOD_NAMES = {9: "deflate64", 12: "bzip2", 14: "lzma", 93: "zstandard", 95: "xz",
                98: "ppmd", 99: "AES encryption"}
END_MAGIC, END_RECORD = b"PK\x05\x06", 22  # end-of-central-directory signature, length
END_SEARCH = END_RECORD + 65535  # the record is followed by at most a 64 KiB comment
SHOWN = 3  # overlapping members named in a refusal
TOP_DEPTH = 2  # non-image files this deep or less are kept (LOC_*.csv, a top folder's)
OTHERS_DEPTH = 3  # other files are counted per folder, this many names deep
REPACK = "extract it and convert the folder, or re-pack it with stored or deflated members " \
         "(zip -r -Z deflate NEW.zip FOLDER)"


@dataclass(frozen=True)
class ZipIndex:
    """The image members of a zip (``names`` and their columns, in central-directory
    order; ``end``: where the next member or the central directory starts), its small files
    near the top, other files counted per folder, and the members refused (name, reason)."""

    path: Path
    names: list[str]
    offset: np.ndarray
    size: np.ndarray
    stored: np.ndarray
    codec: np.ndarray
    crc: np.ndarray
    head: np.ndarray
    end: np.ndarray
    small: dict[str, ArchiveMember]
    others: dict[str, int]
    refused: tuple[ListingError, ...]

    def codecs(self, rows: np.ndarray) -> Codecs:
        """The reader's columns of the image members ``rows``."""
        return Codecs(self.codec[rows], self.crc[rows], self.stored[rows], self.head[rows],
                      self.end[rows])


def is_zip(path: Path) -> bool:
    """Whether ``path`` is a file that starts as a zip does."""
    try:
        with open(path, "rb") as f:
            return f.read(4) in ZIP_MAGIC
    except OSError:
        return False


def _refusal(info: zipfile.ZipInfo, archive: str) -> str | None:
    """Why the member ``info`` must not be read, or None."""
    name = info.orig_filename
    unsafe = refused(REGULAR, name, archive)
    if unsafe is not None:
        return unsafe
    kind = stat.S_IFMT(info.external_attr >> 16)  # 0: no type recorded (a file)
    usual = info.compress_type in METHODS and not info.flag_bits & 0x1 and (
        info.create_system != 3 or kind in (0, stat.S_IFREG, stat.S_IFDIR))
    if usual:
        return None
    where = f"{archive}: member {name!r}"
    if info.flag_bits & 0x1:
        return f"{where} is encrypted; imgprep reads no encrypted members: {REPACK}"
    if info.create_system == 3 and kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        what = "a symlink" if kind == stat.S_IFLNK else "a device, fifo or socket"
        return f"{where} is {what}; refused"
    if name.endswith("/"):
        return None
    method = METHOD_NAMES.get(info.compress_type, f"method {info.compress_type}")
    return f"{where} is compressed with {method}, which imgprep does not read: {REPACK}"


def _damaged(path: Path, why: str) -> SourceFormatError:
    return SourceFormatError(
        f"{path} starts as a zip archive but its central directory cannot be read ({why}): "
        "the download stopped early or was damaged; re-download it, or let `zip -FF "
        f"{path.name} --out fixed.zip` recover what it can and convert fixed.zip")


def check_end(path: Path) -> None:
    """Refuse a zip without an end-of-central-directory record (cut short) or one that
    says it is one part of several (a split archive), before ``zipfile`` reads it."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - END_SEARCH))
        tail = f.read()
    at = tail.rfind(END_MAGIC)
    if at < 0 or len(tail) - at < END_RECORD:
        raise SourceFormatError(
            f"{path} starts as a zip archive but has no end-of-central-directory record: "
            "the download stopped early; re-download it (or resume it), or let "
            f"`zip -FF {path.name} --out fixed.zip` recover what it can")
    disk, cd_disk = struct.unpack_from("<HH", tail, at + 4)
    if disk not in (0, 0xFFFF) or cd_disk not in (0, 0xFFFF):
        raise SourceFormatError(
            f"{path} is the last part of a split zip archive (part {disk + 1}): join the "
            f"parts first (zip -s 0 {path.name} --out joined.zip) and convert joined.zip")


def _open(path: Path) -> zipfile.ZipFile:
    check_end(path)
    try:
        return zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise _damaged(path, str(e)) from e
    except NotImplementedError as e:
        raise SourceFormatError(f"{path} uses zip features imgprep does not read ({e}): "
                                f"{REPACK}") from e
    except OSError as e:
        raise SourceFormatError(f"cannot read {path}: {e.strerror or e}") from e


def _name_bytes(info: zipfile.ZipInfo) -> int:
    """The length of ``info``'s name as its headers store it."""
    name = info.orig_filename
    return len(name) if name.isascii() else len(
        name.encode("utf-8" if info.flag_bits & UTF8_NAME else "cp437"))


def _member(path: Path, info: zipfile.ZipInfo, head: int, end: int) -> ArchiveMember:
    return ArchiveMember(archive=path, entry=ZipEntry(
        info.orig_filename, info.header_offset, head, info.compress_size, info.file_size,
        METHODS[info.compress_type], info.CRC, end))


@functools.lru_cache(maxsize=2)
def _cached(path: str, size: int, mtime_ns: int) -> ZipIndex:
    return _read(Path(path))


def read_index(path: Path) -> ZipIndex:
    """The index of the zip at ``path`` (parsed and checked once per file version in a
    process)."""
    st = path.stat()
    return _cached(str(path), st.st_size, st.st_mtime_ns)


def _read(path: Path) -> ZipIndex:
    with _open(path) as zf:
        infos = zf.infolist()
        return _scan(path, infos, check_layout(path, infos, zf.start_dir))


def check_layout(path: Path, infos: list[zipfile.ZipInfo], start_dir: int) -> np.ndarray:
    """Where each member's bytes must end (the next member's local header by offset, or the
    central directory at ``start_dir``), in ``infos`` order. Refuses the archive when a
    member (local header, name and compressed data) starts before the file or does not end
    by then: members that share bytes, or run into the central directory or past the end."""
    n = len(infos)
    offset = np.fromiter((i.header_offset for i in infos), np.int64, n)
    extent = np.fromiter((LOCAL_HEADER + _name_bytes(i) + i.compress_size for i in infos),
                         np.int64, n)
    order = np.argsort(offset, kind="stable")
    ends = np.empty(n, np.int64)
    ends[order] = np.append(offset[order][1:], start_dir)
    bad = np.flatnonzero((offset < 0) | (offset + extent > ends))
    if not len(bad):
        return ends
    after = np.empty(n, np.int64)  # the member that follows each one by offset (-1: none)
    after[order] = np.append(order[1:], -1)
    shown = []
    for b in bad[:SHOWN].tolist():
        lo, hi = int(offset[b]), int(offset[b] + extent[b] - 1)
        what = f"{infos[b].orig_filename!r} (bytes {lo}-{hi})"
        nxt = int(after[b])
        shown.append(f"{what} starts before the file" if lo < 0 else
                     f"{what} runs into the central directory at byte {start_dir}" if nxt < 0
                     else f"{what} overlaps {infos[nxt].orig_filename!r} (from byte {ends[b]})")
    more = f"; {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
    raise SourceFormatError(
        f"{path}: {len(bad)} of its {n} members share bytes with another member or lie "
        f"outside the archive ({'; '.join(shown)}{more}), which `unzip -t` or `bsdtar -tf` "
        "reports too (overlapped components). The zip was damaged or altered: an entry can "
        "name one image and hold another's bytes, so nothing in it is read; re-download it")


def _scan(path: Path, infos: list[zipfile.ZipInfo], ends: np.ndarray) -> ZipIndex:
    archive = str(path)
    names: list[str] = []
    rows: list[int] = []
    head: list[int] = []
    small: dict[str, ArchiveMember] = {}
    others: dict[str, int] = {}
    refused: list[ListingError] = []
    seen: set[str] = set()
    for k, info in enumerate(infos):
        name = info.orig_filename
        why = _refusal(info, archive)
        if why is None and name in seen:
            why = f"{archive}: member {name!r} appears twice; the second copy is refused"
        seen.add(name)
        if why is not None:
            refused.append(ListingError(name, why))
            continue
        if name.endswith("/"):
            continue
        length = LOCAL_HEADER + len(info.extra) + _name_bytes(info)
        if name.lower().endswith(IMAGE_EXTS):
            names.append(name)
            rows.append(k)
            head.append(length)
        elif name.count("/") < TOP_DEPTH:
            small[name] = _member(path, info, length, int(ends[k]))
        else:
            folder = "/".join(name.split("/")[:-1][:OTHERS_DEPTH])
            others[folder] = others.get(folder, 0) + 1
    images = [infos[k] for k in rows]
    count = len(images)
    return ZipIndex(
        path, names,
        offset=np.fromiter((i.header_offset for i in images), np.int64, count),
        size=np.fromiter((i.file_size for i in images), np.int64, count),
        stored=np.fromiter((i.compress_size for i in images), np.int64, count),
        codec=np.fromiter((METHODS[i.compress_type] for i in images), np.uint8, count),
        crc=np.fromiter((i.CRC for i in images), np.uint32, count),
        head=np.asarray(head, np.int32), end=ends[np.asarray(rows, np.int64)],
        small=small, others=others, refused=tuple(refused))
