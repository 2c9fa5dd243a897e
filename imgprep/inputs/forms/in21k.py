"""ImageNet-21k as image-net.org ships it: ``winter21_whole.tar.gz`` and ``fall11_whole.tar``.

An outer archive of one ``<wnid>.tar`` per synset (19,167 in winter21, 21,841 in fall11),
each holding ``<wnid>_<n>.JPEG``: the layout of ``ILSVRC2012_img_train.tar``, with many more
classes and no validation split of its own. Recognised by content: a plain tar whose members
are class tars, one of them a wnid outside the 1,000 ILSVRC2012 classes or more than 1,000 of
them (the probe reads at most 1,001 headers); a gzip-compressed tar whose first member is a
class tar outside those 1,000 (winter21's is ``n00004475.tar``; reaching the next header
would mean inflating the whole class tar, so one is all the probe reads: a gzipped ILSVRC2012
train tar stays refused by the ``ilsvrc`` form, with the advice to gunzip it). The class
table is the sorted wnids present (``own_classes``), unless ``--classes`` gives one.

A plain tar is listed in place, as the ILSVRC2012 train tar is (``imgprep.inputs.sources``:
inner tars are windows of the outer file, listed in parallel). A ``.tar.gz`` can only be read
front to back, so it is read once into one spool file (``imgprep.inputs.spool``) that holds
the class tars back to back, with one index entry per class tar (not per image); the class
tars are then listed in place from there, in parallel. The listing is columnar either way.
Decompression goes through ``imgprep.inputs.gzipio`` (a faster inflate when installed).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

from imgprep.errors import InputMissingError, SourceFormatError
from imgprep.inputs.forms.base import Detected, ListContext, SplitInput
from imgprep.inputs.gzipio import GZIP_ERRORS, gzip_members, open_gzip
from imgprep.inputs.sources import Listing, build_listing, list_source
from imgprep.inputs.spool import Item, SpoolJob, read_index, spool_all, spool_path
from imgprep.inputs.synsets import WNID_RE, imagenet_classes
from imgprep.inputs.tarlist import GZIP_MAGIC, Columns, TarJob, run_jobs
from imgprep.shards.tarfmt import FILE_KINDS, HeaderError, walk

NAME = "in21k"
FAKE = "imgprep.inputs.fakes.in21k:write"
LABELS = "the wnid of each class tar; the class table is the sorted wnids present, or --classes"
ILSVRC_CLASSES = 1000
HEAD_BYTES = 1 << 16  # what the probe of a .tar.gz decompresses: its first headers
WAIT_MIN_S = 3600.0
SLOWEST_COPY_BPS = 20e6  # bytes/s of inflate + staging write that a waiting rank allows for
UNREADABLE: tuple[type[BaseException], ...] = (OSError, ValueError, *GZIP_ERRORS)


def class_tar_wnid(name: str) -> str | None:
    """The wnid of an outer member named ``<wnid>.tar``, else None."""
    if not name.endswith(".tar") or "/" in name:
        return None
    wnid = name[:-4]
    return wnid if WNID_RE.match(wnid) else None


def _plain_is_21k(path: Path) -> bool:
    """Whether the plain tar ``path`` is an outer tar of class tars beyond ILSVRC2012: a
    class tar outside its 1,000 wnids, or more than 1,000 of them (at most 1,001 headers)."""
    known = imagenet_classes()
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        seen = 0
        for name, kind, *_ in walk(functools.partial(os.pread, fd), os.fstat(fd).st_size,
                                   stop=os.fstat(fd).st_size):
            if kind not in FILE_KINDS:
                continue
            wnid = class_tar_wnid(name)
            if wnid is None:
                return False
            seen += 1
            if known.index(wnid) is None or seen > ILSVRC_CLASSES:
                return True
    except HeaderError:
        return False
    finally:
        os.close(fd)
    return False


def _gzip_first_member(path: Path) -> str | None:
    """The name of the first file member of the gzip-compressed tar ``path``, or None."""
    try:
        with open_gzip(path) as f:
            head = f.read(HEAD_BYTES)
    except UNREADABLE:
        return None  # not a readable gzip stream: another form's probe, or its refusal
    try:
        for name, kind, *_ in walk(lambda size, at: head[at:at + size], None, stop=len(head)):
            if kind in FILE_KINDS:
                return name
    except HeaderError:
        return None
    return None


def is_gzip(path: Path) -> bool:
    """Whether ``path`` is a file that starts as gzip does."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == GZIP_MAGIC
    except OSError:
        return False


