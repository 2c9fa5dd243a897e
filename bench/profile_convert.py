"""Where ``imgprep convert``'s time per image goes, beside its floor, in CPU microseconds.

Runs the floor loop of ``bench.convert`` (draft + crop/resize + encode over preloaded bytes)
and one ``convert --workers 1`` of a tar of the same images, each under ``cProfile`` timed by
process CPU time, and sorts every function's own time into a few categories: the image work
(Pillow: decode, resize, encode and their Python), listing and planning, reading the input,
sha256, tar writing (including fsync), statistics, JSON (sample metadata, records, manifest)
and the rest. Profiling inflates Python-heavy categories, so read it for where the time goes,
and ``bench.convert`` for the rates. Prints a table and one JSON line.

    python -m bench.profile_convert [--limit 1000]

It profiles whichever ``imgprep`` comes first on the path: from another folder,
``PYTHONPATH=<other checkout>:<this checkout> python -m bench.profile_convert`` profiles
another version with the same script.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import DEFAULT_IMAGES
from bench.convert import build_tar, convert_options, floor_one, list_images
from imgprep import convert_splits

# (category, substrings of "file:function" that put a function in it), first match wins
CATEGORIES = (
    ("sha256", ("sha256", "HASH' objects", "'update' of '_hashlib")),
    ("read input", ("posix.pread", "sources.py:", "'readinto'")),
    ("listing and plan", ("tarscan.py", "tarlist.py", "tarfile.py", "plan.py", "groundtruth.py",
                          "synsets.py", "posixpath", "'lexsort'", "'argsort'")),
    ("tar writing and fsync", ("writers.py", "directio.py", "fsutil.py", "posix.fsync",
                               "BufferedWriter", "posix.write", "posix.pwrite", "posix.replace",
                               "'join' of 'bytes'", "sync_file_range", "CFuncPtr", "mmap",
                               "threading.py", "'start_new_thread'", "'acquire' of")),
    ("statistics", ("channel_sums", "channel_histogram", "sums_of_histogram", "center_pixels",
                    "'histogram'", "numpy")),
    ("json: metadata, records, manifest", ("json", "sample_meta", "manifest.py", "records.py",
                                           "encode_basestring", "dataclasses.py")),
    ("image work (C path, Pillow)", ("PIL", "Imaging", "_jpegcrop", "native.py", "pillowpath.py",
                                     "transform.py", "warnings.py", "_io.BytesIO")),
)


def categorise(stats: pstats.Stats) -> dict[str, float]:
    """Seconds of own time per category."""
    out = {name: 0.0 for name, _ in CATEGORIES} | {"other": 0.0}
    for (file, line, func), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{file}:{line}({func})"
        name = next((n for n, keys in CATEGORIES if any(k in where for k in keys)), "other")
        out[name] += tottime
    return out


def profiled(fn: Any) -> pstats.Stats:
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    fn()
    prof.disable()
    return pstats.Stats(prof)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES)
    ap.add_argument("--limit", type=int, default=1000)
    args = ap.parse_args(argv)
    paths = list_images(args.images, args.limit)
    if not paths:
        print(f"profile_convert: no .JPEG files in {args.images}", file=sys.stderr)
        return 2
    n = len(paths)
    blobs = [p.read_bytes() for p in paths]
    with tempfile.TemporaryDirectory(prefix="profile-convert-") as tmp:
        tar = Path(tmp) / "images.tar"
        build_tar(paths, tar)
        for b in blobs[:50]:
            floor_one(b)
        floor = categorise(profiled(lambda: [floor_one(b) for b in blobs]))
        out = Path(tmp) / "out"
        conv = categorise(profiled(lambda: convert_splits(convert_options(tar, out, 1, None))))
        shutil.rmtree(out)
    per = {k: round(v / n * 1e6, 1) for k, v in conv.items()}
    floor_us = round(sum(floor.values()) / n * 1e6, 1)
    total = round(sum(conv.values()) / n * 1e6, 1)
    print(f"convert --workers 1, {n} images, CPU us per image under cProfile")
    for k, v in per.items():
        print(f"  {k:36s} {v:8.1f}")
    print(f"  {'total':36s} {total:8.1f}")
    print(f"  {'floor loop (same profiler)':36s} {floor_us:8.1f}")
    print(f"  {'beyond the floor':36s} {total - floor_us:8.1f}")
    print(json.dumps({"benchmark": "profile_convert", "images": n, "us_per_image": per,
                      "total_us": total, "floor_us": floor_us,
                      "beyond_floor_us": round(total - floor_us, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
