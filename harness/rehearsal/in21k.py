"""The rehearsal's input at ImageNet-21k's shape (``--shape in21k``): winter21's synset
count and skewed class sizes, with small images.

- ``winter21_whole.tar``: an outer tar of 19,167 ``<wnid>.tar`` class tars in sorted-wnid
  order, each holding ``<wnid>_<n>.JPEG``, the layout of ``fall11_whole.tar`` (and of
  ``winter21_whole.tar.gz`` once gunzipped: the rehearsal reads a plain tar, in place; the
  single gzip stream a ``.tar.gz`` costs is measured on its own in docs/convert.md). The
  wnids (``synsets``) are the 1,000 ILSVRC2012 ones and 18,167 made-up n-numbers, sorted
  together; the class table imgprep builds from them is the sorted wnids present.
- Per-class counts (``full_counts``): 13,153,500 images in all, winter21's count, on a
  heavy tail: a fixed quantile curve through ``KNOTS`` (one class of a single image, ~1,500
  classes under 50, a median of ~700, a head of ~1,000-1,500), scaled to the exact sum by
  largest remainders and assigned to the wnids by a fixed permutation. ``--images N`` keeps
  one image in every class and shares the rest in proportion to the full counts beyond one
  (``class_counts``), so N is at least ``MIN_IMAGES``.
- There is no val archive: ``imgprep convert --holdout-per-class 10`` holds out
  ``min(10, n // 2)`` images of each class of n (``held_out`` says how many in all).
- Images: the ILSVRC input's pool and quirks (``harness.rehearsal.dataset``), written by the
  same class-tar writer.

The input is made once per image count into ``<out>/input-in21k-<N>/`` and reused while its
``input.json`` (written last) matches what this code makes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.rehearsal.dataset import (
    MARKER,
    POOL,
    SIDES,
    cached,
    largest_remainders,
    quirk_pool,
    write_train,
)
from imgprep import imagenet_classes, write_bytes_atomic
from imgprep.inputs.fakeset import jpeg_pool

SHAPE = "in21k"
FULL_IMAGES = 13_153_500  # winter21_whole.tar.gz
SYNSETS = 19_167
HOLDOUT = 10  # --holdout-per-class of the convert step
MIN_IMAGES = 20_000  # one image a class, and at least 4 train shards for the partition step
ARCHIVE = "winter21_whole.tar"
CONVERT_STEP = "convert train+val"  # the one convert of this shape, val held out
VERSION = 1  # of what this module writes: a change here remakes every cached input
# (share of the classes, images) points of the sorted class sizes, before scaling
KNOTS = ((0.0, 1.0), (0.04, 20.0), (0.12, 80.0), (0.25, 350.0), (0.5, 700.0),
         (0.75, 1000.0), (0.9, 1200.0), (0.98, 1350.0), (1.0, 1500.0))
MADE_UP_MAX = 15_000_000  # made-up wnids are n00000001 … n14999999


def synsets() -> list[str]:
    """19,167 sorted wnids: ILSVRC2012's 1,000 and made-up ones drawn by a fixed seed."""
    known = set(imagenet_classes().wnids)
    rng = np.random.default_rng(SYNSETS)
    made: list[str] = []
    for n in rng.choice(np.arange(1, MADE_UP_MAX), size=2 * SYNSETS, replace=False).tolist():
        w = f"n{n:08d}"
        if w not in known:
            made.append(w)
        if len(made) == SYNSETS - len(known):
            break
    return sorted(known | set(made))


def full_counts() -> np.ndarray:
    """Images per class (sorted-wnid order) of the full set: sums to 13,153,500 (module
    docstring)."""
    share = (np.arange(SYNSETS) + 0.5) / SYNSETS
    curve = np.interp(share, [k[0] for k in KNOTS], [k[1] for k in KNOTS])
    counts = 1 + largest_remainders(curve - 1, FULL_IMAGES - SYNSETS)
    return counts[np.random.default_rng(FULL_IMAGES).permutation(SYNSETS)]


def class_counts(images: int) -> np.ndarray:
    """Images per class for an archive of ``images``: one each, the rest shared in proportion
    to the full counts beyond one; ``images`` = 13,153,500 gives ``full_counts``."""
    if images < MIN_IMAGES:
        raise ValueError(f"--images {images}: at least {MIN_IMAGES} at the in21k shape "
                         f"(every one of its {SYNSETS:,} classes keeps an image)")
    full = full_counts()
    return 1 + largest_remainders((full - 1).astype(np.float64), images - SYNSETS)


def held_out(counts: np.ndarray) -> int:
    """The images ``--holdout-per-class 10`` moves to val: ``min(10, n // 2)`` a class."""
    return int(np.minimum(HOLDOUT, counts // 2).sum())


def make_input(out: Path, images: int) -> dict[str, Any]:
    """``<out>/input-in21k-<images>/`` holding the archive, made unless a matching one is
    there; returns its marker (counts, bytes, the seconds it took to make, ``cached``)."""
    folder = out / f"input-{SHAPE}-{images}"
    counts = class_counts(images)
    val = held_out(counts)
    want = {"version": VERSION, "shape": SHAPE, "images": images, "val": val,
            "train": images - val, "holdout_per_class": HOLDOUT, "pool": POOL,
            "classes": SYNSETS}
    have = cached(folder, want)
    if have is not None:
        return {**have, "folder": str(folder), "cached": True}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).unlink(missing_ok=True)
    t0 = time.perf_counter()
    pool, quirks = jpeg_pool(POOL, SIDES), quirk_pool()
    size = write_train(folder / ARCHIVE, counts, synsets(), pool, quirks)
    marker = {**want, "seconds": time.perf_counter() - t0,
              "per_class": {"min": int(counts.min()), "max": int(counts.max()),
                            "median": float(np.median(counts)),
                            "at_one": int((counts == 1).sum())},
              "quirks": [k for k, _ in quirks], "bytes": {ARCHIVE: size}}
    write_bytes_atomic(folder / MARKER, json.dumps(marker, sort_keys=True).encode())
    return {**marker, "folder": str(folder), "cached": False}