def probe(path: Path) -> Detected | None:
    """An ImageNet-21k archive (module docstring), plain or gzip-compressed."""
    if not path.is_file():
        return None
    if is_gzip(path):
        first = _gzip_first_member(path)
        wnid = class_tar_wnid(first) if first is not None else None
        if wnid is None or imagenet_classes().index(wnid) is not None:
            return None
        spool = path.stat().st_size
        where = f"{path} (tar.gz of class tars)"
    elif _plain_is_21k(path):
        spool, where = 0, f"{path} (tar of class tars)"
    else:
        return None
    split = SplitInput(form=NAME, split="train", path=path, where=where, labels=LABELS,
                       spool_bytes=spool, own_classes=True, dry_listed=not spool)
    return Detected(form=NAME, root=path, splits=(split,),
                    description="ImageNet-21k as image-net.org ships it (winter21_whole.tar.gz"
                                " or fall11_whole.tar: one tar per synset)")


def class_tars(source: Path, max_bytes: int | None = None) -> Iterator[Item]:
    """Every member of the gzip-compressed outer tar ``source`` with its bytes (empty for a
    member that is not a class tar: only its name is kept), in archive order. Refuses the
    archive at a member that must not be read. (``max_bytes`` caps images: class tars are
    not, and their images are capped when the plan lists them.)"""
    return gzip_members(source, lambda name: class_tar_wnid(name) is not None,
                        "image-net.org's archive")


def _spooled(split: SplitInput, ctx: ListContext) -> Listing:
    """List the .tar.gz ``split`` through its spool file (module docstring)."""
    if ctx.spool_dir is None:
        raise SourceFormatError(
            f"{split.where} is gzip-compressed: it can be listed only by reading it whole "
            "into its staging copy, which a dry run does not write; run the conversion")
    job = SpoolJob(source=split.path, spool=spool_path(ctx.spool_dir, 0, split.path),
                   read=class_tars)
    # Other ranks wait for the one stream: as long as the slowest copy would take (a writer
    # that dies releases its lock, and a waiter takes the copy over at once).
    spool_all([job], ctx.workers, ctx.spool_start,
              wait_timeout=max(WAIT_MIN_S, split.path.stat().st_size / SLOWEST_COPY_BPS))
    index = read_index(job.spool)
    cols = Columns()
    cid = cols.container_id(str(job.spool))
    jobs = []
    for name, offset, size in zip(index.names, index.offset.tolist(), index.size.tolist(),
                                  strict=True):
        wnid = class_tar_wnid(name)
        if wnid is None:
            cols.skipped += 1
            continue
        jobs.append(TarJob(str(job.spool), cid, offset, size, f"{split.path.name}/{name}",
                           f"{name}/", wnid, len(cols.errors)))
    shift = 0
    for tar, part in zip(jobs, run_jobs(jobs, ctx.workers), strict=True):
        cols.merge(part, tar.at, shift)
        shift += len(part.errors)
    return build_listing(str(split.path), NAME, tuple(cols.containers), cols.arrays(),
                         cols.errors, cols.skipped)


def list_split(split: SplitInput, ctx: ListContext) -> Listing:
    """Every image of the archive: in place for a plain tar, through the spool for a
    .tar.gz."""
    if not split.path.is_file():
        raise InputMissingError(f"input {split.path} does not exist; pass the ImageNet-21k "
                                "archive as downloaded (winter21_whole.tar.gz, fall11_whole.tar)")
    if is_gzip(split.path):
        return _spooled(split, ctx)
    return list_source(split.path, workers=ctx.workers)
