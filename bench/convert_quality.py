"""Convert's output under transform version 2 (the C path) against version 1 (Pillow
throughout, what convert wrote before: run it under pillow-simd for the figures of the
project's environment, under stock Pillow for a user's), on the real sample images.

For every image and filter: the output JPEGs decoded and compared per channel (max and mean
absolute difference, PSNR over all the pixels of all the images), and the pixels before the
encoder (the resampled images themselves). And each filter's character: its sharpness (the
mean absolute Laplacian of the luma of the resampled pixels) over bilinear's, for each version;
Lanczos should stay as much sharper than bilinear under version 2 as under Pillow.

    python -m bench.convert_quality [--limit 200] [--filter lanczos --filter bilinear]

Prints a table and one JSON line. Exit code 2 when the image folder is missing.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bench.common import DEFAULT_IMAGES, run_main
from bench.convert import list_images
from imgprep import TransformOptions, pil_info
from imgprep.convert.image import convert_image, transform_version
from imgprep.convert.pillowpath import FILTERS, convert_pillow

LUMA = np.array([0.299, 0.587, 0.114])


def _decoded(jpeg: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), dtype=np.int16)


def sharpness(pixels: np.ndarray) -> float:
    """The mean absolute Laplacian of the luma: how much fine detail the resample kept."""
    y = pixels.astype(np.float64) @ LUMA
    lap = 4 * y[1:-1, 1:-1] - y[:-2, 1:-1] - y[2:, 1:-1] - y[1:-1, :-2] - y[1:-1, 2:]
    return float(np.abs(lap).mean())


class _Diff:
    """Per-channel absolute differences summed over images."""

    def __init__(self) -> None:
        self.max = np.zeros(3, np.int64)
        self.abs = np.zeros(3, np.float64)
        self.sq = np.zeros(3, np.float64)
        self.n = 0
        self.identical = 0
        self.images = 0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        d = (a.astype(np.int16) - b.astype(np.int16)).reshape(-1, 3)
        self.max = np.maximum(self.max, np.abs(d).max(axis=0))
        self.abs += np.abs(d).sum(axis=0)
        self.sq += (d.astype(np.float64) ** 2).sum(axis=0)
        self.n += len(d)
        self.identical += int(not d.any())
        self.images += 1

    def summary(self) -> dict[str, Any]:
        mse = self.sq / max(self.n, 1)
        return {"max": self.max.tolist(),
                "mean": [round(float(v), 4) for v in self.abs / max(self.n, 1)],
                "psnr_db": [None if m == 0 else round(10 * math.log10(255**2 / m), 2)
                            for m in mse],
                "identical_images": self.identical, "images": self.images}


def run(args: argparse.Namespace, _scratch: Path) -> dict[str, Any]:
    paths = list_images(args.images, args.limit)
    filters = args.filter or list(FILTERS)
    out: dict[str, Any] = {}
    sharp: dict[str, dict[str, float]] = {}
    for f in filters:
        opts = TransformOptions(filter=f)
        decoded, resampled = _Diff(), _Diff()
        s2 = s1 = 0.0
        for p in paths:
            data = p.read_bytes()
            new = convert_image(data, opts, pixels=True)
            old = convert_pillow(data, opts, pixels=True)
            assert new.pixels is not None and old.pixels is not None
            decoded.add(_decoded(new.jpeg), _decoded(old.jpeg))
            resampled.add(new.pixels, old.pixels)
            s2 += sharpness(new.pixels)
            s1 += sharpness(old.pixels)
        out[f] = {"decoded_output": decoded.summary(), "resampled_pixels": resampled.summary()}
        sharp[f] = {"version_2": s2 / len(paths), "version_1": s1 / len(paths)}
    character = {}
    if "bilinear" in sharp:
        base = sharp["bilinear"]
        character = {f: {v: round(s[v] / base[v], 4) for v in s} for f, s in sharp.items()}
    pil = pil_info(check_avx2=False)
    return {"benchmark": "convert-quality", "images": len(paths), "images_dir": str(args.images),
            "transform_version": transform_version(), "pil": pil.pil_version,
            "pillow_simd": pil.pillow_simd, "cpus": os.cpu_count(), "filters": out,
            "sharpness": {f: {v: round(x, 3) for v, x in s.items()} for f, s in sharp.items()},
            "sharpness_over_bilinear": character}


def print_table(res: dict[str, Any]) -> None:
    print(f"transform version {res['transform_version']} against version 1 under PIL "
          f"{res['pil']} (pillow-simd={res['pillow_simd']}), {res['images']} images")
    print(f"{'filter':9s} {'what':18s} {'max |d| R,G,B':>14s} {'mean |d| R,G,B':>22s} "
          f"{'PSNR dB R,G,B':>22s} {'identical':>10s}")
    for f, r in res["filters"].items():
        for what in ("decoded_output", "resampled_pixels"):
            s = r[what]
            psnr = ",".join("inf" if v is None else f"{v:.1f}" for v in s["psnr_db"])
            print(f"{f:9s} {what:18s} {','.join(map(str, s['max'])):>14s} "
                  f"{','.join(f'{v:.3f}' for v in s['mean']):>22s} {psnr:>22s} "
                  f"{s['identical_images']:>5d}/{s['images']}")
    if res["sharpness_over_bilinear"]:
        print("sharpness over bilinear's (mean |Laplacian| of luma): version 2 / version 1")
        for f, v in res["sharpness_over_bilinear"].items():
            print(f"  {f:9s} {v['version_2']:.4f} / {v['version_1']:.4f}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES,
                    help="folder of <wnid>_<name>.JPEG files (default: %(default)s)")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N images")
    ap.add_argument("--filter", action="append", choices=list(FILTERS), default=[],
                    help="a filter to compare (repeatable; default: every filter)")
    args = ap.parse_args(argv)
    return run_main("convert_quality", args.images, None, lambda s: run(args, s), print_table)


if __name__ == "__main__":
    sys.exit(main())
