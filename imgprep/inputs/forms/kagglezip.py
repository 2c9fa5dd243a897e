"""Kaggle's ImageNet as downloaded: ``imagenet-object-localization-challenge.zip``, not
extracted.

The zip's central directory (about 2 M entries in the real archive, zip64) is listed once
per process into columns (``imgprep.inputs.ziplist``), and workers read each member by the
offset of its local header (``imgprep.inputs.reader``: stored or deflated, CRC-32 checked).
The layout, labels and what is skipped are those of the extracted form (``kaggle``), found
at the zip's root or under one top folder; ``LOC_val_solution.csv`` and
``LOC_synset_mapping.txt`` are read from the zip, never extracted. Any zip is claimed here:
one that is cut short, split, or not Kaggle's is refused saying what it is and what works.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from pathlib import Path

import numpy as np

from imgprep.errors import SourceFormatError
from imgprep.inputs.forms.base import TEST_REASON, Detected, ListContext, Skip, SplitInput
from imgprep.inputs.forms.kaggle import (
    CLASS_MAP,
    CLS_LOC,
    NOT_IMAGES,
    OTHER_LOC,
    OTHER_LOC_REASON,
    SPLIT_FOLDERS,
    TRAIN_LABELS,
    VAL_TRUTH,
    check_class_map,
    val_labels,
)
from imgprep.inputs.keys import member_key
from imgprep.inputs.reader import ArchiveMember
from imgprep.inputs.sources import Listing, build_listing
from imgprep.inputs.synsets import WNID_RE
from imgprep.inputs.tarlist import ListingError
from imgprep.inputs.ziplist import ZipIndex, is_zip, read_index

NAME = "kaggle-zip"
FAKE = "imgprep.inputs.fakes.kaggle:write_zip"
ZIP_NAME = "imagenet-object-localization-challenge.zip"  # the download's own name
MARKER = f"{CLS_LOC}/"
SHOW_NAMES = 3


def _prefix(index: ZipIndex) -> str:
    """What comes before ``ILSVRC/Data/CLS-LOC/`` in the names ("" or one top folder)."""
    for name in index.names:
        at = name.find(MARKER)
        if at >= 0 and name[:at].count("/") <= 1:
            return name[:at]
    if index.refused and not index.names:
        raise SourceFormatError(
            f"{index.path}: every image member is refused ({len(index.refused)} members; "
            f"first: {index.refused[0].reason}); nothing in it can be read")
    shown = ", ".join(index.names[:SHOW_NAMES] or list(index.small)[:SHOW_NAMES]) or "none"
    raise SourceFormatError(
        f"{index.path} is a zip archive, but not Kaggle's ImageNet: no image is under "
        f"{MARKER} (first images: {shown}); extract it (unzip {index.path.name} -d DIR) and "
        "convert DIR")


def _under(name: str, prefix: str) -> bool:
    """Whether a member, refused or not, is in the folder ``prefix`` (an absolute name or one
    with ``..`` counts where it points)."""
    return name.startswith(prefix) or posixpath.normpath(name.lstrip("/")).startswith(prefix)


def _skips(index: ZipIndex, top: str, outside: int, counts: dict[str, int]) -> list[Skip]:
    out = []
    if "test" in counts:
        out.append(Skip(what=f"{top}{CLS_LOC}/test", reason=f"{counts['test']:,} {TEST_REASON}",
                        split="test"))
    for folder, reason in NOT_IMAGES.items():
        files = sum(n for k, n in index.others.items() if f"{k}/".startswith(f"{top}{folder}/"))
        if files:
            out.append(Skip(what=f"{top}{folder}", reason=f"{files:,} files: {reason}"))
    other = [n for n in OTHER_LOC if f"{top}{n}" in index.small]
    if other:
        out.append(Skip(what=", ".join(other), reason=OTHER_LOC_REASON))
    if outside:
        out.append(Skip(what=f"{outside:,} images outside {top}{CLS_LOC}/{{train,val,test}}",
                        reason="not in a split folder"))
    stray = [e for e in index.refused if not _under(e.source, f"{top}{MARKER}")]
    if stray:
        out.append(Skip(what=f"{len(stray)} members outside the splits",
                        reason=f"refused, never read (first: {stray[0].reason})"))
    return out


def _split_input(path: Path, split: str, prefix: str, count: int, truth: ArchiveMember | None,
                 top: str) -> SplitInput:
    labels, labelled = TRAIN_LABELS, True
    if split == "val":
        labels, labelled = val_labels(truth, f"{top}ILSVRC/ in {path.name}")
    elif split == "test":
        labels, labelled = "none", False
    return SplitInput(form=NAME, split=split, path=path, prefix=prefix, images=count,
                      where=f"{prefix} in {path.name}", labels=labels, labelled=labelled,
                      by_default=split != "test",
                      truth=(truth,) if split == "val" and truth is not None else ())


def probe(path: Path) -> Detected | None:
    if path.is_dir():  # the folder the zip was downloaded into, unless it holds the tree too
        if not (path / ZIP_NAME).is_file() or (path / CLS_LOC).is_dir():
            return None
        path = path / ZIP_NAME
    if not path.is_file() or not is_zip(path):
        return None
    index = read_index(path)
    top = _prefix(index)
    starts = {s: f"{top}{MARKER}{s}/" for s in SPLIT_FOLDERS}
    base = f"{top}{MARKER}"
    cut = len(base)
    found = Counter(n[cut:n.find("/", cut)] if n.startswith(base) else "" for n in index.names)
    counts = {s: found[s] for s in SPLIT_FOLDERS if found[s]}
    outside = len(index.names) - sum(counts.values())
    truth = index.small.get(f"{top}{VAL_TRUTH}")
    splits = [_split_input(path, s, starts[s], counts[s], truth, top)
              for s in SPLIT_FOLDERS if s in counts]
    return Detected(form=NAME, root=path, splits=tuple(splits),
                    skipped=tuple(_skips(index, top, outside, counts)),
                    description=f"Kaggle ImageNet (imagenet-object-localization-challenge), "
                                f"the zip {path.name}, read in place")


def list_split(split: SplitInput, ctx: ListContext) -> Listing:
    """The split's members, listed from the zip's index; read by offset at convert time."""
    index = read_index(split.path)
    top = split.prefix[:split.prefix.find(MARKER)]
    cls_map = index.small.get(f"{top}{CLASS_MAP}")
    if cls_map is not None:
        check_class_map(ctx.classes, cls_map.read_text("utf-8-sig"), str(cls_map))
    rows = np.asarray([i for i, n in enumerate(index.names) if n.startswith(split.prefix)],
                      dtype=np.int64)
    names = [index.names[i] for i in rows.tolist()]
    parents = [n.rpartition("/")[0].rpartition("/")[2] for n in names]
    col = {
        "container": np.zeros(len(rows), dtype=np.int32),
        "offset": index.offset[rows], "size": index.size[rows],
        "member": np.array([n.encode("utf-8") for n in names], dtype=bytes),
        "key": np.array([member_key(n).encode("utf-8") for n in names], dtype=bytes),
        "wnid": np.array([p.encode("ascii") if WNID_RE.match(p) else b"" for p in parents],
                         dtype="S9"),
    }
    if not len(rows):
        col["member"], col["key"] = np.zeros(0, dtype="S1"), np.zeros(0, dtype="S1")
    errors = [ListingError(e.source, e.reason) for e in index.refused
              if _under(e.source, split.prefix)]
    return build_listing(str(split.path), "zip", (str(split.path),), col, errors, 0,
                         index.codecs(rows))
