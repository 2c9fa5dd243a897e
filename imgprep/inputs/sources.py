"""List the images of an ILSVRC2012 source without extracting anything.

Understood layouts, detected from what the path holds:
- ``ILSVRC2012_img_train.tar``: an outer tar of per-class ``<wnid>.tar`` (read in place; inner
  tars are opened as windows of the outer file, never copied out);
- a folder of per-class tars; an extracted tree ``<root>/<wnid>/*.JPEG``;
- ``ILSVRC2012_img_val.tar`` or a flat folder of ``ILSVRC2012_val_*.JPEG`` (any flat tar/folder).

The listing is columnar (numpy arrays), so a 1.28 M-image listing costs ~100 MB, not GBs of
Python objects, and it is sorted by key, so it is the same whatever order the disk returns.
Tars are listed by ``imgprep.inputs.tarlist`` (class tars in parallel); members that must not be
read (links, devices, names escaping the archive) are refused and recorded as errors; nothing
is ever extracted by member name.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from imgprep.errors import InputMissingError, SourceFormatError
from imgprep.inputs.reader import RAW, Codecs, SourceReader, over_cap
from imgprep.inputs.splitnames import split_of_name
from imgprep.inputs.synsets import VAL_PREFIX, WNID_RE
from imgprep.inputs.tarlist import (
    IMAGE_EXTS,
    Columns,
    ListingError,
    TarJob,
    is_image_name,
    list_tar,
    run_jobs,
    sanitize_key,
)

__all__ = ["IMAGE_EXTS", "TEST_PREFIX", "VAL_PREFIX", "Listing", "ListingError", "SourceReader",
           "build_listing", "cap_sizes", "list_source", "sanitize_key", "split_folders"]
TEST_PREFIX = "ILSVRC2012_test_"  # test image names: the split without published labels


def split_folders(root: Path) -> tuple[dict[str, Path], list[Path]]:
    """For a folder holding split folders (``train/``, ``val/``, ``validation/``, ``test/``,
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
class Listing:
    """Every image found under ``root``, sorted by key.

    Item i is read from ``containers[container[i]]``: at byte ``offset[i]`` for ``size[i]`` bytes
    when the container is a tar, or as the file ``member[i]`` below it when ``offset[i] < 0``.
    ``member`` is the item's path relative to the source root (for messages and metadata);
    ``wnid`` is the class its form carries (folder, inner tar, name, label), or empty.
    ``codecs``: None when every item is raw bytes as above (tars, folders); else how each
    item is stored (``imgprep.inputs.reader.Codecs``: zip members).
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
    codecs: Codecs | None = None

    def __len__(self) -> int:
        return len(self.key)

    def key_str(self, i: int) -> str:
        return bytes(self.key[i]).decode("utf-8")

    def member_str(self, i: int) -> str:
        return bytes(self.member[i]).decode("utf-8")

    def wnid_str(self, i: int) -> str:
        return bytes(self.wnid[i]).decode("ascii")


def _list_dir(cols: Columns, root: Path, jobs: list[TarJob]) -> None:
    cid = cols.container_id(str(root))
    for dirpath, dirnames, filenames in os.walk(root, onerror=None):
        dirnames.sort()
        for fname in sorted(filenames):
            full = Path(dirpath) / fname
            rel = full.relative_to(root).as_posix()
            if fname.lower().endswith(".tar"):
                jobs.append(TarJob(str(full), cols.container_id(str(full)), 0, None, rel,
                                    f"{rel}/", fname[:-4], len(cols.errors)))
            elif is_image_name(fname):
                try:
                    size = full.stat().st_size
                except OSError as e:
                    cols.errors.append(ListingError(rel, f"cannot stat: {e.strerror}"))
                    continue
                cols.add(cid, -1, size, rel, Path(dirpath).name)
            else:
                cols.skipped += 1


def _with_jobs(cols: Columns, jobs: list[TarJob], workers: int | None) -> None:
    """Run the tar listings ``jobs`` (in parallel) and merge them in the order found."""
    shift = 0
    for job, part in zip(jobs, run_jobs(jobs, workers), strict=True):
        cols.merge(part, job.at, shift)
        shift += len(part.errors)


def list_source(path: Path, workers: int | None = None) -> Listing:
    """List every image under ``path`` (a tar or a folder), sorted by key.

    The class tars of an outer train tar, or of a folder, are listed on ``workers`` forked
    processes (default: every core this process may use); the result does not depend on it.
    """
    if not path.exists():
        raise InputMissingError(
            f"input {path} does not exist; pass ImageNet as downloaded as INPUT "
            "(ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar, the Kaggle zip or a folder)"
        )
    cols = Columns()
    jobs: list[TarJob] = []
    if path.is_dir():
        _list_dir(cols, path, jobs)
        _with_jobs(cols, jobs, workers)
        has_tars = any(c.lower().endswith(".tar") for c in cols.containers[1:])
        kind = "class-tars" if has_tars else "folder"
    else:
        try:
            f = open(path, "rb")
        except OSError as e:
            raise InputMissingError(f"cannot read input {path}: {e.strerror}") from e
        with f:
            job = TarJob(str(path), cols.container_id(str(path)), 0, None, str(path), "", "")
            list_tar(cols, f, job, 0, jobs)
        _with_jobs(cols, jobs, workers)
        kind = "tar"
    if not len(cols) and not cols.errors:
        raise SourceFormatError(
            f"no images (.JPEG/.jpg/.png) found in {path}; pass the folder or archive that "
            "holds them as INPUT (imgprep convert PATH -o OUT)"
        )
    return _build(path, kind, cols)


def _build(path: Path, kind: str, cols: Columns) -> Listing:
    return build_listing(str(path), kind, tuple(cols.containers), cols.arrays(), cols.errors,
                         cols.skipped)


def build_listing(root: str, kind: str, containers: tuple[str, ...], col: dict[str, np.ndarray],
                  errors: Sequence[ListingError], skipped: int,
                  codecs: Codecs | None = None) -> Listing:
    """The listing of the items in ``col`` (``COLUMN_TYPES`` arrays, in the order found),
    sorted by key; duplicate keys after the first are refused as errors."""
    member, key = col["member"], col["key"]
    order = np.lexsort((member, key)) if len(key) else np.zeros(0, dtype=np.int64)
    errors = list(errors)
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
        root=root,
        kind=kind,
        containers=containers,
        container=col["container"][order],
        offset=col["offset"][order],
        size=col["size"][order],
        member=member[order],
        key=key[order],
        wnid=col["wnid"][order],
        errors=tuple(errors),
        skipped=skipped,
        codecs=codecs.take(order) if codecs is not None else None,
    )


def _recorded(listing: Listing, i: int) -> str:
    """Where item ``i``'s size comes from, and what it is, for a refusal."""
    size = int(listing.size[i])
    codecs = listing.codecs
    if codecs is not None and codecs.codec[i] != RAW:
        return (f"its central directory records {size:,} bytes "
                f"({int(codecs.stored[i]):,} compressed)")
    if listing.offset[i] < 0:
        return f"it is {size:,} bytes on disk"
    return f"its tar header records {size:,} bytes"


def cap_sizes(listing: Listing, max_bytes: int) -> Listing:
    """``listing`` without the images whose recorded size (a zip member's: either size) is
    over ``max_bytes``, each an error naming it and its size: nothing of them is read, so
    no worker's memory depends on what an archive claims."""
    over = listing.size > max_bytes
    codecs = listing.codecs
    if codecs is not None:
        over |= (codecs.codec != RAW) & (codecs.stored > max_bytes)
    if not over.any():
        return listing
    refused = tuple(ListingError(listing.member_str(i), over_cap(_recorded(listing, i),
                                                                 max_bytes), listing.key_str(i))
                    for i in np.flatnonzero(over).tolist())
    keep = np.flatnonzero(~over)
    return replace(listing, container=listing.container[keep], offset=listing.offset[keep],
                   size=listing.size[keep], member=listing.member[keep],
                   key=listing.key[keep], wnid=listing.wnid[keep],
                   errors=listing.errors + refused,
                   codecs=codecs.take(keep) if codecs is not None else None)
