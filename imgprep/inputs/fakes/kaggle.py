"""The fake set as Kaggle ships it: ``imagenet-object-localization-challenge.zip``, or the
tree it extracts to.

``ILSVRC/Data/CLS-LOC/{train/<wnid>/,val/,test/}`` images, an XML box for every val image
and every other train image under ``ILSVRC/Annotations/CLS-LOC`` (named like the images, as
in the real download), the ``ILSVRC/ImageSets/CLS-LOC`` lists, and ``LOC_val_solution.csv``,
``LOC_synset_mapping.txt``, ``LOC_train_solution.csv``, ``LOC_sample_submission.csv`` at the
root. In the zip, images are deflated except every third, which is stored (both codecs of
the real archives), with fixed times, so the same spec gives the same bytes.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path

from imgprep.fsutil import atomic_open, ensure_writable_dir, write_bytes_atomic
from imgprep.inputs.fakeset import (
    FakeSummary,
    SampleSet,
    SampleSpec,
    kaggle_val_csv,
    sample_set,
)
from imgprep.inputs.forms.kagglezip import ZIP_NAME
from imgprep.inputs.synsets import imagenet_classes

DATA, BOXES, LISTS = "ILSVRC/Data/CLS-LOC", "ILSVRC/Annotations/CLS-LOC", "ILSVRC/ImageSets/CLS-LOC"
WHEN = (2019, 1, 1, 0, 0, 0)
STORED_EVERY = 3


def _box(key: str, wnid: str) -> bytes:
    return (f"<annotation><folder>{wnid or 'val'}</folder><filename>{key}</filename>"
            f"<size><width>500</width><height>375</height><depth>3</depth></size><object>"
            f"<name>{wnid}</name><bndbox><xmin>1</xmin><ymin>2</ymin><xmax>3</xmax>"
            "<ymax>4</ymax></bndbox></object></annotation>\n").encode()


def _small_files(ss: SampleSet) -> Iterator[tuple[str, bytes]]:
    table = imagenet_classes()
    train = [(w, f"{w}_{1000 + j}") for w, kinds in zip(ss.wnids, ss.train_kinds, strict=True)
             for j in range(len(kinds))]
    yield "LOC_sample_submission.csv", ("ImageId,PredictionString\n" + "".join(
        f"ILSVRC2012_test_{k + 1:08d},{ss.wnids[0]} 1 2 3 4\n"
        for k in range(ss.spec.test))).encode()
    yield "LOC_synset_mapping.txt", table.to_text().encode()
    yield "LOC_train_solution.csv", ("ImageId,PredictionString\n" + "".join(
        f"{key},{w} 1 2 3 4\n" for k, (w, key) in enumerate(train) if k % 2 == 0)).encode()
    yield "LOC_val_solution.csv", kaggle_val_csv(list(ss.truth))
    yield f"{LISTS}/train_cls.txt", "".join(
        f"{w}/{key} {k + 1}\n" for k, (w, key) in enumerate(train)).encode()
    yield f"{LISTS}/val.txt", "".join(
        f"ILSVRC2012_val_{n:08d} {k + 1}\n" for k, (n, _) in enumerate(ss.truth)).encode()
    yield f"{LISTS}/test.txt", "".join(
        f"ILSVRC2012_test_{k + 1:08d} {k + 1}\n" for k in range(ss.spec.test)).encode()


def entries(ss: SampleSet) -> Iterator[tuple[str, bytes, bool]]:
    """(name, bytes, is an image) of every file of the Kaggle layout, small files first."""
    for name, data in _small_files(ss):
        yield name, data, False
    train_seen = 0
    for it in ss.items():
        if it.split == "train":
            yield f"{DATA}/train/{it.wnid}/{it.key}.JPEG", it.data, True
            if train_seen % 2 == 0:
                yield f"{BOXES}/train/{it.wnid}/{it.key}.xml", _box(it.key, it.wnid), False
            train_seen += 1
        elif it.split == "val":
            yield f"{DATA}/val/{it.key}.JPEG", it.data, True
            yield f"{BOXES}/val/{it.key}.xml", _box(it.key, it.wnid), False
        else:
            yield f"{DATA}/test/{it.key}.JPEG", it.data, True


def _summary(ss: SampleSet, out: Path, form: str, inputs: list[Path]) -> FakeSummary:
    return FakeSummary(form=form, out=str(out), classes=list(ss.wnids),
                       train_images=ss.spec.classes * ss.spec.per_class,
                       val_images=len(ss.truth), test_images=ss.spec.test, quirks=ss.quirks(),
                       bad=ss.bad(), inputs=[str(p) for p in inputs])


def write_tree(out: Path, spec: SampleSpec) -> FakeSummary:
    """The extracted download, in ``out``."""
    ss = sample_set(spec)
    ensure_writable_dir(out)
    for name, data, _ in entries(ss):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(out / name, data)
    return _summary(ss, out, "kaggle", [out])


def write_zip(out: Path, spec: SampleSpec) -> FakeSummary:
    """The download as it comes: ``out/imagenet-object-localization-challenge.zip``."""
    ss = sample_set(spec)
    ensure_writable_dir(out)
    path = out / ZIP_NAME
    folders: set[str] = set()
    images = 0
    with atomic_open(path) as f, zipfile.ZipFile(f, "w") as zf:
        for name, data, is_image in entries(ss):
            parts = name.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                folder = "/".join(parts[:depth]) + "/"
                if folder not in folders:
                    folders.add(folder)
                    zf.writestr(_info(folder, 0o40755), b"")
            stored = is_image and images % STORED_EVERY == STORED_EVERY - 1
            images += is_image
            zf.writestr(_info(name, 0o100644), data,
                        compress_type=zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
    return _summary(ss, out, "kaggle-zip", [path])


def _info(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=WHEN)
    info.create_system = 3
    info.external_attr = mode << 16
    return info
