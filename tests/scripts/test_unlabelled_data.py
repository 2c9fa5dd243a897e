"""The trainer refuses data it cannot train on because it has no labels: a --data folder
holding only the test split (converted with --split test), or an unlabelled train or val
split, naming the split and the command that converts one it can use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from imgprep import ManifestError
from imgprep.convert.options import ConvertOptions
from imgprep.convert.run import convert
from scripts.trainkit.data import refuse_unlabelled
from tests.support import REPO
from tests.support.cli import jpeg_tree


@pytest.fixture(scope="module")
def test_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("test-only")
    src = jpeg_tree(root / "test", {f"ILSVRC2012_test_{i:08d}.JPEG": i for i in (1, 2)})
    convert(ConvertOptions(input=src, out=root / "data", split="test"))
    return root / "data"


def test_a_folder_of_the_test_split_alone_is_refused(test_only: Path) -> None:
    with pytest.raises(ManifestError, match=r"holds only the test split \(test.json\), which "
                                            r"was converted without labels.*imgprep convert "
                                            r"ILSVRC2012_img_train.tar"):
        refuse_unlabelled(test_only)


def test_an_unlabelled_train_manifest_is_refused(test_only: Path, tmp_path: Path) -> None:
    """A manifest that says unlabelled under the train split's name (renamed by hand)."""
    data = tmp_path / "data"
    data.mkdir()
    m = json.loads((test_only / "test.json").read_text())
    (data / "train.json").write_text(json.dumps({**m, "split": "train"}))
    with pytest.raises(ManifestError, match=r"its train split \(train.json\) was converted "
                                            "without labels"):
        refuse_unlabelled(data)


@pytest.mark.slow
def test_the_trainer_exits_naming_the_unlabelled_split(test_only: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "train_imagenet.py"),
                           "--data", str(test_only), "--arch", "tiny", "--steps", "1",
                           "--workers", "0", "--timeout", "60"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode != 0
    assert "holds only the test split (test.json)" in done.stderr, done.stderr[-2000:]
