"""A small faithful copy of the Hugging Face Hub's parquet ImageNet (``ILSVRC/imagenet-1k``).

``data/{train,validation,test}-NNNNN-of-NNNNN.parquet``, each with the columns ``image``
(struct ``bytes`` binary, ``path`` string: the name the image had in the Hub's older tar.gz
archives, ``<stem>_<wnid>.JPEG``, or ``<stem>.JPEG`` in the test split) and ``label`` (int64,
sorted-wnid order, -1 in the test split), and the ``huggingface`` schema metadata that the
``datasets`` library writes: the features, with the 1000 class names of the ``ClassLabel``
(unique, as ``datasets`` requires: a repeated name gets a number, e.g. the second 'crane').
Row groups are small here, so that every file has several.

pyarrow is the ``parquet`` extra: without it this writer is refused naming the extra.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from imgprep.fsutil import atomic_open, ensure_writable_dir
from imgprep.inputs.fakeset import FakeSummary, SampleSpec, sample_set
from imgprep.inputs.parquetio import TEST_LABEL, pyarrow_parquet
from imgprep.inputs.synsets import ClassTable, imagenet_classes

ROWS_PER_GROUP = 4
FILES = {"train": 3, "val": 2, "test": 1}
SPLIT_FILE_NAMES = {"train": "train", "val": "validation", "test": "test"}
Row = tuple[str, bytes, int]  # image.path, image.bytes, label


def hub_class_names(classes: ClassTable) -> list[str]:
    """The ``ClassLabel`` names: the class table's, a repeated one numbered from 2."""
    seen: dict[str, int] = {}
    out = []
    for name in classes.names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}{seen[name]}")
    return out


def hub_metadata(names: Sequence[str]) -> bytes:
    """The ``huggingface`` schema metadata of a dataset of ``Image`` and ``ClassLabel``."""
    features = {"image": {"_type": "Image"},
                "label": {"names": list(names), "_type": "ClassLabel"}}
    return json.dumps({"info": {"features": features}}).encode()


def hub_path(key: str, wnid: str, split: str) -> str:
    """An image's ``image.path``: its name in the Hub's tar.gz archives."""
    return f"{key}.JPEG" if split == "test" else f"{key}_{wnid}.JPEG"


def write_parquet(path: Path, rows: Sequence[Row], names: Sequence[str] | None,
                  rows_per_group: int = ROWS_PER_GROUP) -> None:
    """One parquet file of ``rows`` in the Hub's schema (``names``: its class names, or
    None for a file without Hugging Face metadata), written atomically."""
    pq = pyarrow_parquet(path)
    import pyarrow as pa

    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("image", image_type), ("label", pa.int64())],
                       metadata={b"huggingface": hub_metadata(names)} if names else None)
    table = pa.table({
        "image": pa.array([{"bytes": b, "path": p} for p, b, _ in rows], type=image_type),
        "label": pa.array([label for _, _, label in rows], type=pa.int64()),
    }, schema=schema)
    with atomic_open(path) as f:
        pq.write_table(table, f, row_group_size=rows_per_group)


def write_split(data: Path, split: str, rows: Sequence[Row], names: Sequence[str] | None,
                files: int = 2) -> list[Path]:
    """``rows`` of ``split`` (train, val or test) as ``files`` parquet files named as on the
    Hub (``train-00000-of-00002.parquet``) in the folder ``data``; returns their paths."""
    ensure_writable_dir(data)
    stem = SPLIT_FILE_NAMES[split]
    files = max(1, min(files, len(rows)))
    out = []
    for i in range(files):
        path = data / f"{stem}-{i:05d}-of-{files:05d}.parquet"
        write_parquet(path, rows[i::files], names)
        out.append(path)
    return out


def write(out: Path, spec: SampleSpec) -> FakeSummary:
    """The fake set ``spec`` as the Hub's parquet copy, downloaded into ``out``
    (``out/data/*.parquet``)."""
    ss = sample_set(spec)
    table = imagenet_classes()
    rows: dict[str, list[Row]] = {"train": [], "val": [], "test": []}
    for it in ss.items():
        label = TEST_LABEL if it.split == "test" else table.index(it.wnid)
        rows[it.split].append((hub_path(it.key, it.wnid, it.split), it.data,
                               TEST_LABEL if label is None else label))
    names = hub_class_names(table)
    for split, split_rows in rows.items():
        if split_rows:
            write_split(out / "data", split, split_rows, names, FILES[split])
    return FakeSummary(form="hf-parquet", out=str(out), classes=list(ss.wnids),
                       train_images=len(rows["train"]), val_images=len(rows["val"]),
                       test_images=len(rows["test"]), quirks=ss.quirks(), bad=ss.bad(),
                       inputs=[str(out)])
