"""The Hugging Face Hub's older copy of ILSVRC2012: gzip-compressed tars.

``data/train_images_{0..4}.tar.gz``, ``data/val_images.tar.gz``, ``data/test_images.tar.gz``
(the folder they were downloaded into, its ``data/`` folder, or single archives): flat
members named ``<stem>_<wnid>.JPEG`` (``ILSVRC2012_val_00000001_n01751748.JPEG``), the test
split's ``<stem>.JPEG``. The key is the canonical stem (``imgprep.inputs.hfnames``), the
class the wnid the name ends in.

A gzip stream can only be read front to back, so an archive is read once, through
``imgprep.shards.tarfmt.iter_stream``, straight into its spool file
(``imgprep.inputs.spool``): listing and spooling are one pass, and conversion then reads
the spool by offset. Archives are spooled in parallel, one per process; one archive is one
stream, whatever the worker count. Without a spool folder (``--dry-run``) the archives are
streamed for their names alone and nothing is written. A member that must not be read (a
link, a device, a name escaping the archive) refuses the archive, naming the member; so
does an archive cut short or damaged.
"""

from __future__ import annotations

import gzip
import multiprocessing as mp
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from imgprep.errors import LabelError, SourceFormatError, UnsafeArchiveError
from imgprep.inputs.hfnames import TARGZ_NAME_RE, hub_split, parse_name
from imgprep.inputs.spool import SpoolJob, read_index, spool_all, spool_path
from imgprep.inputs.tarlist import GZIP_MAGIC, is_image_name
from imgprep.job.cpus import rank_cores, read_limits
from imgprep.procs import die_with_parent
from imgprep.shards.tarfmt import iter_stream

NAME = "hf-targz"
SHOWN = 3
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


def targz_files(path: Path) -> dict[str | None, list[Path]]:
    """{split: its archives, sorted} in ``path`` (an archive, the ``data/`` folder or the
    folder holding it): the Hub's names in a folder; any ``.tar.gz`` given as a file (its
    split None unless its name says). Empty when there is none. Train archives with a gap in
    their numbers are refused (an unfinished download)."""
    if path.is_file():
        return {hub_split(path.name): [path]} if is_targz(path) else {}
    folder = path / "data" if (path / "data").is_dir() else path
    if not folder.is_dir():
        return {}
    found: dict[str | None, list[Path]] = {}
    for p in sorted(folder.iterdir()):
        if TARGZ_NAME_RE.match(p.name) and is_targz(p):
            found.setdefault(hub_split(p.name), []).append(p)
    numbers = sorted(int(m.group(1)) for p in found.get("train", [])
                     if (m := _NUMBERED.match(p.name)))
    missing = [f"train_images_{i}.tar.gz" for i in range(numbers[-1] if numbers else 0)
               if i not in numbers]
    if missing:
        raise SourceFormatError(
            f"{folder} lacks {', '.join(missing[:SHOWN])} of the train archives: the download "
            "is unfinished; download the rest, or pass single archives to convert them alone")
    return found


def stream_members(source: Path) -> Iterator[tuple[str, bytes]]:
    """Every regular member of the archive ``source``, in order, with its bytes (empty for
    a member that is not an image: only its name is kept). Refuses the archive at a member
    that must not be read."""
    with gzip.open(source, "rb") as f:
        for m in iter_stream(f, str(source)):
            if m.refused is not None:
                raise UnsafeArchiveError(
                    f"{source}: member {m.name!r} {m.refused}; refused: this is not the "
                    "Hub's archive, or it was altered")
            yield m.name, (m.data or b"") if is_image_name(m.name) else b""


def _names_sizes(source: Path) -> tuple[list[str], list[int]]:
    """The members' names and sizes (a dry run: the stream is read, nothing written)."""
    names, sizes = [], []
    for name, data in stream_members(source):
        names.append(name)
        sizes.append(len(data))
    return names, sizes


def _stream_all(files: list[Path], workers: int | None) -> list[tuple[list[str], list[int]]]:
    n = min(len(files), workers or rank_cores(read_limits(), 1))
    if n <= 1 or mp.current_process().daemon:
        return [_names_sizes(p) for p in files]
    with mp.get_context("fork").Pool(n, die_with_parent, (os.getpid(),)) as pool:
        return pool.map(_names_sizes, files, chunksize=1)


def columns(files: list[Path], spool_dir: Path | None, workers: int | None,
            start: int = 0) -> tuple[tuple[str, ...], dict[str, np.ndarray], int]:
    """(containers, listing columns, members that are not images) of the archives
    ``files``: spooled into ``spool_dir`` (the missing ones on ``workers`` processes,
    beginning at archive ``start``) and read from there; without ``spool_dir``, streamed for
    their names only (containers: the archives, items not readable)."""
    if spool_dir is not None:
        jobs = [SpoolJob(source=p, spool=spool_path(spool_dir, i, p), read=stream_members)
                for i, p in enumerate(files)]
        spool_all(jobs, workers, start)
        indexes = [read_index(j.spool) for j in jobs]
        parts = [(list(x.names), x.offset, x.size) for x in indexes]
        containers = tuple(str(j.spool) for j in jobs)
    else:
        parts = [(names, np.zeros(len(sizes), dtype=np.int64), np.asarray(sizes, np.int64))
                 for names, sizes in _stream_all(files, workers)]
        containers = tuple(str(p) for p in files)
    return containers, *_columns(files, parts)


def _columns(files: list[Path], parts: list[tuple[list[str], np.ndarray, np.ndarray]]
             ) -> tuple[dict[str, np.ndarray], int]:
    cols: dict[str, list[object]] = {k: [] for k in ("container", "offset", "size", "member",
                                                      "key", "wnid")}
    skipped = 0
    for c, (path, (names, offsets, sizes)) in enumerate(zip(files, parts, strict=True)):
        for name, offset, size in zip(names, offsets.tolist(), sizes.tolist(), strict=True):
            if not is_image_name(name):
                skipped += 1
                continue
            hub = parse_name(name)
            if hub.conflict:
                raise LabelError(f"{path}: {hub.conflict}; the archive is damaged or not the "
                                 "Hub's copy")
            for k, v in (("container", c), ("offset", offset), ("size", size),
                         ("member", f"{path.name}/{name}".encode()),
                         ("key", hub.key.encode()), ("wnid", hub.wnid.encode("ascii"))):
                cols[k].append(v)
    types = {"container": np.int32, "offset": np.int64, "size": np.int64, "member": bytes,
             "key": bytes, "wnid": "S9"}
    return {k: np.asarray(v, dtype=types[k]) if v else np.zeros(0, dtype=types[k]
                                                               if types[k] is not bytes
                                                               else "S1")
            for k, v in cols.items()}, skipped
