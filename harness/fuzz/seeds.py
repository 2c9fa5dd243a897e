"""The fuzz seeds: real ImageNet JPEGs from the sample (the smallest files, so that inputs
are cheap, plus the smallest of each chroma subsampling and of the grayscale ones, and
progressive and restart-marker re-encodings of a real photo), or synthetic photos encoded
the same ways where the sample is absent. Where the extension is given, that photo is also
encoded at each of ``SAMPLINGS`` (chroma sampling factors cameras rarely write, each at a
size that leaves partial MCUs); and it is written progressive in ``SCANS`` scans
(``harness.fuzz.progressive``; libjpeg writes about 10).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from types import ModuleType

import numpy as np
from PIL import Image, JpegImagePlugin

from harness.fuzz.progressive import progressive
from imgprep.inputs.fakeset import synthetic_photo

SMALLEST = 16
REPO = Path(__file__).resolve().parents[2]
# (h, v) of Y, Cb and Cr; legal (tests/convert/test_sampling.py), and the size each is drawn at
SAMPLINGS = {
    (2, 4, 1, 1, 1, 1): (75, 53), (4, 2, 1, 1, 1, 1): (99, 41), (1, 4, 1, 1, 1, 1): (37, 86),
    (4, 1, 1, 1, 1, 1): (130, 29), (3, 1, 1, 1, 1, 1): (53, 53), (1, 3, 1, 1, 1, 1): (41, 97),
    (3, 2, 1, 1, 1, 1): (88, 70), (1, 1, 2, 4, 1, 1): (61, 45), (2, 2, 1, 2, 2, 1): (70, 58),
    (4, 1, 2, 1, 1, 1): (111, 37),
}
SCANS = ((1, 0), (2, 6), (5, 13))  # (band, dc_bits): 190, 103 and 53 scans
PROGRESSIVE_SIZE = (64, 48)


def default_folder() -> Path:
    """The real sample: ``$IMGPREP_SAMPLE_DATA``, else ``../shared/data/imagenet-sample``."""
    return Path(os.environ.get("IMGPREP_SAMPLE_DATA",
                               REPO.parent / "shared" / "data" / "imagenet-sample"))


def _encodings(img: Image.Image) -> list[bytes]:
    """``img`` re-encoded as a progressive JPEG, with restart markers, and at 4:2:0."""
    out = []
    for kw in ({"progressive": True}, {"restart_marker_rows": 1}, {"subsampling": 2}):
        buf = io.BytesIO()
        img.convert("RGB").save(buf, "JPEG", quality=80, **kw)
        out.append(buf.getvalue())
    return out


def _unusual(img: Image.Image, ext: ModuleType) -> list[bytes]:
    """``img`` at each of ``SAMPLINGS`` (by ``ext.encode``) and in each of ``SCANS``."""
    out = []
    rgb = img.convert("RGB")
    for i, (factors, size) in enumerate(SAMPLINGS.items()):
        px = np.asarray(rgb.resize(size, Image.Resampling.BILINEAR))
        out.append(bytes(ext.encode(px.tobytes(), *size, 3, 60 + 4 * i, factors)))
    small = rgb.resize(PROGRESSIVE_SIZE, Image.Resampling.BILINEAR)
    return out + [progressive(small, band=band, dc_bits=dc) for band, dc in SCANS]


def _kind(path: Path) -> str:
    """A JPEG's mode and chroma subsampling, or '' when Pillow does not read it as one."""
    try:
        with Image.open(path) as img:
            if img.format != "JPEG":
                return ""
            return f"{img.mode}-{JpegImagePlugin.get_sampling(img)}"
    except OSError:
        return ""


def load_seeds(folder: Path, ext: ModuleType | None = None) -> tuple[list[bytes], str]:
    """The seeds and where they came from (the folder, or "synthetic"); ``ext``: the
    extension that encodes the sampling seeds (none without it)."""
    images = folder / "images"
    if not images.is_dir():
        rng = np.random.default_rng(0)
        photos = [synthetic_photo(rng, (int(w), int(h)))
                  for w, h in rng.integers(8, 120, (6, 2))]
        seeds = [e for p in photos for e in _encodings(p)]
        buf = io.BytesIO()
        photos[0].convert("L").save(buf, "JPEG", quality=90)
        unusual = _unusual(photos[0], ext) if ext is not None else []
        return seeds + [buf.getvalue()] + unusual, "synthetic"
    files = sorted(images.iterdir(), key=lambda p: (p.stat().st_size, p.name))
    chosen = files[:SMALLEST]
    seen: set[str] = set()
    for f in files:
        kind = _kind(f)
        if kind and kind not in seen:
            seen.add(kind)
            chosen.append(f)
    seeds = [f.read_bytes() for f in chosen]
    with Image.open(files[0]) as img:
        seeds += _encodings(img)
        seeds += _unusual(img, ext) if ext is not None else []
    return seeds, str(images)
