"""The rehearsal's input: ILSVRC2012 as downloaded, at the real counts, with small images.

- ``ILSVRC2012_img_train.tar``: an outer tar of 1,000 per-class ``<wnid>.tar`` (the wnids of
  ``imgprep.inputs.synsets.imagenet_classes``), each holding ``<wnid>_<n>.JPEG``. The
  per-class counts (``full_counts``) are a fixed list with the real set's shape: 1,281,167
  in all, 896 classes at 1,300, 104 below it down to one class at 732. ``--images N`` scales
  every class in proportion (``class_counts``: largest remainders, so they sum to N exactly).
- ``ILSVRC2012_img_val.tar``: ``ILSVRC2012_val_%08d.JPEG`` numbered 1 … V (V = 50,000 at
  full size, scaled the same way with a floor of ``VAL_FLOOR``), and the devkit's ground
  truth for them: ``ILSVRC2012_validation_ground_truth.txt`` (one devkit ID a line, the
  published class of each image, ``imagenet_val_labels``) with the ``map_clsloc.txt`` that
  maps those IDs to wnids (the same fixed permutation ``imgprep make-sample`` writes), so
  convert's check against the published labels passes.
- Images: ``POOL`` synthetic photos of 48-96 px a side (any aspect ratio in that range),
  encoded once and their bytes reused in turn; every tenth class's second image and the
  first validation images are the fake-set maker's quirks (grayscale, CMYK, PNGs named
  ``.JPEG``, 16-bit, EXIF-rotated, progressive 4:4:4). Tars are written with imgprep's
  fixed-header writer (``imgprep.shards.writers.header_bytes``), one class at a time.

The input is made once per image count into ``<out>/input-<N>/`` and reused while its
``input.json`` (written last) matches what this code makes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from imgprep import ClassTable, imagenet_classes, write_bytes_atomic
from imgprep.inputs.devkit import devkit_map
from imgprep.inputs.fakeset import QUIRKS, jpeg_pool, synthetic_photo
from imgprep.inputs.synsets import imagenet_val_labels
from imgprep.shards.writers import BLOCK, RECORD, header_bytes

FULL_TRAIN = 1_281_167
FULL_VAL = 50_000
CLASSES = 1000
MAX_PER_CLASS, MIN_PER_CLASS = 1300, 732
SHORT_CLASSES = 104  # classes below 1,300: one at 732, the rest on a ramp
VAL_FLOOR = 1000
MIN_IMAGES = 5000  # 4 train shards of 1,250 at least, one per node of the partition step
POOL = 2048
SIDES = (48, 96)
VERSION = 2  # of what this module writes: a change here remakes every cached input
MARKER = "input.json"
TRAIN_TAR, VAL_TAR = "ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar"
GROUND_TRUTH, DEVKIT_MAP = "ILSVRC2012_validation_ground_truth.txt", "map_clsloc.txt"


def full_counts() -> np.ndarray:
    """Images per class (sorted-wnid order) of the full set: sums to 1,281,167, 896 classes
    at 1,300, one at 732, the other 103 short ones between (deficits on a linear ramp), the
    short classes picked by a fixed seed."""
    counts = np.full(CLASSES, MAX_PER_CLASS, np.int64)
    short = np.random.default_rng(FULL_TRAIN).permutation(CLASSES)[:SHORT_CLASSES]
    counts[short[0]] = MIN_PER_CLASS
    deficit = CLASSES * MAX_PER_CLASS - FULL_TRAIN - (MAX_PER_CLASS - MIN_PER_CLASS)
    counts[short[1:]] -= largest_remainders(np.arange(1, SHORT_CLASSES, dtype=np.float64),
                                            deficit)
    return counts


def largest_remainders(weights: np.ndarray, total: int) -> np.ndarray:
    """Integers proportional to ``weights`` that sum to ``total`` exactly (Hamilton's method:
    floors, then one more to the largest fractional parts, ties to the first)."""
    exact = weights * total / weights.sum()
    out = np.floor(exact).astype(np.int64)
    extra = total - int(out.sum())
    out[np.argsort(-(exact - out), kind="stable")[:extra]] += 1
    return out


def class_counts(images: int) -> np.ndarray:
    """Images per class for a train set of ``images``: the full counts scaled in proportion
    (every class keeps at least one image); ``images`` = 1,281,167 gives ``full_counts``."""
    if images < MIN_IMAGES:
        raise ValueError(f"--images {images}: at least {MIN_IMAGES} (every class keeps an image)")
    return largest_remainders(full_counts().astype(np.float64), images)


def val_count(images: int) -> int:
    """Validation images for a train set of ``images``: 50,000 scaled the same way, at least
    ``VAL_FLOOR``, at most 50,000."""
    return min(FULL_VAL, max(VAL_FLOOR, round(FULL_VAL * images / FULL_TRAIN)))


def quirk_pool(seed: int = 1) -> list[tuple[str, bytes]]:
    """One image of every quirk kind of the fake-set maker, at this input's sizes."""
    rng = np.random.default_rng(seed)
    return [(kind, make(synthetic_photo(rng, (int(rng.integers(*SIDES)),
                                              int(rng.integers(*SIDES))))))
            for kind, make in QUIRKS.items()]


