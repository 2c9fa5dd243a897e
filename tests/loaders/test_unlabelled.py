"""A split converted without labels (``imgprep convert --split test``) cannot be trained or
validated on: the loaders refuse it, naming the split and what to load instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgprep.convert.options import ConvertOptions
from imgprep.convert.run import convert
from imgprep.job.world import World
from loaders import LoaderError, LoaderOptions, ShardLoader, make_loader
from tests.support.cli import jpeg_tree


@pytest.fixture(scope="module")
def unlabelled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three ILSVRC2012_test_* images converted with --split test, as shards and as a list."""
    root = tmp_path_factory.mktemp("unlabelled")
    src = jpeg_tree(root / "test", {f"ILSVRC2012_test_{i:08d}.JPEG": i for i in (1, 2, 3)})
    for fmt in ("shards", "list"):
        convert(ConvertOptions(input=src, out=root / fmt, split="test", format=fmt))
    return {fmt: root / fmt for fmt in ("shards", "list")}


@pytest.mark.parametrize("fmt", ["shards", "list"])
def test_make_loader_refuses_an_unlabelled_split(unlabelled: dict[str, Path], fmt: str) -> None:
    with pytest.raises(LoaderError, match=r"test.json: the test split was converted without "
                                          r"labels .*train on the train split and validate on val"):
        make_loader(unlabelled[fmt], "test", World(), LoaderOptions(batch_size=2, workers=0))


def test_the_shard_loader_refuses_an_unlabelled_split(unlabelled: dict[str, Path]) -> None:
    with pytest.raises(LoaderError, match=r"the test split was converted without labels"):
        ShardLoader(unlabelled["shards"], "test", World(), LoaderOptions(batch_size=2, workers=0))
