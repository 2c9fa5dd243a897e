"""The Hugging Face Hub's older copy of ILSVRC2012: gzip-compressed tars.

``data/train_images_{0..4}.tar.gz``, ``data/val_images.tar.gz``, ``data/test_images.tar.gz``
(the folder they were downloaded into, its ``data/`` folder, or single archives): flat
members named ``<stem>_<wnid>.JPEG`` (``ILSVRC2012_val_00000001_n01751748.JPEG``), the test
split's ``<stem>.JPEG``. The key is the canonical stem (``imgprep.inputs.hfnames``), the
class the wnid the name ends in.

A gzip stream can only be read front to back, so an archive is read once, through
``imgprep.shards.tarfmt.iter_stream`` (inflated by ``imgprep.inputs.gzipio``), straight into
its spool file (``imgprep.inputs.spool``): listing and spooling are one pass, and conversion
then reads the spool by offset. Archives are spooled in parallel, one per process; one
archive is one stream, whatever the worker count. Without a spool folder (``--dry-run``) the
archives are streamed for their names alone and nothing is written. A member that must not
be read (a link, a device, a name escaping the archive) refuses the archive, naming the
member; so does an archive cut short or damaged.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
from collections.abc import Iterator
from pathlib import Path

from imgprep.errors import LabelError, SourceFormatError
from imgprep.inputs.forms.base import Detected, ListContext, SplitInput, hub_splits
from imgprep.inputs.forms.refusals import refuse_lfs_pointers
from imgprep.inputs.gzipio import gzip_members
from imgprep.inputs.hfnames import TARGZ_NAME_RE, file_split, parse_name
from imgprep.inputs.sources import Listing, build_listing
from imgprep.inputs.spool import Item, SpoolJob, read_index, spool_all, spool_path
from imgprep.inputs.tarlist import GZIP_MAGIC, Columns, ListingError, is_image_name
from imgprep.job.cpus import rank_cores, read_limits
from imgprep.procs import die_with_parent

NAME = "hf-targz"
FAKE = "imgprep.inputs.fakes.targz:write"
SHOWN = 3
LABELS = "the wnid each member's name ends in (<stem>_<wnid>.JPEG)"
_NUMBERED = re.compile(r"^train_images_(\d+)\.tar\.gz$")


def is_targz(path: Path) -> bool:
    """Whether ``path`` is a ``.tar.gz`` (or ``.tgz``) file that starts as gzip does."""
    if not path.name.endswith((".tar.gz", ".tgz")) or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            return f.read(2) == GZIP_MAGIC
    except OSError:
        return False


def targz_files(path: Path) -> dict[str, list[Path]]:
    """{split: its archives, sorted} in ``path`` (an archive, the ``data/`` folder or the
    folder holding it): the Hub's names in a folder; any ``.tar.gz`` given as a file (the
    split its name mentions: ``test``, ``val``, else train). Empty when there is none.
    Train archives with a gap in their numbers are refused (an unfinished download), and so
    are archives that are Git LFS pointers (a clone made without its LFS objects)."""
    if path.is_file():
        return {file_split(path.name): [path]} if is_targz(path) else {}
    folder = path / "data" if (path / "data").is_dir() else path
    if not folder.is_dir():
        return {}
    named = [p for p in sorted(folder.iterdir()) if TARGZ_NAME_RE.match(p.name) and p.is_file()]
    refuse_lfs_pointers(path, named, "tar.gz archives")
    found: dict[str, list[Path]] = {}
    for p in named:
        if is_targz(p):
            found.setdefault(file_split(p.name), []).append(p)
    numbers = sorted(int(m.group(1)) for p in found.get("train", [])
                     if (m := _NUMBERED.match(p.name)))
    missing = [f"train_images_{i}.tar.gz" for i in range(numbers[-1] if numbers else 0)
               if i not in numbers]
    if missing:
        raise SourceFormatError(
            f"{folder} lacks {', '.join(missing[:SHOWN])} of the train archives: the download "
            "is unfinished; download the rest, or pass single archives to convert them alone")
    return found


def stream_members(source: Path, max_bytes: int | None = None) -> Iterator[Item]:
    """Every regular member of the archive ``source``, in order, with its bytes (empty for
    a member that is not an image: only its name is kept; ``Refused`` for an image over
    ``max_bytes``, unread). Refuses the archive at a member that must not be read."""
    return gzip_members(source, is_image_name, "the Hub's archive", max_bytes)


def _names_sizes(source: Path) -> tuple[list[str], list[int]]:
    """The members' names and sizes (a dry run: the stream is read to its end, so that a
    damaged or cut-short archive is refused as the run refuses it; nothing is written; a
    progress bar on stderr)."""
    names, sizes = [], []
    for name, data in gzip_members(source, is_image_name, "the Hub's archive", progress=True):
        names.append(name)
        sizes.append(len(data) if isinstance(data, bytes) else 0)
    return names, sizes


def _stream_all(files: list[Path], workers: int | None) -> list[tuple[list[str], list[int]]]:
    n = min(len(files), workers or rank_cores(read_limits(), 1))
    if n <= 1 or mp.current_process().daemon:
        return [_names_sizes(p) for p in files]
    with mp.get_context("fork").Pool(n, die_with_parent, (os.getpid(),)) as pool:
        return pool.map(_names_sizes, files, chunksize=1)


def columns(files: list[Path], spool_dir: Path | None, workers: int | None,
            start: int = 0, max_bytes: int | None = None) -> Columns:
    """The listing columns of the archives ``files``: spooled into ``spool_dir`` (the
    missing ones on ``workers`` processes, beginning at archive ``start``; images over
    ``max_bytes`` refused unread, each an error) and read from there; without
    ``spool_dir``, streamed for their names only (containers: the archives, items not
    readable)."""
    refused: list[dict[int, str]] = [{} for _ in files]
    if spool_dir is not None:
        jobs = [SpoolJob(source=p, spool=spool_path(spool_dir, i, p), read=stream_members,
                         max_bytes=max_bytes) for i, p in enumerate(files)]
        spool_all(jobs, workers, start)
        indexes = [read_index(j.spool) for j in jobs]
        parts = [(str(j.spool), list(x.names), x.offset.tolist(), x.size.tolist())
                 for j, x in zip(jobs, indexes, strict=True)]
        refused = [x.refused for x in indexes]
    else:
        parts = [(str(p), names, [0] * len(sizes), sizes)
                 for p, (names, sizes) in zip(files, _stream_all(files, workers), strict=True)]
    cols = Columns()
    for path, (container, names, offsets, sizes), why in zip(files, parts, refused,
                                                             strict=True):
        cid = cols.container_id(container)
        for k, (name, offset, size) in enumerate(zip(names, offsets, sizes, strict=True)):
            if k in why:
                cols.errors.append(ListingError(f"{path.name}/{name}", why[k],
                                                parse_name(name).key))
                continue
            if not is_image_name(name):
                cols.skipped += 1
                continue
            hub = parse_name(name)
            if hub.conflict:
                raise LabelError(f"{path}: {hub.conflict}; the archive is damaged or not the "
                                 "Hub's copy")
            cols.add(cid, offset, size, f"{path.name}/{name}", hub.wnid, stem=hub.key)
    return cols


def probe(path: Path) -> Detected | None:
    """The Hub's tar.gz archives in ``path`` (or one ``.tar.gz``), one split each kind."""
    found = targz_files(path)
    if not found:
        return None
    return hub_splits(form=NAME, path=path, found=found, files_are="archives", one="tar.gz",
                      labels=LABELS, description="the Hugging Face Hub's tar.gz copy of "
                                                 "ImageNet (ILSVRC/imagenet-1k, "
                                                 "data/*_images*.tar.gz)")


def list_split(split: SplitInput, ctx: ListContext) -> Listing:
    """Every image of ``split``, spooled into ``ctx.spool_dir`` as its archives are read."""
    files = targz_files(split.path).get(split.split or "train", [])
    cols = columns(files, ctx.spool_dir, ctx.workers, ctx.spool_start, ctx.max_image_bytes)
    if not len(cols):
        raise SourceFormatError(
            f"{split.where} holds no images (.JPEG/.jpg/.png; {cols.skipped} other members): "
            "it is not the Hub's copy of ImageNet; pass the archives of its images")
    return build_listing(str(split.path), NAME, tuple(cols.containers), cols.arrays(),
                         cols.errors, cols.skipped)
