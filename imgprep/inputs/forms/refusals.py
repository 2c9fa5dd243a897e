"""Downloads that are not (yet) in a form imgprep reads, named for what they are.

Not a form: ``refuse`` runs before any form is probed, so that none misreads them: another
compression or container (told by its magic bytes, whatever the file is called), one part of
a split archive (told by its name), and, whatever the file is called, told by its content:
an empty file, a Git LFS pointer (a clone made without its LFS objects) or a web page (a
download link that returned a login or quota page). Each is refused saying what was seen
and the command that makes a form imgprep reads in place; nothing here converts anything.

A folder is not a file: the forms that find their files by name in a folder (the Hub's
``data/*.parquet``, ``data/*.tar.gz``) call ``refuse_lfs_pointers`` on what they found, so
that a clone made without its LFS objects is named as one, not as damaged files.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from imgprep.errors import SourceFormatError

# magic bytes -> (what it is, how to make a readable form of FILE, what that gives)
MAGIC: tuple[tuple[bytes, str, str, str], ...] = (
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "zstd -d {f} -o {s}", "{s}"),
    (b"BZh", "bzip2-compressed", "bunzip2 -k {f}", "{s}"),
    (b"\xfd7zXZ\x00", "xz-compressed", "unxz -k {f}", "{s}"),
    (b"\x04\x22\x4d\x18", "lz4-compressed", "lz4 -d {f} {s}", "{s}"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", "7z x {f} -oDIR", "DIR"),
    (b"Rar!\x1a\x07", "a RAR archive", "unrar x {f} DIR/", "DIR"),
)
COMPRESSED_EXTS = (".zst", ".zstd", ".bz2", ".xz", ".lz4")
PAGE = re.compile(rb"^\s*(<!doctype html|<html|<\?xml|\{)", re.IGNORECASE)
NUMBERED_PART = re.compile(r"^(?P<whole>.+\.(?:zip|tar|7z|tgz|tar\.gz))\.(?P<n>\d{3})$",
                           re.IGNORECASE)
ZIP_PART = re.compile(r"^(?P<stem>.+)\.z(?P<n>\d{2})$", re.IGNORECASE)
DEVKIT = re.compile(r"^ILSVRC2012_devkit_t12\.(?:tar\.gz|tgz|tar)$", re.IGNORECASE)
LFS_POINTER = b"version https://git-lfs.github.com/spec/"
LFS_FIELDS = re.compile(rb"^(oid \S+|size \d+)$", re.MULTILINE)
HEAD = 256
TEXT_SHARE = 0.95  # of a page's first characters that are printable or whitespace


def _stem(path: Path) -> str:
    name = path.name
    for ext in COMPRESSED_EXTS:
        if name.lower().endswith(ext):
            return name[: -len(ext)]
    return f"{name}.out"


def _split_part(path: Path) -> None:
    """Refuse one part of a split archive, naming how its parts are joined."""
    m = NUMBERED_PART.match(path.name)
    if m:
        whole, q = m.group("whole"), shlex.quote
        join = (f"7z x {q(path.name)} (7-Zip reads the parts in turn)"
                if whole.lower().endswith(".7z") else
                f"cat {q(whole)}.[0-9][0-9][0-9] > {q(whole)} (the parts in order)")
        raise SourceFormatError(
            f"{path} is part {int(m.group('n'))} of a split archive ({whole}.001, "
            f"{whole}.002 …): join the parts first: {join}, then convert {whole}")
    m = ZIP_PART.match(path.name)
    if m:
        whole = f"{m.group('stem')}.zip"
        raise SourceFormatError(
            f"{path} is part {int(m.group('n'))} of a split zip archive (zip -s; the last part "
            f"is {whole}): join the parts first (zip -s 0 {shlex.quote(whole)} --out "
            "joined.zip) and convert joined.zip")


def refuse(path: Path) -> None:
    """A SourceFormatError saying what ``path`` is when it is refused here; else nothing."""
    if not path.is_file():
        return
    _split_part(path)
    if DEVKIT.match(path.name):
        raise SourceFormatError(
            f"{path} is the ILSVRC2012 devkit: validation ground truth, not images; pass it "
            "with the validation images: imgprep convert ILSVRC2012_img_val.tar -o OUT "
            f"--labels {shlex.quote(str(path))} (canonical val names need no labels: the "
            "published ones are built in)")
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEAD)
    except OSError:
        return  # the form that lists it says why it cannot be read
    for magic, what, command, gives in MAGIC:
        if head.startswith(magic):
            src, out = shlex.quote(str(path)), shlex.quote(str(path.with_name(_stem(path))))
            result = gives.format(s=out)
            raise SourceFormatError(
                f"{path} is {what}, which imgprep does not read in place: "
                f"`{command.format(f=src, s=out)}` gives {result}, which it reads "
                f"(imgprep convert {result} -o OUT)")
    _by_content(path, head)


def _lfs_fields(head: bytes) -> str:
    """A pointer's ``oid`` and ``size`` lines, as it states them."""
    found = ", ".join(m.decode("ascii", "replace") for m in LFS_FIELDS.findall(head))
    return found or "a few lines of text"


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(HEAD)
    except OSError:
        return b""  # the form that lists it says why it cannot be read


def refuse_lfs_pointers(where: Path, files: list[Path], what: str) -> None:
    """Refuse ``where`` (a folder a form found ``files`` in by name; ``what``: what they are
    called, "parquet files") when any of them is a Git LFS pointer, naming the first."""
    pointers = [(p, head) for p in files if (head := _head(p)).startswith(LFS_POINTER)]
    if not pointers:
        return
    first, head = pointers[0]
    share = f"all {len(files)}" if len(pointers) == len(files) else \
        f"{len(pointers)} of the {len(files)}"
    raise SourceFormatError(
        f"{first.parent}: {share} {what} are Git LFS pointer files, not the data ({first}: "
        f"{_lfs_fields(head)}): the clone was made without its LFS objects; fetch them with "
        f"`git lfs pull` in the clone (`git -C {shlex.quote(str(where))} lfs pull`), then "
        "convert it again")


def _by_content(path: Path, head: bytes) -> None:
    """Refuse an empty file, a Git LFS pointer or a web page, whatever it is called."""
    if not head:
        raise SourceFormatError(
            f"{path} is empty (0 bytes): the download or copy wrote nothing; download it "
            "again")
    if head.startswith(LFS_POINTER):
        raise SourceFormatError(
            f"{path} is a Git LFS pointer file ({_lfs_fields(head)}), not the "
            "data: the repository was cloned without its LFS objects; fetch them in the "
            f"clone with `git lfs pull --include {shlex.quote(path.name)}` (or `git lfs "
            "pull`), then convert it")
    if PAGE.match(head) and _is_text(head):
        raise SourceFormatError(
            f"{path} is a text or web page (it starts {head[:24]!r}), not ImageNet data: the "
            "download link returned a page (a login, an expired link or a quota message); "
            "download the file again from the page it came from")


def _is_text(head: bytes) -> bool:
    """Whether ``head`` reads as text: UTF-8 (a character cut at the end allowed) and nearly
    all printable: a page, not binary data that happens to start with ``{`` or ``<``."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:
            return False
        text = head[:e.start].decode("utf-8")
    shown = sum(1 for c in text if c.isprintable() or c in "\t\n\r")
    return bool(text) and shown >= TEXT_SHARE * len(text)


def is_tar(path: Path) -> bool:
    """Whether ``path`` holds a tar header's ``ustar`` magic where tar puts it."""
    with open(path, "rb") as fh:
        fh.seek(257)
        return fh.read(5) == b"ustar"
