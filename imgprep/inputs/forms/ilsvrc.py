"""ILSVRC2012 as image-net.org ships it, and the folders people make of it.

``ILSVRC2012_img_train.tar`` (an outer tar of ``<wnid>.tar``), ``ILSVRC2012_img_val.tar``, any
flat tar, a folder of class tars, an extracted ``<wnid>/`` tree, a flat folder of images, and
a folder holding split folders (``train/``, ``val/``, ``ILSVRC2012_img_val.tar`` …; each is
one split). Listed by ``imgprep.inputs.sources``. This form takes whatever exists, so it is
probed last; what it cannot read is refused when it is listed.
"""

from __future__ import annotations

from pathlib import Path

from imgprep.inputs.forms.base import TEST_REASON, Detected, ListContext, Skip, SplitInput
from imgprep.inputs.sources import Listing, list_source, split_folders
from imgprep.inputs.tarlist import IMAGE_EXTS
from imgprep.sections import SPLITS

NAME = "ilsvrc"
FAKE = "imgprep.inputs.fakes.ilsvrc:write"
LABELS = ("the wnid of each class tar or folder, or the wnid a name starts with; "
          "ILSVRC2012_val_* images: the published labels, or --labels")
SKIP_SHOWN = 5


def _one(path: Path, split: str | None) -> SplitInput:
    if split == "test":  # converted only with --split test, without labels
        return SplitInput(form=NAME, split=split, path=path, where=str(path), labels="none",
                          labelled=False, by_default=False)
    return SplitInput(form=NAME, split=split, path=path, where=str(path), labels=LABELS)


def probe(path: Path) -> Detected | None:
    """Any existing file or folder: a folder of split folders gives one split each."""
    if not path.exists():
        return None
    found, others = split_folders(path)
    if not found:
        return Detected(form=NAME, root=path, splits=(_one(path, None),),
                        description=f"{'a tar' if path.is_file() else 'a folder'} of "
                                    "ILSVRC2012 images (image-net.org tars or folders)")
    splits = tuple(_one(p, s) for s, p in sorted(found.items(), key=lambda kv: SPLITS.index(kv[0])))
    shown = [p for p in others
             if p.is_dir() or p.name.lower().endswith((".tar", *IMAGE_EXTS))]
    skipped: tuple[Skip, ...] = ()
    if shown:
        names = ", ".join(str(p) for p in shown[:SKIP_SHOWN]) + \
            (" …" if len(shown) > SKIP_SHOWN else "")
        skipped = (Skip(what=names, reason="not a train or val folder; convert them on "
                                          "their own if you need them"),)
    if "test" in found:
        skipped += (Skip(what=str(found["test"]), reason=TEST_REASON, split="test"),)
    return Detected(form=NAME, root=path, splits=splits, skipped=skipped,
                    description="a folder of split folders "
                                f"({', '.join(p.name for p in found.values())})")


def list_split(split: SplitInput, ctx: ListContext) -> Listing:
    return list_source(split.path, workers=ctx.workers)
