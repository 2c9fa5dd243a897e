"""The Hugging Face Hub's parquet copy of ILSVRC2012 (``ILSVRC/imagenet-1k``).

``data/{train,validation,test}-NNNNN-of-NNNNN.parquet``: the folder the copy was downloaded
into, its ``data/`` folder, or single files (a file not named as on the Hub is the split its
name mentions: ``test``, ``val``, else train). The test split (label -1) is not converted
unless asked for. Each file is checked by its footer
(``imgprep.inputs.parquetio``) and listed from its ``image.path`` and ``label`` columns
alone, a row group at a time: the key is the canonical stem of ``image.path`` (the Hub's
names end in ``_<wnid>``), the class is ``label`` in sorted-wnid order, cross-checked with
the wnid the name carries. A row without a path (``image.path`` null or empty, or no such
column), or whose path names no class and no published image, has no name to check its
label against: such a file is refused, naming it, unless
``--trust-labels`` takes its labels as given (the check is then ``trusted``, as the summary
and the manifest say); its rows are keyed ``<file stem>_<row>``.

A parquet file has no per-image random access (a row group of ~100 images is the least
that can be read), so converting it spools each file once (``imgprep.inputs.spool``) and
reads the spool by offset; without a spool folder (``--dry-run``) nothing is written and the
listing's items cannot be read. The probe reads the footers for the image counts (when
pyarrow is there) and states the spool's disk cost: the files' size.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from imgprep.errors import LabelError, SourceFormatError
from imgprep.inputs import parquetio
from imgprep.inputs.forms.base import Detected, ListContext, SplitInput, hub_splits
from imgprep.inputs.forms.refusals import refuse_lfs_pointers
from imgprep.inputs.groundtruth import listed
from imgprep.inputs.hfnames import PARQUET_NAME_RE, file_split, is_canonical, parse_name
from imgprep.inputs.sources import Listing, build_listing
from imgprep.inputs.spool import Item, SpoolJob, read_index, spool_all, spool_path
from imgprep.inputs.synsets import ClassTable
from imgprep.inputs.tarlist import ListingError

NAME = "hf-parquet"
FAKE = "imgprep.inputs.fakes.parquet:write"
SHOWN = 3
LABELS = "the 'label' column (sorted-wnid order), checked against the wnid in image.path"


def parquet_files(path: Path) -> dict[str, list[Path]]:
    """{split: its parquet files, sorted} in ``path`` (a parquet file, the ``data/`` folder
    or the folder holding it). Empty when there is no parquet file. A folder whose
    numbered set is incomplete, or whose files are Git LFS pointers, is refused."""
    if path.is_file():
        return {file_split(path.name): [path]} if parquetio.is_parquet(path) else {}
    folder = path / "data" if (path / "data").is_dir() else path
    if not folder.is_dir():
        return {}
    files = [p for p in sorted(folder.iterdir()) if p.name.endswith(".parquet") and p.is_file()]
    refuse_lfs_pointers(path, files, "parquet files")
    found: dict[str, list[Path]] = {}
    for p in files:
        found.setdefault(file_split(p.name), []).append(p)
    for split_files in found.values():
        _check_complete(folder, split_files)
    return found


def _check_complete(folder: Path, files: list[Path]) -> None:
    """Refuse a Hub set missing some of its numbered files (an unfinished download)."""
    counts: dict[tuple[str, str], set[int]] = {}
    for p in files:
        m = PARQUET_NAME_RE.match(p.name)
        if m is not None:
            counts.setdefault((m.group("split"), m.group("count")), set()).add(
                int(m.group("index")))
    for (split, count), have in sorted(counts.items()):
        missing = [f"{split}-{i:05d}-of-{count}.parquet" for i in range(int(count))
                   if i not in have]
        if missing:
            raise SourceFormatError(
                f"{folder} holds {len(have)} of the {int(count)} {split} parquet files (missing: "
                f"{', '.join(missing[:SHOWN])}{' …' if len(missing) > SHOWN else ''}): the "
                "download is unfinished; download the rest, or pass single files to convert "
                "them alone")


@dataclass
class FileListing:
    """The rows of one parquet file: member names (``<file>/<path>``), keys and wnids."""

    path: Path
    member: np.ndarray
    key: np.ndarray
    wnid: np.ndarray

    def __len__(self) -> int:
        return len(self.key)


def _refuse_unnamed(path: Path, rows: list[int], total: int, trust: bool) -> None:
    """Refuse a file with ``rows`` that have no ``image.path`` (their labels cannot be
    checked against a name) unless ``trust``: never a silent unchecked label."""
    if not rows or trust:
        return
    shown = ", ".join(str(r) for r in rows[:SHOWN]) + (" …" if len(rows) > SHOWN else "")
    raise LabelError(
        f"{path}: {len(rows)} of {total} rows have no image.path, or one that names no class "
        f"and no published image (rows {shown}), so their labels cannot be checked against "
        "a file name (the Hub's copy names every image); "
        "download the file again, or pass --trust-labels to accept the labels as given")


def _row_names(path: Path, groups: Iterator[parquetio.RowGroup],
               classes: ClassTable, trust: bool = False) -> FileListing:
    table = np.asarray([w.encode("ascii") for w in classes.wnids] + [b""], dtype="S9")
    member: list[bytes] = []
    key: list[bytes] = []
    wnids: list[np.ndarray] = []
    mismatch: list[str] = []
    unnamed: list[int] = []
    for group in groups:
        named: list[bytes] = []
        for row, name in enumerate(group.paths, group.first_row):
            hub = parse_name(name) if name else parse_name(f"{path.stem}_{row:06d}")
            if hub.conflict:
                raise LabelError(f"{path}: row {row}: {hub.conflict}; the file is damaged or "
                                 "not the Hub's copy")
            member.append(f"{path.name}/{name or row}".encode())
            if not (hub.wnid or is_canonical(hub.key)):
                unnamed.append(row)
            key.append(hub.key.encode())
            named.append(hub.wnid.encode("ascii"))
        label_wnid = table[group.labels]  # -1 (test) picks the empty last entry
        differ = np.flatnonzero((np.asarray(named, dtype="S9") != b"")
                                & (np.asarray(named, dtype="S9") != label_wnid))
        mismatch += [f"row {group.first_row + i} ({group.paths[i]}: label "
                     f"{int(group.labels[i])} = {label_wnid[i].decode()})" for i in differ]
        wnids.append(label_wnid)
    _refuse_unnamed(path, unnamed, len(member), trust)
    if mismatch:
        raise LabelError(
            f"{path}: {len(mismatch)} rows whose label is another class than the wnid their "
            f"image.path ends in ({listed(mismatch)}); the file is damaged "
            "or its labels are not in sorted-wnid order: download it again")
    return FileListing(path, np.asarray(member, dtype=bytes), np.asarray(key, dtype=bytes),
                       np.concatenate(wnids) if wnids else np.zeros(0, dtype="S9"))


def list_file(path: Path, classes: ClassTable, allow_test: bool,
              trust: bool = False) -> FileListing:
    """Check ``path``'s footer, then list its rows from ``image.path`` and ``label``;
    ``trust`` (``--trust-labels``): take the labels of rows without a path as given."""
    parquetio.read_meta(path, classes)
    return _row_names(path, parquetio.iter_labels(path, classes, allow_test), classes, trust)


def spool_items(source: Path, max_bytes: int | None = None) -> Iterator[Item]:
    """A parquet file's images for the spool, named by row (those over ``max_bytes``
    refused unread)."""
    for row, data in enumerate(parquetio.iter_images(source, max_bytes)):
        yield str(row), data


def spool_jobs(files: list[Path], spool_dir: Path,
               max_bytes: int | None = None) -> list[SpoolJob]:
    """One spool job per parquet file, in ``files`` order."""
    return [SpoolJob(source=p, spool=spool_path(spool_dir, i, p), read=spool_items,
                     max_bytes=max_bytes) for i, p in enumerate(files)]


def columns(files: list[FileListing], spool_dir: Path | None, workers: int | None,
            start: int = 0, max_bytes: int | None = None
            ) -> tuple[tuple[str, ...], dict[str, np.ndarray], list[ListingError]]:
    """(containers, listing columns, errors) of ``files``: with ``spool_dir``, every file is
    spooled (missing ones on ``workers`` processes, beginning at file ``start``; images
    over ``max_bytes`` refused, each an error) and items are read from the spool; without,
    the containers are the parquet files and the items are rows (offset = row, size 0),
    for counting only."""
    n = sum(len(f) for f in files)
    container = np.repeat(np.arange(len(files), dtype=np.int32), [len(f) for f in files])
    offset = np.concatenate([np.arange(len(f), dtype=np.int64) for f in files]) if files \
        else np.zeros(0, dtype=np.int64)
    size = np.zeros(n, dtype=np.int64)
    containers = tuple(str(f.path) for f in files)
    refused: dict[int, str] = {}
    if spool_dir is not None:
        jobs = spool_jobs([f.path for f in files], spool_dir, max_bytes)
        spool_all(jobs, workers, start)
        offset, size, refused = _spool_offsets(files, jobs)
        containers = tuple(str(j.spool) for j in jobs)
    col = {
        "container": container, "offset": offset, "size": size,
        **{name: np.concatenate([getattr(f, name) for f in files]) if files
           else np.zeros(0, dtype="S9" if name == "wnid" else "S1")
           for name in ("member", "key", "wnid")},
    }
    errors = [ListingError(col["member"][i].decode("utf-8"), why, col["key"][i].decode("utf-8"))
              for i, why in sorted(refused.items())]
    keep = np.setdiff1d(np.arange(n), np.fromiter(refused, np.int64, len(refused)))
    return containers, {k: v[keep] for k, v in col.items()}, errors


def _spool_offsets(files: list[FileListing], jobs: list[SpoolJob]
                   ) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """The rows' offsets and sizes in the spool files, and {row: why} of those refused."""
    offsets, sizes, refused, first = [], [], {}, 0
    for f, job in zip(files, jobs, strict=True):
        index = read_index(job.spool)
        if len(index) != len(f):
            raise SourceFormatError(
                f"{job.spool} holds {len(index)} images but {f.path} lists {len(f)}: the file "
                "changed since it was spooled; remove the spool folder "
                f"{job.spool.parent} and rerun")
        offsets.append(index.offset)
        sizes.append(index.size)
        refused.update({first + i: why for i, why in index.refused.items()})
        first += len(f)
    empty = np.zeros(0, dtype=np.int64)
    return (np.concatenate(offsets) if offsets else empty,
            np.concatenate(sizes) if sizes else empty, refused)


