"""Shard folders written directly with ``ShardWriter``, for the loader tests (unequal shards
whose every sample's label is its id, so coverage can be checked from labels alone), the same
samples as a label list, and shards read back with the standard ``tarfile`` module,
independently of imgprep."""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from imgprep.inputs.synsets import imagenet_classes
from imgprep.sections import ManifestOptions
from imgprep.shards.index import write_index
from imgprep.shards.manifest import Manifest, ShardEntry, read_manifest, write_manifest
from imgprep.shards.writers import ShardWriter

UNEQUAL_SIZES = (3, 7, 12, 5, 9, 4, 11, 6)  # samples per shard: deliberately unequal


def key_of(sample: int) -> str:
    """The key sample ``sample`` is stored under."""
    return f"n01440764_{sample:05d}"


def write_split(folder: Path, split: str, sizes: Sequence[int],
                image: Callable[[int], bytes]) -> dict[str, list[int]]:
    """Shards ``<split>-00000k.tar`` holding ``sizes[k]`` samples each (ids counted up from 0,
    label = id) and the split's manifest and index; returns each shard's sample ids."""
    entries, layouts, ids, sample = [], [], {}, 0
    for k, n in enumerate(sizes):
        name = f"{split}-{k:06d}.tar"
        ids[name] = list(range(sample, sample + n))
        with ShardWriter(folder / name) as w:
            for i in ids[name]:
                w.add(key_of(i), {"jpg": image(i), "cls": str(i).encode()})
        entries.append(ShardEntry(name, w.samples, w.bytes, w.sha256))
        layouts.append(w.layout())
        sample += n
    write_manifest(folder, Manifest(
        split=split, format="shards", total_samples=sample,
        classes=imagenet_classes().to_json(), mean=[0.485, 0.456, 0.406],
        std=[0.229, 0.224, 0.225], options=ManifestOptions(format="shards", split=split),
        tool_version="test", shards=entries,
        index=write_index(folder, split, entries, layouts)))
    return ids


def write_label_list(folder: Path, count: int, image: Callable[[int], bytes]) -> Path:
    """The same samples as ``write_split``'s as a label list: ``<folder>/train.txt`` of
    ``images/<i>.jpg <i>`` lines, the images beside it; its path."""
    (folder / "images").mkdir(parents=True)
    lines = []
    for i in range(count):
        (folder / "images" / f"{i}.jpg").write_bytes(image(i))
        lines.append(f"images/{i}.jpg {i}\n")
    (folder / "train.txt").write_text("".join(lines))
    return folder / "train.txt"


def tar_samples(folder: Path, split: str = "train") -> list[tuple[str, str, dict[str, bytes]]]:
    """(shard, key, {ext: bytes}) of every sample of ``split``, in manifest and tar order."""
    out: list[tuple[str, str, dict[str, bytes]]] = []
    for s in read_manifest(folder, split).shards:
        with tarfile.open(folder / s.name) as tf:
            for m in tf:
                f = tf.extractfile(m)
                assert f is not None, f"{s.name}: {m.name} is not a regular file"
                key, _, ext = m.name.partition(".")
                if not out or out[-1][:2] != (s.name, key):
                    out.append((s.name, key, {}))
                out[-1][2][ext] = f.read()
    return out


def run_epoch(loader: Any, epoch: int) -> list[Any]:
    """Every batch of ``epoch`` from a loader; the count must be the one ``len`` stated
    beforehand (DDP hangs on a rank that gets one batch more or fewer than it said)."""
    loader.set_epoch(epoch)
    stated = len(loader)
    batches = list(loader)
    assert len(batches) == stated, f"len() said {stated}, the epoch gave {len(batches)}"
    return batches
