"""Write a small fake ILSVRC2012 in the real layout, with the real data set's quirks.

``ILSVRC2012_img_train.tar`` (an outer tar of per-class ``<wnid>.tar``), ``ILSVRC2012_img_val.tar``
(flat ``ILSVRC2012_val_%08d.JPEG``), and validation ground truth in the devkit form
(``ILSVRC2012_validation_ground_truth.txt`` + ``map_clsloc.txt``, the devkit's own IDs, not the
sorted order), plus Caffe's ``val.txt`` and Kaggle's ``LOC_val_solution.csv``. The validation images
are named after the first published validation images of the sample's classes and carry their
published class (``imgprep.inputs.synsets.imagenet_val_labels``), so the ground truth
passes convert's check against the published labels; the devkit file, like the real one,
has a line for every image from 1 up to the last one named. Images are synthetic
(gradients, shapes and noise), deterministic for a seed, and include grayscale, CMYK, a PNG and a
palette PNG named ``.JPEG``, 16-bit, EXIF-rotated and large (draft-mode) images; ``bad=True``
adds a truncated JPEG and a zero-byte file to the train set.
"""

from __future__ import annotations

import io
import itertools
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from imgprep.errors import SourceFormatError
from imgprep.fsutil import atomic_open, ensure_writable_dir, write_bytes_atomic
from imgprep.inputs.devkit import devkit_map
from imgprep.inputs.synsets import ClassTable, imagenet_classes, imagenet_val_labels
from imgprep.shards.tarfmt import tar_header

SIZES = ((500, 375), (375, 500), (500, 333), (500, 500), (640, 480), (1600, 1200), (120, 90))


def class_tint(index: int, count: int) -> np.ndarray:
    """A colour per class (hues spread around the wheel): what makes the classes learnable."""
    hue = index / max(count, 1)
    rgb = Image.new("HSV", (1, 1), (int(hue * 255), 200, 220)).convert("RGB").getpixel((0, 0))
    return np.asarray(rgb, dtype=np.float32)


