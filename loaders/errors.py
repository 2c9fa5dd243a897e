"""The loaders' error, and the refusal every source makes of a split with no labels."""

from __future__ import annotations

from pathlib import Path

from imgprep import ImgprepError, Manifest, manifest_path


class LoaderError(ImgprepError, RuntimeError):
    """The loader cannot go on; the message names the rank, shard (or file) and key."""


def refuse_unlabelled(m: Manifest, folder: Path) -> None:
    """Refuse a split converted without labels (``--split test``): its batches would have no
    labels to train or validate on."""
    if not m.labelled:
        raise LoaderError(
            f"{manifest_path(folder, m.split)}: the {m.split} split was converted without "
            "labels (imgprep convert --split test), so there is nothing to train or validate "
            "on; train on the train split and validate on val (ILSVRC2012_img_val.tar converts "
            "with the published labels, no --labels needed)")
