"""A converted folder, the one way the tests make one: a fake ILSVRC2012's train tar (and,
when asked, its val tar) converted into shards or a label list."""

from __future__ import annotations

from pathlib import Path

from imgprep.convert.options import ConvertOptions
from imgprep.convert.run import convert

TRAIN_TAR = "ILSVRC2012_img_train.tar"
VAL_TAR = "ILSVRC2012_img_val.tar"
VAL_TRUTH = "LOC_val_solution.csv"


def convert_sample(source: Path, out: Path, *, train_shards: int | None = None,
                   val_shards: int | None = None, fmt: str = "shards",
                   workers: int = 2) -> Path:
    """``source``'s train tar converted into ``out`` (``train_shards`` shards, or the default
    shard size; ``fmt="list"``: a label list) and, when ``val_shards`` is given, its val tar
    into ``val_shards`` shards labelled by its ``LOC_val_solution.csv``. Every image must
    convert; returns ``out``."""
    runs = [ConvertOptions(input=source / TRAIN_TAR, out=out, format=fmt,
                           num_shards=train_shards, workers=workers)]
    if val_shards is not None:
        runs.append(ConvertOptions(input=source / VAL_TAR, out=out, format=fmt,
                                   num_shards=val_shards, workers=workers,
                                   labels=(source / VAL_TRUTH,)))
    for opts in runs:
        summary = convert(opts)
        assert summary.complete and not summary.errors, summary
    return out
