"""The fuzz seeds: real ImageNet JPEGs from the sample (the smallest files, so that inputs
are cheap, plus the smallest of each chroma subsampling and of the grayscale ones, and
progressive and restart-marker re-encodings of a real photo), or synthetic photos encoded
the same ways where the sample is absent.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from PIL import Image, JpegImagePlugin

from imgprep.inputs.fakeset import synthetic_photo

SMALLEST = 16
REPO = Path(__file__).resolve().parents[2]


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


def _kind(path: Path) -> str:
    """A JPEG's mode and chroma subsampling, or '' when Pillow does not read it as one."""
    try:
        with Image.open(path) as img:
            if img.format != "JPEG":
                return ""
            return f"{img.mode}-{JpegImagePlugin.get_sampling(img)}"
    except OSError:
        return ""


def load_seeds(folder: Path) -> tuple[list[bytes], str]:
    """The seeds and where they came from (the folder, or "synthetic")."""
    images = folder / "images"
    if not images.is_dir():
        rng = np.random.default_rng(0)
        photos = [synthetic_photo(rng, (int(w), int(h)))
                  for w, h in rng.integers(8, 120, (6, 2))]
        seeds = [e for p in photos for e in _encodings(p)]
        buf = io.BytesIO()
        photos[0].convert("L").save(buf, "JPEG", quality=90)
        return seeds + [buf.getvalue()], "synthetic"
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
    return seeds, str(images)