def synthetic_photo(rng: np.random.Generator, size: tuple[int, int],
                    tint: np.ndarray | None = None) -> Image.Image:
    """An RGB image with smooth gradients, a few shapes and sensor-like noise; with ``tint``,
    its background leans to that colour (so a small net can tell the classes apart)."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    if tint is not None:
        c0, c1 = 0.75 * tint + 0.25 * c0, 0.75 * tint + 0.25 * c1
    t = (x / max(w - 1, 1) * rng.uniform(0.2, 1) + y / max(h - 1, 1) * rng.uniform(0.2, 1)) / 2
    arr = c0 * (1 - t[..., None]) + c1 * t[..., None]
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 8))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1 = x0 + int(rng.integers(w // 10 + 1, w // 2 + 2))
        y1 = y0 + int(rng.integers(h // 10 + 1, h // 2 + 2))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=fill)
    noise = rng.normal(0, 6, (h, w, 3))
    out = np.clip(np.asarray(img, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(out, "RGB")


def jpeg_pool(count: int, sides: tuple[int, int], seed: int = 0) -> list[bytes]:
    """``count`` distinct small synthetic JPEGs (quality 85, each side drawn from ``sides``),
    for large fake sets that cycle a few thousand encoded images instead of encoding each."""
    rng = np.random.default_rng(seed)
    pool = []
    for _ in range(count):
        w, h = (int(x) for x in rng.integers(sides[0], sides[1] + 1, 2))
        pool.append(_jpeg(synthetic_photo(rng, (w, h)), quality=85))
    return pool


def _jpeg(img: Image.Image, **kw: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=kw.pop("quality", 88), **kw)
    return buf.getvalue()


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def _exif_rotated(img: Image.Image) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6
    return _jpeg(img, exif=exif.tobytes())


def _sixteen_bit(img: Image.Image) -> bytes:
    arr = (np.asarray(img.convert("L"), dtype=np.uint16) * 257).astype(np.uint16)
    return _png(Image.fromarray(arr))  # uint16 → mode I;16


QUIRKS: dict[str, Callable[[Image.Image], bytes]] = {
    "grayscale": lambda im: _jpeg(im.convert("L")),
    "cmyk": lambda im: _jpeg(im.convert("CMYK")),
    "png_rgba": lambda im: _png(im.convert("RGBA")),
    "palette_png": lambda im: _png(im.convert("P", palette=Image.Palette.ADAPTIVE)),
    "sixteen_bit": _sixteen_bit,
    "exif_rotated": _exif_rotated,
    "progressive_444": lambda im: _jpeg(im, progressive=True, subsampling=0),
}
BAD: dict[str, Callable[[Image.Image], bytes]] = {
    "truncated": lambda im: _jpeg(im)[:2000],
    "zero_bytes": lambda im: b"",
}


def pick_classes(table: ClassTable, n: int) -> list[str]:
    """``n`` wnids spread evenly over the table (deterministic)."""
    step = max(1, len(table) // n)
    return [table.wnids[i * step] for i in range(n)]


def val_numbers(table: ClassTable, wnids: list[str], count: int) -> list[int]:
    """The first ``count`` numbers n (1-based, ascending) of ``ILSVRC2012_val_%08d`` images whose
    published class is one of ``wnids``; refused when those classes have fewer."""
    chosen = [i for i in (table.index(w) for w in wnids) if i is not None]
    numbers = (np.flatnonzero(np.isin(imagenet_val_labels(), chosen)) + 1).tolist()
    if count > len(numbers):
        raise SourceFormatError(
            f"--val {count} is more than the {len(numbers)} published validation images of the "
            f"sample's {len(wnids)} classes; pass --val {len(numbers)} or fewer, or more --classes")
    return [int(n) for n in numbers[:count]]


def _tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            tf.addfile(tar_header(name, len(data)), io.BytesIO(data))
    return buf.getvalue()


def _write_ground_truth(out: Path, table: ClassTable, published: np.ndarray,
                        truth: list[tuple[int, str]], last: int) -> None:
    """The validation ground truth in three of its forms: the devkit's (with its own
    ``map_clsloc.txt``), Caffe's ``val.txt`` and Kaggle's ``LOC_val_solution.csv``."""
    # Devkit IDs are the devkit's own (fixed) ones, unrelated to sorted-wnid order.
    devkit = {w: i for i, w in devkit_map().items()}
    write_bytes_atomic(out / "map_clsloc.txt", "".join(
        f"{w} {devkit[w]} {table.names[k].split(',')[0].replace(' ', '_')}\n"
        for k, w in sorted(enumerate(table.wnids), key=lambda kw: devkit[kw[1]])).encode())
    # The devkit form is one line per image in number order: every image up to the last one.
    write_bytes_atomic(out / "ILSVRC2012_validation_ground_truth.txt", "".join(
        f"{devkit[table.wnids[c]]}\n" for c in published[:last].tolist()).encode())
    write_bytes_atomic(out / "val.txt", "".join(
        f"ILSVRC2012_val_{n:08d}.JPEG {table.index(w)}\n" for n, w in truth).encode())
    write_bytes_atomic(out / "LOC_val_solution.csv", kaggle_val_csv(truth))


def kaggle_val_csv(truth: list[tuple[int, str]]) -> bytes:
    """Kaggle's ``LOC_val_solution.csv`` of (number, wnid) pairs: a box per image."""
    return ("ImageId,PredictionString\n" + "".join(
        f"ILSVRC2012_val_{n:08d},{w} 1 2 3 4\n" for n, w in truth)).encode()


@dataclass(frozen=True, kw_only=True)
class SampleSpec:
    """How big a fake set to make: ``classes`` × ``per_class`` train images, ``val``
    validation images, ``test`` unlabelled test images (0 for the image-net.org form);
    ``bad`` adds a truncated JPEG and a zero-byte file to the train set."""

    classes: int = 10
    per_class: int = 12
    val: int = 50
    seed: int = 0
    bad: bool = False
    test: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.classes <= 1000 or self.per_class < 1 or self.val < 0 or self.test < 0:
            raise ValueError("classes must be 1..1000, per_class >= 1, val and test >= 0")


@dataclass(frozen=True, kw_only=True)
class FakeSummary:
    """What a fake-set writer wrote (``imgprep make-sample --json`` prints its ``asdict``):
    the form, the folder, the classes (wnids), the image counts, the quirks and faults the
    train and val images carry, and the paths a user would convert (``inputs``); the
    image-net.org form also names its two archives (``train_tar``, ``val_tar``)."""

    form: str
    out: str
    classes: list[str]
    train_images: int
    val_images: int
    test_images: int
    quirks: list[str]
    bad: list[str]
    inputs: list[str]
    train_tar: str | None = None
    val_tar: str | None = None


@dataclass(frozen=True)
class SampleItem:
    """One image of the fake set: its split, key (the stem every form names it by), class
    (empty for test), bytes, and the quirk or fault it carries (None: a plain JPEG)."""

    split: str
    key: str
    wnid: str
    data: bytes
    kind: str | None = None


