"""The kit's data, made on the machine itself (nothing to carry): a synthetic ILSVRC2012-shaped
train tar, and its conversion into shards on local disk.

- Input (``input-<N>/``): ``ILSVRC2012_img_train.tar``, an outer tar of per-class
  ``<wnid>.tar`` (up to 1,000 classes of ``imgprep.imagenet_classes``, spread over the table),
  each holding ``<wnid>_<n>.JPEG``; the images cycle a pool of synthetic photos of
  ImageNet-like size (333-500 px a side, ``imgprep.inputs.fakeset.jpeg_pool``), whose bytes
  are also kept as ``pool/NNNN.jpg`` for convert's floor. Tars are written with imgprep's
  fixed-header writer, one class at a time.
- Conversion (``data-<N>/``): ``python -m imgprep convert`` of that tar with a worker a core
  (the command line, as users run it): 256 px shards, a manifest and the sample index.

Both are made once per image count under the kit's work folder and reused while their marker
(``input.json``; the conversion's manifest) is there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from imgprep import imagenet_classes, manifest_path, write_bytes_atomic
from imgprep.inputs.fakeset import jpeg_pool
from imgprep.shards.writers import BLOCK, end_of_archive, header_bytes

from .machine import SAFE_PATH, child_env, cores
from .profile import Profile

TRAIN_TAR = "ILSVRC2012_img_train.tar"
HALF = "half"  # a folder holding the same train tar with half the images (convert's fixed cost)
MARKER = "input.json"
SIDES = (333, 500)  # ImageNet's typical sides (most images are 500 x 333..375)
PER_CLASS = 32  # at least this many images a class, up to 1,000 classes
VERSION = 2  # of what this module writes: a change here remakes every cached input


def _member(name: str, data: bytes) -> bytes:
    """One tar member: header, data, zero padding to the block."""
    return header_bytes(name, len(data)) + data + bytes(-len(data) % BLOCK)


def class_counts(images: int) -> list[int]:
    """Images per class: as many classes as give each at least ``PER_CLASS`` (at most 1,000),
    the remainder spread over the first ones."""
    classes = max(1, min(1000, images // PER_CLASS))
    per, extra = divmod(images, classes)
    return [per + (c < extra) for c in range(classes)]


def _classes(images: int, pool: Sequence[bytes]) -> Iterator[tuple[str, list[bytes]]]:
    table = imagenet_classes()
    counts = class_counts(images)
    step = len(table.wnids) // len(counts)
    done = 0
    for c, count in enumerate(counts):
        yield table.wnids[c * step], [pool[(done + j) % len(pool)] for j in range(count)]
        done += count


def write_train_tar(path: Path, images: int, pool: Sequence[bytes]) -> int:
    """The outer train tar, one inner class tar at a time; returns its bytes."""
    with open(path, "wb") as f:
        for wnid, blobs in _classes(images, pool):
            inner = b"".join(_member(f"{wnid}_{j + 1}.JPEG", b) for j, b in enumerate(blobs))
            f.write(_member(f"{wnid}.tar", inner + end_of_archive(len(inner))))
        f.write(end_of_archive(f.tell()))
        return f.tell()


def make_input(work: Path, profile: Profile) -> Path:
    """``<work>/input-<N>/``: the train tar, the same with half the images (in ``HALF``) and
    the pool, made unless a matching one is there."""
    folder = work / f"input-{profile.images}"
    want = {"version": VERSION, "images": profile.images, "pool": profile.pool}
    marker = folder / MARKER
    try:
        if json.loads(marker.read_text()) == want:
            return folder
    except (OSError, ValueError):
        pass  # not made yet, or made by other code: made again below
    (folder / "pool").mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    pool = jpeg_pool(profile.pool, SIDES)
    for i, blob in enumerate(pool):
        (folder / "pool" / f"{i:04d}.jpg").write_bytes(blob)
    write_train_tar(folder / TRAIN_TAR, profile.images, pool)
    (folder / HALF).mkdir(exist_ok=True)
    write_train_tar(folder / HALF / TRAIN_TAR, profile.images // 2, pool)
    write_bytes_atomic(marker, json.dumps(want, sort_keys=True).encode())
    return folder


def pool_blobs(folder: Path, count: int) -> list[bytes]:
    """``count`` images of the input's pool, cycled: the floor's preloaded bytes."""
    pool = [p.read_bytes() for p in sorted((folder / "pool").glob("*.jpg"))]
    return [pool[i % len(pool)] for i in range(count)]


def converted(work: Path, profile: Profile, timeout_s: float) -> Path:
    """``<work>/data-<N>/``: the input converted by ``python -m imgprep convert`` with a
    worker a core, unless its manifest is there already."""
    out = work / f"data-{profile.images}"
    if manifest_path(out, "train").is_file():
        return out
    tar = make_input(work, profile) / TRAIN_TAR
    cmd = [sys.executable, *SAFE_PATH, "-m", "imgprep", "convert", str(tar), "-o", str(out),
           "--workers", str(cores()), "--json", "-q"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                          env=child_env())
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: "
                           f"{done.stderr.strip()[-800:]}")
    return out
