"""Convert a tar with 1 worker, after a warm-up tar, and print one JSON line: images/s, CPU
µs per image and the PIL version. ``bench.convert_versions`` runs it by path under each
interpreter with another checkout first on ``PYTHONPATH``, so it imports nothing of ``bench``
and only the public API of ``imgprep`` (what every checkout compared has):
``python bench/convert_once.py TAR WARM_TAR SCRATCH``."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import PIL

from imgprep import ConvertOptions, convert_splits


def convert_once(src: Path, dst: Path) -> tuple[float, float]:
    """Images/s and CPU seconds per image of converting ``src`` into ``dst`` (removed after)."""
    shutil.rmtree(dst, ignore_errors=True)
    c0, t0 = os.times(), time.perf_counter()
    s = convert_splits(ConvertOptions(input=src, out=dst, workers=1))[0]
    dt, c1 = time.perf_counter() - t0, os.times()
    if not s.complete or s.errors:
        raise SystemExit(f"conversion of {src} incomplete: {s}")
    shutil.rmtree(dst)
    return s.samples / dt, (c1.user + c1.system - c0.user - c0.system) / s.samples


def main() -> None:
    tar, warm, out = (Path(a) for a in sys.argv[1:4])
    convert_once(warm, out)
    rate, cpu = convert_once(tar, out)
    print(json.dumps({"rate": rate, "cpu_us": cpu * 1e6, "pil": PIL.__version__}))


if __name__ == "__main__":
    main()
