"""Augmented loader batches in a stock-Pillow environment equal this one's: the wheel as a user
installs it (``make wheel-check``, which ``make test`` runs before pytest, leaves it in
``build/wheel-check/venv``: torch, stock Pillow 13 and the wheel of this tree) makes whole
shard-loader epochs with each policy, and their digests equal the ones made here (pillow-simd's
development environment). Decoding, resampling and the ops run in the extension on both sides;
Pillow decodes only the PNGs, whose pixels no Pillow build changes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from imgprep import World, jpegcrop
from loaders import LoaderOptions, ShardLoader, TrainTransform, augment_policy
from tests.loaders.test_augment_loader import image
from tests.support.paths import REPO
from tests.support.shards import UNEQUAL_SIZES, write_split

pytestmark = pytest.mark.skipif(not jpegcrop.AVAILABLE,
                                reason=f"crop-aware decoder: {jpegcrop.status()}")

STOCK = REPO / "build" / "wheel-check" / "venv" / "bin" / "python"
POLICIES = ("ta_wide", "rand-m9-mstd0.5-inc1", "aa-imagenet")
# Run by the stock environment's Python, outside the repository, PYTHONPATH unset: imgprep and
# loaders are the wheel's. Prints {policy: [batch digests]} and the Pillow it ran on.
EPOCHS = """import hashlib, json, sys
from imgprep import World
from imgprep.shards.info import pil_info
from loaders import LoaderOptions, ShardLoader, TrainTransform, augment_policy
folder, names = sys.argv[1], sys.argv[2:]
out = {"simd": pil_info(False).pillow_simd}
for name in names:
    t = TrainTransform(size=40, augment=augment_policy(name))
    ld = ShardLoader(folder, "train", World(), LoaderOptions(batch_size=4, workers=0, seed=5,
                                                             transform=t))
    ld.set_epoch(2)
    out[name] = [hashlib.blake2b(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()
                 for x, y in ld]
print(json.dumps(out))
"""


def digests(folder: Path, name: str) -> list[str]:
    t = TrainTransform(size=40, augment=augment_policy(name))
    ld = ShardLoader(folder, "train", World(), LoaderOptions(batch_size=4, workers=0, seed=5,
                                                             transform=t))
    ld.set_epoch(2)
    return [hashlib.blake2b(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()
            for x, y in ld]


def test_augmented_epochs_in_the_wheels_stock_pillow_env_equal_these(
        tmp_path: Path) -> None:
    if not STOCK.exists():
        why = f"{STOCK} is absent: make wheel-check makes it (make test runs it first)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    folder = tmp_path / "shards"
    folder.mkdir()
    write_split(folder, "train", UNEQUAL_SIZES, image)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(STOCK), "-c", EPOCHS, str(folder), *POLICIES], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.splitlines()[-1])
    assert theirs["simd"] is False  # stock Pillow there
    for name in POLICIES:
        mine = digests(folder, name)
        assert len(mine) == len(theirs[name]) > 0, name
        assert mine == theirs[name], name
