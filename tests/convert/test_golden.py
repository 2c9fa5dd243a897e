"""The bytes of a conversion do not drift: the 1,000 real sample images converted into 4
shards give the shard and sample-index digests recorded when the package was laid out in
rooms. A change that alters them must be meant (a new format version), not a side effect
of moving code."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

GOLDEN = {
    "train-000000.tar": "28ac003dac15cd1b178987f0814307119d4fc40afa76d465335932a54db14ebf",
    "train-000001.tar": "35a021fad6f91e3b2de82f86c2ece6161c3485eb29194bd25b342e8c29bdeee2",
    "train-000002.tar": "0ba7f2df4d8a27591cf5a077f62cc3d73c17050518889ec0952b073efc8c35a7",
    "train-000003.tar": "33cfab4633cc0452c5fcfcbbcb21e43a8b9f2ed0c7fec179e0aed3b1e5a841d8",
    "train-index.bin": "2da913b79f7b6cd5483d951adefce4cd6984aee287ef1710476bad7eb9307336",
}


@pytest.mark.realdata
@pytest.mark.slow
def test_converting_the_real_sample_gives_the_recorded_bytes(real_data: Path,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "imgprep", "convert", str(real_data / "images"),
                          "-o", str(out), "--shards", "4", "-q"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    got = {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in GOLDEN}
    assert got == GOLDEN
