"""The bytes of a conversion do not drift: the 1,000 real sample images converted into 4
shards give the shard and sample-index digests recorded for each transform version. A change
that alters them must be meant (a new transform or format version), not a side effect of
moving code. Nor does the set converted: every real original reads whole, without a libjpeg
warning, so the damage rules (docs/convert.md) refuse and list none of them.

Version 2 (the C path) gives the same bytes whichever Pillow is installed; version 1 (Pillow
throughout) is pinned as pillow-simd made it, the environment ``make setup`` builds."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, features

from imgprep import jpegcrop
from imgprep.convert import native
from imgprep.convert.image import convert_image
from imgprep.convert.options import ConvertOptions
from imgprep.convert.run import convert
from imgprep.errors import ImageError
from imgprep.sections import TransformOptions
from tests.support import encode

GOLDEN = {
    "train-000000.tar": "75c4e48f884895418c5de2cd23bc67ddb9c5338cb1d0791a63a6d6a79e2ec792",
    "train-000001.tar": "326cb3aa60a93abec34eb9862d67eb1afc1b3bbf03896700fc5393282559280b",
    "train-000002.tar": "296e480ef6bc10703195fa96979aa045913d1ec921ae0059829394a900e894f7",
    "train-000003.tar": "560a272e5ea4bc8ad6f74e4a2ff13c1caeecdf48aa49f7fb8a0e62e50bc49345",
    "train-index.bin": "0e53d1e33f5cf5ae16c9f61e6622d7be7a8b5d2f597a537f0639cdee6a1c9c1e",
}
GOLDEN_VERSION_1 = {  # pillow-simd 12.1.1 over Debian's libjpeg-turbo 2.1.5
    "train-000000.tar": "28ac003dac15cd1b178987f0814307119d4fc40afa76d465335932a54db14ebf",
    "train-000001.tar": "35a021fad6f91e3b2de82f86c2ece6161c3485eb29194bd25b342e8c29bdeee2",
    "train-000002.tar": "0ba7f2df4d8a27591cf5a077f62cc3d73c17050518889ec0952b073efc8c35a7",
    "train-000003.tar": "33cfab4633cc0452c5fcfcbbcb21e43a8b9f2ed0c7fec179e0aed3b1e5a841d8",
    "train-index.bin": "2da913b79f7b6cd5483d951adefce4cd6984aee287ef1710476bad7eb9307336",
}


def _digests(out: Path) -> dict[str, str]:
    return {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in GOLDEN}


@pytest.mark.realdata
@pytest.mark.slow
@pytest.mark.skipif(not native.AVAILABLE, reason="transform version 2 needs the C extension")
def test_converting_the_real_sample_gives_the_recorded_bytes(real_data: Path,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "imgprep", "convert", str(real_data / "images"),
                          "-o", str(out), "--shards", "4", "-q"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert _digests(out) == GOLDEN


@pytest.mark.realdata
@pytest.mark.slow
@pytest.mark.skipif(".post" not in (features.version("pil") or ""),
                    reason="transform version 1's bytes were pinned with pillow-simd")
def test_transform_version_1_still_gives_its_recorded_bytes(
        real_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "AVAILABLE", False)
    summary = convert(ConvertOptions(input=real_data / "images", out=tmp_path, num_shards=4,
                                     workers=2))
    assert summary.complete
    assert _digests(tmp_path) == GOLDEN_VERSION_1


@pytest.mark.realdata
def test_every_real_original_reads_whole_without_a_warning(real_data: Path) -> None:
    """The rule was decided on these: 1,014 JPEGs (989 RGB, 25 grayscale, every chroma
    subsampling the sample has) end with their end-of-image marker, with nothing after it
    and no libjpeg warning; the PNG named .JPEG is not a JPEG; CMYK, made as ImageNet's 22
    are, reads quietly too. Half of a real original, padded, is an error."""
    files = sorted((real_data / "images").iterdir()) + sorted(
        (real_data / "originals").rglob("*.JPEG"))
    kinds: dict[str, int] = {}
    for i, f in enumerate(files):
        data = f.read_bytes()
        with Image.open(io.BytesIO(data)) as img:
            kinds[f"{img.format} {img.mode}"] = kinds.get(f"{img.format} {img.mode}", 0) + 1
            if img.format != "JPEG":
                continue
            cmyk = encode(img.convert("CMYK"), "JPEG") if i % 50 == 0 else b""
        assert jpegcrop.check(data) == jpegcrop.Scan(), f.name
        if cmyk:
            assert jpegcrop.check(cmyk) == jpegcrop.Scan(), f"{f.name} as CMYK"
    assert kinds == {"JPEG RGB": 989, "JPEG L": 25, "PNG RGBA": 1}
    real = files[0].read_bytes()
    with pytest.raises(ImageError, match="padded JPEG"):
        convert_image(real[:len(real) // 2] + bytes(64 << 20), TransformOptions())
    assert np.array_equal(convert_image(real, TransformOptions(), pixels=True).pixels,
                          convert_image(real, TransformOptions(), pixels=True,
                                        crop_decode=False).pixels)
