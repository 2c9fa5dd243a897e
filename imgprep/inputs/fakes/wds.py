"""A small faithful copy of a webdataset shard set of ImageNet, as timm publishes it
(``timm/imagenet-1k-wds``).

``imagenet1k-train-NNNN.tar`` and ``imagenet1k-validation-NNNN.tar``: plain tars whose
samples are ``<key>.jpg`` (the original JPEG), ``<key>.cls`` (the class index in sorted-wnid
order, ASCII) and ``<key>.json`` (``filename``: the original file name, ``label``,
``class_name``), members of a sample next to each other. The samples are spread over the
shards in a shuffled order, as in the published set.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from imgprep.fsutil import atomic_open, ensure_writable_dir
from imgprep.inputs.fakeset import FakeSummary, SampleSpec, sample_set
from imgprep.inputs.synsets import imagenet_classes
from imgprep.shards.tarfmt import tar_header

PREFIX = "imagenet1k"
SPLIT_NAMES = {"train": "train", "val": "validation"}
SHARDS = {"train": 3, "val": 2}


Sample = tuple[str, bytes, int, str, str]  # key, JPEG, label, original file name, class name


def shard_name(split: str, index: int) -> str:
    """``imagenet1k-train-0000.tar``, ``imagenet1k-validation-0000.tar``."""
    return f"{PREFIX}-{SPLIT_NAMES[split]}-{index:04d}.tar"


def sample_members(sample: Sample) -> list[tuple[str, bytes]]:
    """A sample's members in order: ``.jpg``, ``.cls``, ``.json``."""
    key, jpeg, label, filename, class_name = sample
    meta = {"filename": filename, "label": label, "class_name": class_name}
    return [(f"{key}.jpg", jpeg), (f"{key}.cls", str(label).encode()),
            (f"{key}.json", json.dumps(meta, sort_keys=True).encode())]


def shard_bytes(samples: Sequence[Sample]) -> bytes:
    """One plain tar of ``samples`` (imgprep's fixed headers)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for sample in samples:
            for name, data in sample_members(sample):
                tf.addfile(tar_header(name, len(data)), io.BytesIO(data))
    return buf.getvalue()


def write_split(folder: Path, split: str, samples: Sequence[Sample], shards: int = 2,
                seed: int = 0) -> list[Path]:
    """``samples`` of ``split`` (train or val), shuffled with ``seed``, as ``shards`` shard
    files in ``folder``; returns their paths."""
    ensure_writable_dir(folder)
    order = np.random.default_rng(seed).permutation(len(samples)).tolist()
    shuffled = [samples[i] for i in order]
    shards = max(1, min(shards, len(samples)))
    out = []
    for i in range(shards):
        path = folder / shard_name(split, i)
        with atomic_open(path) as f:
            f.write(shard_bytes(shuffled[i::shards]))
        out.append(path)
    return out


def write(out: Path, spec: SampleSpec) -> FakeSummary:
    """The fake set ``spec`` as a timm shard set in ``out`` (train and validation; a shard
    set has no test split)."""
    ss = sample_set(spec)
    table = imagenet_classes()
    samples: dict[str, list[Sample]] = {"train": [], "val": []}
    for it in ss.items():
        label = table.index(it.wnid)
        if it.split in samples and label is not None:
            samples[it.split].append((it.key, it.data, label, f"{it.key}.JPEG",
                                      table.names[label]))
    for split, split_samples in samples.items():
        if split_samples:
            write_split(out, split, split_samples, SHARDS[split], spec.seed)
    return FakeSummary(form="wds", out=str(out), classes=list(ss.wnids),
                       train_images=len(samples["train"]), val_images=len(samples["val"]),
                       test_images=0, quirks=ss.quirks(), bad=ss.bad(), inputs=[str(out)])
