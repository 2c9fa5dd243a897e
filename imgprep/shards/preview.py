"""``imgprep preview``: a contact sheet of random converted samples, to check crops by eye
(stored pixels, ``convert --store``, shown as their RGB: ``imgprep.rawpixels``)."""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from imgprep import rawpixels
from imgprep.fsutil import write_bytes_atomic
from imgprep.rawformat import image_member, is_record, read_header
from imgprep.shards.manifest import Manifest, read_manifest
from imgprep.shards.tario import iter_samples
from imgprep.shards.verify import folder_manifests


def _pick(m: Manifest, folder: Path, n: int, seed: int) -> list[tuple[bytes, int, str]]:
    rng = random.Random(seed)
    picked: list[tuple[bytes, int, str]] = []
    if m.format == "shards":
        shards = [s for s in m.shards if s.samples]
        rng.shuffle(shards)
        per = max(1, -(-n // max(1, len(shards))))
        for s in shards:
            samples = list(iter_samples(folder / s.name))
            for key, f in rng.sample(samples, min(per, len(samples))):
                image = f[image_member(f) or "jpg"]  # the JPEG, or its stored pixels
                picked.append((image, int(f["cls"]) if m.labelled else -1, key))
            if len(picked) >= n:
                break
    else:
        lines = (folder / (m.list_file or f"{m.split}.txt")).read_text("utf-8").splitlines()
        for line in rng.sample(lines, min(n, len(lines))):
            rel, *lab = line.split()  # 'path' alone in an unlabelled split
            picked.append(((folder / rel).read_bytes(), int(lab[0]) if lab else -1,
                           Path(rel).stem))
    names = [c[1].split(",")[0] for c in m.classes]
    return [(jpg, label, (f"{label} {names[label]}" if m.labelled else key)[:22])
            for jpg, label, key in picked[:n]]


@dataclass(frozen=True, kw_only=True)
class Sheet:
    """What ``make_sheet`` wrote: the PNG ``output`` showing ``samples`` samples of ``split``."""

    folder: str
    split: str
    output: str
    samples: int


def _opened(data: bytes) -> Image.Image:
    """A sample's image for Pillow: the JPEG opened, or the stored pixels made RGB."""
    if not is_record(data):
        return Image.open(io.BytesIO(data))
    head = read_header(data)
    rgb = np.empty((head.height, head.width, 3), np.uint8)
    rawpixels.sample(data, head.width, head.height, resize=None, box=None,
                     crop=(0, 0, head.width, head.height), out=rgb, flip=False, planar=False)
    return Image.fromarray(rgb)


def make_sheet(folder: Path, out: Path, n: int = 32, split: str | None = None, seed: int = 0,
               cols: int = 8, thumb: int = 128) -> Sheet:
    """Write a PNG grid of ``n`` random samples with their class names; returns what it
    wrote. A folder without the manifest is refused with what it is and what to do
    (``verify.folder_manifests``)."""
    folder_manifests(folder, split, "preview")
    m = read_manifest(folder, split)
    items = _pick(m, folder, n, seed)
    rows = max(1, -(-len(items) // cols))
    cap = 14
    sheet = Image.new("RGB", (cols * thumb, rows * (thumb + cap)), "white")
    draw = ImageDraw.Draw(sheet)
    for k, (jpg, _, caption) in enumerate(items):
        with _opened(jpg) as src:
            im = src.convert("RGB")
            im.thumbnail((thumb, thumb))
            x, y = (k % cols) * thumb, (k // cols) * (thumb + cap)
            sheet.paste(im, (x + (thumb - im.width) // 2, y))
            draw.text((x + 2, y + thumb + 1), caption, fill="black")
    buf = io.BytesIO()
    sheet.save(buf, "PNG")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out, buf.getvalue())
    return Sheet(folder=str(folder), split=m.split, output=str(out), samples=len(items))
