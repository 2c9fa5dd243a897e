"""A small faithful copy of the Hugging Face Hub's older ImageNet form: tar.gz archives.

``data/train_images_{0..4}.tar.gz``, ``data/val_images.tar.gz`` and
``data/test_images.tar.gz``: gzip-compressed tars of flat members named
``<stem>_<wnid>.JPEG`` (``n01440764_10026_n01440764.JPEG``,
``ILSVRC2012_val_00000001_n01751748.JPEG``), the test split's ``<stem>.JPEG``
(``ILSVRC2012_test_00000001.JPEG``). The same members give the same bytes (the gzip header
carries no time or name).
"""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Sequence
from pathlib import Path

from imgprep.fsutil import atomic_open, ensure_writable_dir
from imgprep.inputs.fakeset import FakeSummary, SampleSpec, sample_set
from imgprep.shards.tarfmt import tar_header

TRAIN_ARCHIVES = 5
Member = tuple[str, bytes]  # member name, bytes


def member_name(key: str, wnid: str, split: str) -> str:
    """An image's member name: its stem and class (the test split's: its stem alone)."""
    return f"{key}.JPEG" if split == "test" else f"{key}_{wnid}.JPEG"


def archive_names(split: str, count: int) -> list[str]:
    """The archives of ``split`` as on the Hub (train: up to five, numbered from 0)."""
    if split == "train":
        return [f"train_images_{i}.tar.gz" for i in range(count)]
    return [f"{split}_images.tar.gz"]


def targz_bytes(members: Sequence[Member]) -> bytes:
    """A gzip-compressed tar of ``members`` (imgprep's fixed headers, gzip time 0)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            tf.addfile(tar_header(name, len(data)), io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def write_split(data: Path, split: str, members: Sequence[Member]) -> list[Path]:
    """``members`` of ``split`` as the Hub's archives in the folder ``data`` (train spread
    over five archives); returns their paths."""
    ensure_writable_dir(data)
    count = TRAIN_ARCHIVES if split == "train" else 1
    out = []
    for i, name in enumerate(archive_names(split, count)):
        path = data / name
        with atomic_open(path) as f:
            f.write(targz_bytes(members[i::count]))
        out.append(path)
    return out


def write(out: Path, spec: SampleSpec) -> FakeSummary:
    """The fake set ``spec`` as the Hub's tar.gz archives, downloaded into ``out``
    (``out/data/*.tar.gz``)."""
    ss = sample_set(spec)
    members: dict[str, list[Member]] = {"train": [], "val": [], "test": []}
    for it in ss.items():
        members[it.split].append((member_name(it.key, it.wnid, it.split), it.data))
    for split, split_members in members.items():
        if split_members:
            write_split(out / "data", split, split_members)
    return FakeSummary(form="hf-targz", out=str(out), classes=list(ss.wnids),
                       train_images=len(members["train"]), val_images=len(members["val"]),
                       test_images=len(members["test"]), quirks=ss.quirks(), bad=ss.bad(),
                       inputs=[str(out)])