def member(name: str, data: bytes) -> bytes:
    """One tar member: header, data, zero padding to the block."""
    return header_bytes(name, len(data)) + data + bytes(-len(data) % BLOCK)


def end_of_archive(pos: int) -> bytes:
    """The two zero blocks and the padding to a whole record that close a tar at ``pos``."""
    end = pos + 2 * BLOCK
    return bytes(2 * BLOCK + (-end % RECORD))


def class_members(wnid: str, ci: int, count: int, first: int, pool: Sequence[bytes],
                  quirks: Sequence[tuple[str, bytes]]) -> Iterator[tuple[str, bytes]]:
    """Class ``ci``'s images; ``first``: how many images came before it (picks pool bytes)."""
    for j in range(count):
        data = pool[(first + j) % len(pool)]
        if j == 1 and ci % 10 == 0:
            data = quirks[(ci // 10) % len(quirks)][1]
        yield f"{wnid}_{j + 1}.JPEG", data


def write_train(path: Path, counts: np.ndarray, wnids: Sequence[str], pool: Sequence[bytes],
                quirks: Sequence[tuple[str, bytes]]) -> int:
    """The outer tar of class tars (``<wnid>.tar`` in ``wnids``' order, ``counts`` images
    each), streamed one inner class tar at a time; returns its bytes."""
    done = 0
    with open(path, "wb") as f:
        for ci, (wnid, count) in enumerate(zip(wnids, counts.tolist(), strict=True)):
            inner = b"".join(member(n, d) for n, d in
                             class_members(wnid, ci, count, done, pool, quirks))
            inner += end_of_archive(len(inner))
            f.write(member(f"{wnid}.tar", inner))
            done += count
        f.write(end_of_archive(f.tell()))
        return f.tell()


def devkit_ids(table: ClassTable) -> dict[str, int]:
    """wnid -> devkit ID: the 2012 devkit's own (fixed) IDs, unrelated to sorted order (the
    ones ``imgprep make-sample`` writes, and ``map_clsloc.txt`` must agree with)."""
    return {w: i for i, w in devkit_map().items() if table.index(w) is not None}


def write_val(out: Path, count: int, table: ClassTable, pool: Sequence[bytes],
              quirks: Sequence[tuple[str, bytes]]) -> int:
    """The flat val tar of images 1 … ``count`` and their devkit ground truth (with
    ``map_clsloc.txt``); returns the tar's bytes."""
    with open(out / VAL_TAR, "wb") as f:
        for n in range(1, count + 1):
            data = quirks[n - 1][1] if n <= len(quirks) else pool[(7 * n) % len(pool)]
            f.write(member(f"ILSVRC2012_val_{n:08d}.JPEG", data))
        f.write(end_of_archive(f.tell()))
        size = f.tell()
    devkit = devkit_ids(table)
    names = {w: table.names[k].split(",")[0].replace(" ", "_") for k, w in enumerate(table.wnids)}
    (out / DEVKIT_MAP).write_text("".join(f"{w} {devkit[w]} {names[w]}\n" for w in
                                          sorted(table.wnids, key=devkit.__getitem__)))
    published = imagenet_val_labels()[:count].tolist()
    (out / GROUND_TRUTH).write_text("".join(f"{devkit[table.wnids[c]]}\n" for c in published))
    return size


def cached(folder: Path, want: dict[str, Any]) -> dict[str, Any] | None:
    """The marker of a finished input in ``folder`` that matches ``want``, else None."""
    try:
        have = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    same = all(have.get(k) == v for k, v in want.items())
    sizes_ok = all((folder / name).is_file() and (folder / name).stat().st_size == size
                   for name, size in have.get("bytes", {}).items())
    return have if same and sizes_ok else None


def make_input(out: Path, images: int) -> dict[str, Any]:
    """``<out>/input-<images>/`` holding the train and val tars and the devkit ground truth,
    made unless a matching one is there; returns its marker (paths, counts, bytes, the
    seconds it took to make, and ``cached``)."""
    folder = out / f"input-{images}"
    counts = class_counts(images)
    want = {"version": VERSION, "images": images, "val": val_count(images), "pool": POOL,
            "classes": CLASSES}
    have = cached(folder, want)
    if have is not None:
        return {**have, "folder": str(folder), "cached": True}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).unlink(missing_ok=True)
    t0 = time.perf_counter()
    table, pool, quirks = imagenet_classes(), jpeg_pool(POOL, SIDES), quirk_pool()
    train = write_train(folder / TRAIN_TAR, counts, table.wnids, pool, quirks)
    val = write_val(folder, want["val"], table, pool, quirks)
    marker = {**want, "seconds": time.perf_counter() - t0,
              "per_class": {"min": int(counts.min()), "max": int(counts.max()),
                            "at_max": int((counts == counts.max()).sum())},
              "quirks": [k for k, _ in quirks],
              "bytes": {TRAIN_TAR: train, VAL_TAR: val,
                        GROUND_TRUTH: (folder / GROUND_TRUTH).stat().st_size,
                        DEVKIT_MAP: (folder / DEVKIT_MAP).stat().st_size}}
    write_bytes_atomic(folder / MARKER, json.dumps(marker, sort_keys=True).encode())
    return {**marker, "folder": str(folder), "cached": False}
