"""The ILSVRC2012 devkit: its fixed ID -> wnid map, shipped with the package, and its archive
read as ground truth.

The 2012 devkit (``ILSVRC2012_devkit_t12.tar.gz``) labels the validation images with
ILSVRC2012_IDs 1..1000 (``data/ILSVRC2012_validation_ground_truth.txt``, one a line in file-name
order); ``data/meta.mat`` maps them to wnids. That map never changes, and the 2015 devkit's
``map_clsloc.txt`` spells the same one as text, so it ships as ``data/ilsvrc2012_devkit_ids.txt``
(line n: the wnid of ID n), checked by sha256 at load and against the class table: the ground
truth alone needs neither file, and nothing reads ``meta.mat``. A ``map_clsloc.txt`` given
anyway must agree with it line for line.

The archive is read as a stream through its decompressor (``gzip``, also ``bz2`` or ``lzma``,
or none) by the tar format's stream walk (``imgprep.shards.tarfmt.iter_stream``): nothing is
extracted and no member is opened by a name it gives; only the ground-truth member's bytes are
kept. A member that must not be read (a link, a device, a name that is absolute or holds
``..``) refuses the archive, naming it.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import lzma
import posixpath
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from imgprep.errors import InputMissingError, LabelError, UnsafeArchiveError
from imgprep.inputs.reader import TextFile
from imgprep.inputs.synsets import imagenet_classes, packaged_data
from imgprep.shards.tarfmt import StreamMember, iter_stream

# Line n: the wnid of ILSVRC2012_ID n. Made by scripts/make_val_labels.py from map_clsloc.txt.
DEVKIT_IDS_FILE = "data/ilsvrc2012_devkit_ids.txt"
DEVKIT_IDS_SHA256 = "e85e4969a881deb8a8ba329357d033f7a664de8f1e099f593ad723bcf79bbfe5"
GROUND_TRUTH = "ILSVRC2012_validation_ground_truth.txt"  # the devkit's ground-truth member
MAX_GROUND_TRUTH = 1 << 20  # bytes; the real member is 50,000 short lines (~190 KB)
MAX_MEMBER = 64 << 20  # a member read into memory on the way; larger ones are skipped unread
# The decompressor of each archive --labels may name, by its magic bytes; a tar's "ustar" at 257.
OPENERS: dict[bytes, Callable[..., Any]] = {  # gzip.open … (overloaded: typed loosely)
    b"\x1f\x8b": gzip.open, b"BZh": bz2.open, b"\xfd7zXZ\x00": lzma.open}
USTAR = (257, b"ustar")


@functools.cache
def devkit_wnids() -> tuple[str, ...]:
    """Item n-1: the wnid of ILSVRC2012_ID n. Refused (LabelError) when the packaged file is
    not the one recorded here or does not hold the 1000 classes of the class table."""
    where = f"imgprep/inputs/{DEVKIT_IDS_FILE}"
    data = packaged_data(DEVKIT_IDS_FILE, DEVKIT_IDS_SHA256)
    wnids = tuple(data.decode("ascii").split())
    if sorted(wnids) != list(imagenet_classes().wnids):
        raise LabelError(f"{where} does not hold each class of imgprep/inputs/data/"
                         "synset_words.txt once: the installation is damaged; reinstall imgprep")
    return wnids


def devkit_map() -> dict[int, str]:
    """{ILSVRC2012_ID: wnid} of the 2012 devkit."""
    return {i: w for i, w in enumerate(devkit_wnids(), 1)}


def check_map(path: TextFile, lines: list[str]) -> None:
    """Refuse a ``map_clsloc.txt`` (``wnid ID name`` lines) that lists an ID twice or maps one
    otherwise than the 2012 devkit does, naming the line."""
    known, seen = devkit_wnids(), set()
    for n, ln in enumerate(lines, 1):
        t = ln.split()
        if not t:
            continue
        dev_id = int(t[1])
        if dev_id in seen:
            raise LabelError(f"{path}:{n}: devkit ID {dev_id} listed twice")
        seen.add(dev_id)
        want = known[dev_id - 1] if 1 <= dev_id <= len(known) else None
        if t[0] != want:
            fixed = f"{want}" if want else "no class (IDs are 1..1000)"
            raise LabelError(
                f"{path}:{n}: devkit ID {dev_id} is {t[0]} here, but {fixed} in the ILSVRC2012 "
                "devkit, whose map is fixed: this is not the devkit's map_clsloc.txt; drop it "
                "(the ground truth alone is read with the devkit's own map)")


def is_archive(path: Path) -> bool:
    """Whether ``path`` starts like a compressed file or a tar (not like a text file)."""
    try:
        with open(path, "rb") as f:
            head = f.read(USTAR[0] + len(USTAR[1]))
    except OSError:
        return False  # the reader names the error
    return head.startswith(tuple(OPENERS)) or head[USTAR[0]:] == USTAR[1]


def _open(path: Path) -> IO[bytes]:
    """``path`` opened through its decompressor (none for a plain tar)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
        opener = next((o for magic, o in OPENERS.items() if head.startswith(magic)), open)
        return opener(path, "rb")
    except OSError as e:
        raise InputMissingError(f"cannot read ground truth {path}: {e.strerror}") from e


def _ground_truths(path: Path, members: Iterable[StreamMember]) -> tuple[list[StreamMember], int]:
    """The members named ``GROUND_TRUTH``, and how many members there are; refuses a member
    that must not be read, and a ground truth too large to be the devkit's."""
    found, count = [], 0
    for m in members:
        count += 1
        truth = posixpath.basename(m.name) == GROUND_TRUTH
        if m.data is None and (truth or m.size <= MAX_MEMBER):  # not merely too large to keep
            raise UnsafeArchiveError(f"{path}: member {m.name} {m.refused}; it is not the "
                                     "ILSVRC2012 devkit as image-net.org ships it: re-download it")
        if truth and m.size > MAX_GROUND_TRUTH:
            raise LabelError(f"{path}: member {m.name} is {m.size} bytes, far more than the "
                             f"devkit's ground truth; pass the {GROUND_TRUTH} you mean instead")
        if truth:
            found.append(m)
    return found, count


def archive_ground_truth(path: Path) -> list[str]:
    """The lines of the devkit ground truth inside the archive ``path``
    (``ILSVRC2012_devkit_t12.tar.gz``, or the tar uncompressed), read as a stream. A damaged
    or truncated archive is a SourceFormatError naming it (``iter_stream``)."""
    with _open(path) as f:
        found, count = _ground_truths(path, iter_stream(f, str(path), max_size=MAX_MEMBER))
    if len(found) != 1:
        what = f"{len(found)} members named {GROUND_TRUTH} ({', '.join(m.name for m in found)})" \
            if found else f"no {GROUND_TRUTH} among its {count} members"
        raise LabelError(f"{path} holds {what}; pass ILSVRC2012_devkit_t12.tar.gz as "
                         f"image-net.org ships it, or the ground-truth file itself")
    member = found[0]
    try:
        text = (member.data or b"").decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise LabelError(f"{path}: member {member.name} is not text; re-download the "
                         "devkit") from e
    lines = text.splitlines()
    if not all(ln.strip().isdigit() for ln in lines if ln.strip()):
        raise LabelError(f"{path}: member {member.name} does not hold one devkit ID a line; "
                         "re-download the devkit")
    return lines