def _images(files: list[Path]) -> int | None:
    """The files' row count from their footers; None without pyarrow or a readable footer."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    try:
        return sum(pq.ParquetFile(p).metadata.num_rows for p in files)
    except (OSError, ValueError):
        return None  # refused, saying why, when it is listed


def probe(path: Path) -> Detected | None:
    """The parquet files of the Hub's copy in ``path``, one split per split they hold."""
    found = parquet_files(path)
    if not found:
        return None
    return hub_splits(form=NAME, path=path, found=found, files_are="parquet files",
                      one="parquet", labels=LABELS, count=_images,
                      description="the Hugging Face Hub's parquet copy of ImageNet "
                                  "(ILSVRC/imagenet-1k)")


def list_split(split: SplitInput, ctx: ListContext) -> Listing:
    """Every image of ``split``: listed from the files' names and labels, then spooled
    into ``ctx.spool_dir`` and read from there (``--dry-run``: not spooled)."""
    files = parquet_files(split.path).get(split.split or "train", [])
    test = split.split == "test"  # unlabelled: nothing to check
    listed = [list_file(p, ctx.classes, allow_test=test, trust=ctx.trust_labels or test)
              for p in files]
    containers, cols, errors = columns(listed, ctx.spool_dir, ctx.workers, ctx.spool_start,
                                       ctx.max_image_bytes)
    return build_listing(str(split.path), NAME, containers, cols, errors, 0)
