"""Hugging Face ``datasets`` reads a conversion with its stock ``webdataset`` builder: every
key, label, image and metadata record intact, as many samples as the manifest says, with
nothing fetched from the network (offline, a cache of its own); and installing ``datasets``
left pillow-simd in place.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from imgprep.shards.manifest import read_manifest
from tests.support.shards import tar_samples


def shard_samples(folder: Path) -> dict[str, tuple[str, dict[str, bytes]]]:
    """key -> (shard, {ext: bytes}) for the train split, read with plain ``tarfile``."""
    return {key: (shard, exts) for shard, key, exts in tar_samples(folder)}


def test_datasets_webdataset_builder_reads_a_conversion_intact(
        hf_datasets: Any, converted: dict[str, Path], tmp_path: Path) -> None:
    folder = converted["shards"]
    m = read_manifest(folder, "train")
    shards = [str(folder / s.name) for s in m.shards]
    ds = hf_datasets.load_dataset("webdataset", data_files={"train": shards}, split="train",
                                  cache_dir=str(tmp_path / "hf" / "cache"))
    want = shard_samples(folder)
    assert len(ds) == m.total_samples == len(want)
    assert sorted(ds["__key__"]) == sorted(want)
    raw = ds.cast_column("jpg", hf_datasets.Image(decode=False))
    for row, undecoded in zip(ds, raw, strict=True):
        shard, fields = want[row["__key__"]]
        assert Path(row["__url__"]).name == shard
        assert row["cls"] == int(fields["cls"])
        assert row["json"] == json.loads(fields["json"])
        assert row["json"]["label"] == row["cls"]
        assert undecoded["jpg"]["bytes"] == fields["jpg"]
        img = row["jpg"]
        assert (img.mode, img.size) == ("RGB", (256, 256))
        with Image.open(io.BytesIO(fields["jpg"])) as ref:
            assert np.array_equal(np.asarray(img), np.asarray(ref))


def test_installing_datasets_left_pillow_simd_in_place() -> None:
    run = subprocess.run([sys.executable, "-m", "imgprep", "info", "--strict"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "pillow-simd" in run.stdout