@dataclass(frozen=True)
class SampleSet:
    """What a fake set holds, known before any image is made; ``items()`` makes the images
    (the same bytes for the same spec), train (class by class), then val, then test."""

    spec: SampleSpec
    wnids: tuple[str, ...]
    truth: tuple[tuple[int, str], ...]  # (validation image number, its published wnid)
    train_kinds: tuple[tuple[str | None, ...], ...]  # per class, per image

    def items(self) -> Iterator[SampleItem]:
        rng = np.random.default_rng(self.spec.seed)
        makers = {**QUIRKS, **BAD}

        def image(kind: str | None, ci: int) -> bytes:
            size = SIZES[int(rng.integers(0, len(SIZES)))]
            img = synthetic_photo(rng, size, class_tint(ci, len(self.wnids)))
            return _jpeg(img) if kind is None else makers[kind](img)

        for ci, (wnid, kinds) in enumerate(zip(self.wnids, self.train_kinds, strict=True)):
            for j, kind in enumerate(kinds):
                yield SampleItem("train", f"{wnid}_{1000 + j}", wnid, image(kind, ci), kind)
        # Every quirk appears in the validation set too; each image is named after a
        # published validation image of its class.
        val_quirks = list(QUIRKS)
        for i, (number, wnid) in enumerate(self.truth):
            kind = val_quirks[i] if i < len(val_quirks) else None
            yield SampleItem("val", f"ILSVRC2012_val_{number:08d}", wnid,
                             image(kind, self.wnids.index(wnid)), kind)
        for k in range(self.spec.test):
            ci = int(rng.integers(0, len(self.wnids)))
            yield SampleItem("test", f"ILSVRC2012_test_{k + 1:08d}", "", image(None, ci))

    def quirks(self) -> list[str]:
        train = [k for kinds in self.train_kinds for k in kinds if k in QUIRKS]
        return train + [f"val:{k}" for k in list(QUIRKS)[:self.spec.val]]

    def bad(self) -> list[str]:
        return [f"{w}_{1000 + j}.JPEG: {k}" for w, kinds in zip(self.wnids, self.train_kinds,
                                                                 strict=True)
                for j, k in enumerate(kinds) if k in BAD]


def sample_set(spec: SampleSpec) -> SampleSet:
    """The fake set ``spec`` describes (refused when its classes have too few published
    validation images for ``spec.val``)."""
    table = imagenet_classes()
    wnids = pick_classes(table, spec.classes)
    quirk_cycle = list(QUIRKS)
    kinds: list[tuple[str | None, ...]] = []
    for ci in range(len(wnids)):
        row: list[str | None] = []
        for j in range(spec.per_class):
            if spec.bad and ci == len(wnids) - 1 and j < len(BAD):
                row.append(list(BAD)[j])
            elif j == 1 and ci < len(quirk_cycle):
                row.append(quirk_cycle[ci])
            else:
                row.append(None)
        kinds.append(tuple(row))
    published = imagenet_val_labels()
    truth = tuple((n, table.wnids[published[n - 1]])
                  for n in val_numbers(table, wnids, spec.val))
    return SampleSet(spec, tuple(wnids), truth, tuple(kinds))


def write_ground_truth(out: Path, ss: SampleSet) -> None:
    """The validation ground truth of ``ss`` in the forms image-net.org, Caffe and Kaggle
    give it, in ``out``."""
    table = imagenet_classes()
    last = ss.truth[-1][0] if ss.truth else 0
    _write_ground_truth(out, table, imagenet_val_labels(), list(ss.truth), last)


def make_sample(out: Path, classes: int = 10, per_class: int = 12, val: int = 50,
                seed: int = 0, bad: bool = False) -> FakeSummary:
    """Write the fake data set in the image-net.org form into ``out``; returns what was
    written."""
    ss = sample_set(SampleSpec(classes=classes, per_class=per_class, val=val, seed=seed,
                               bad=bad))
    ensure_writable_dir(out)
    items = ss.items()
    train_path = out / "ILSVRC2012_img_train.tar"
    with atomic_open(train_path) as f, tarfile.open(fileobj=f, mode="w",
                                                    format=tarfile.USTAR_FORMAT) as outer:
        for wnid in ss.wnids:
            inner = _tar_bytes([(f"{it.key}.JPEG", it.data)
                                for it in itertools.islice(items, per_class)])
            outer.addfile(tar_header(f"{wnid}.tar", len(inner)), io.BytesIO(inner))
    val_members = [(f"{it.key}.JPEG", it.data) for it in itertools.islice(items, len(ss.truth))]
    val_path = out / "ILSVRC2012_img_val.tar"
    write_bytes_atomic(val_path, _tar_bytes(val_members))
    write_ground_truth(out, ss)
    return FakeSummary(
        form="ilsvrc", out=str(out), classes=list(ss.wnids), train_images=classes * per_class,
        val_images=val, test_images=0, quirks=ss.quirks(), bad=ss.bad(),
        inputs=[str(train_path), str(val_path)], train_tar=str(train_path),
        val_tar=str(val_path))
