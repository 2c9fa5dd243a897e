"""Kaggle's ImageNet (``imagenet-object-localization-challenge``), extracted.

The layout: ``ILSVRC/Data/CLS-LOC/{train/<wnid>/,val/,test/}`` images,
``LOC_val_solution.csv`` (validation ground truth) and ``LOC_synset_mapping.txt`` (the 1000
classes) beside ``ILSVRC/``, and ``ILSVRC/Annotations`` (bounding boxes) and
``ILSVRC/ImageSets`` (image lists), which are not images. Recognised from the extracted root,
``ILSVRC/``, ``ILSVRC/Data`` or ``ILSVRC/Data/CLS-LOC`` itself. Train is labelled by its class
folders, val by ``LOC_val_solution.csv`` (through the ground-truth reader and its check), or
without it by the published labels; test has no labels and is skipped unless asked for. The
zip form (``kagglezip``) shares the names and checks here.
"""

from __future__ import annotations

import os
from pathlib import Path

from imgprep.errors import SourceFormatError
from imgprep.inputs.forms.base import TEST_REASON, Detected, ListContext, Skip, SplitInput, TextFile
from imgprep.inputs.groundtruth import PUBLISHED
from imgprep.inputs.sources import Listing, list_source
from imgprep.inputs.synsets import WNID_RE, ClassTable
from imgprep.inputs.tarlist import is_image_name

NAME = "kaggle"
FAKE = "imgprep.inputs.fakes.kaggle:write_tree"
CLS_LOC = "ILSVRC/Data/CLS-LOC"
VAL_TRUTH = "LOC_val_solution.csv"
CLASS_MAP = "LOC_synset_mapping.txt"
SPLIT_FOLDERS = ("train", "val", "test")
TRAIN_LABELS = "the wnid of each class folder (train/<wnid>/)"
NOT_IMAGES = {"ILSVRC/Annotations": "bounding boxes (XML), not images",
              "ILSVRC/ImageSets": "image lists, not images"}
OTHER_LOC = ("LOC_train_solution.csv", "LOC_sample_submission.csv")
OTHER_LOC_REASON = "bounding boxes and a sample submission, not labels"
SHOW_DIFFERENT = 3


def val_labels(truth: TextFile | None, origin: str) -> tuple[str, bool]:
    """(where the val labels come from, whether there are any) for people."""
    if truth is not None:
        return str(truth), True
    return f"{PUBLISHED} (no {VAL_TRUTH} beside {origin})", True


def check_class_map(classes: ClassTable, text: str, origin: str) -> None:
    """Refuse a download whose class map is not the class table in use."""
    wnids = {t[0] for t in (ln.split() for ln in text.splitlines()) if t and WNID_RE.match(t[0])}
    missing, extra = sorted(set(classes.wnids) - wnids), sorted(wnids - set(classes.wnids))
    if missing or extra:
        shown = ", ".join(extra[:SHOW_DIFFERENT] or missing[:SHOW_DIFFERENT])
        raise SourceFormatError(
            f"{origin} lists {len(wnids)} classes, {len(extra)} of them not in the class table "
            f"and {len(missing)} of the table's missing (first: {shown}): it is not ImageNet's "
            f"1000 classes; pass --classes {origin} to convert with its classes")


def find(path: Path) -> tuple[Path, Path] | None:
    """(the CLS-LOC folder, the folder ``ILSVRC/`` is in) when ``path`` is the extracted
    root, ``ILSVRC``, ``ILSVRC/Data`` or ``ILSVRC/Data/CLS-LOC``; else None."""
    if not path.is_dir():
        return None
    candidates = [(path / CLS_LOC, path)]
    parents = path.absolute().parents
    if path.name == "ILSVRC":
        candidates.append((path / "Data" / "CLS-LOC", parents[0]))
    if path.name == "Data" and len(parents) > 1:
        candidates.append((path / "CLS-LOC", parents[1]))
    if path.name == "CLS-LOC" and len(parents) > 2:
        candidates.append((path, parents[2]))
    for cls_loc, base in candidates:
        if any((cls_loc / s).is_dir() for s in ("train", "val")):
            return cls_loc, base
    return None


def _count_images(folder: Path) -> int:
    with os.scandir(folder) as it:
        return sum(1 for e in it if is_image_name(e.name))


def probe(path: Path) -> Detected | None:
    found = find(path)
    if found is None:
        return None
    cls_loc, base = found
    shown = cls_loc.relative_to(base) if cls_loc.is_relative_to(base) else cls_loc
    truth = base / VAL_TRUTH if (base / VAL_TRUTH).is_file() else None
    splits: list[SplitInput] = []
    skipped: list[Skip] = []
    for s in SPLIT_FOLDERS:
        folder = cls_loc / s
        if not folder.is_dir():
            continue
        where = f"{shown}/{s} (folder)"
        if s == "train":
            splits.append(SplitInput(form=NAME, split=s, path=folder, where=where,
                                     labels=TRAIN_LABELS))
        elif s == "val":
            labels, labelled = val_labels(truth, str(base / "ILSVRC"))
            splits.append(SplitInput(form=NAME, split=s, path=folder, where=where,
                                     labels=labels, labelled=labelled,
                                     truth=(truth,) if truth is not None else ()))
        else:
            n = _count_images(folder)
            splits.append(SplitInput(form=NAME, split=s, path=folder, where=where,
                                     labels="none", labelled=False, by_default=False, images=n))
            skipped.append(Skip(what=f"{shown}/{s}", reason=f"{n:,} {TEST_REASON}",
                                split="test"))
    skipped += [Skip(what=k, reason=v) for k, v in NOT_IMAGES.items() if (base / k).is_dir()]
    other = [n for n in OTHER_LOC if (base / n).is_file()]
    if other:
        skipped.append(Skip(what=", ".join(other), reason=OTHER_LOC_REASON))
    return Detected(form=NAME, root=path, splits=tuple(splits), skipped=tuple(skipped),
                    description=f"Kaggle ImageNet (imagenet-object-localization-challenge), "
                                f"extracted at {base}")


def list_split(split: SplitInput, ctx: ListContext) -> Listing:
    cls_map = split.path.parents[3] / CLASS_MAP if len(split.path.parents) > 3 else None
    if cls_map is not None and cls_map.is_file():
        check_class_map(ctx.classes, cls_map.read_text("utf-8-sig"), str(cls_map))
    return list_source(split.path, workers=ctx.workers)
