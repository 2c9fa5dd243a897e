"""Benchmark ``imgprep verify`` with 1 and 2 workers against its own floor.

On the 1000 real ILSVRC2012 JPEGs of ``<repo>/../shared/data/imagenet-sample/images``
(``--images`` to point elsewhere), converted once to 256 px shards (``--copies`` times over, so
that each pass takes long enough to time), it measures in one run:

- floor: one process decoding every converted JPEG from bytes preloaded in memory (the decode
  that verify does per sample, nothing else);
- verify, 1 worker and 2 workers: ``imgprep.shards.verify.verify`` over the folder (sha256 of every
  shard, every header, every label, every image decoded), warm page cache;
- verify of a one-shard conversion with 2 workers: the shard is split over both workers.

Targets: 2 workers / 1 worker >= 1.8 (on a 2-core machine); 1 worker / floor is reported.
Rounds are interleaved (``--repeat``) and rates are medians. A table goes to stdout, then one
JSON line with every figure.

Run (from the repository root, in the project's environment)::

    python -m bench.verify            # about a minute and a half
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

from bench.common import DEFAULT_IMAGES, run_main, verdict
from imgprep import ConvertOptions, convert_splits, read_manifest, verify
from imgprep.shards.tario import iter_samples

TARGET_2W_OVER_1W = 1.8


def build_input(images: Path, dest: Path, copies: int) -> int:
    """A flat tar of the images, each ``copies`` times under distinct keys."""
    paths = sorted(p for p in images.iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
    with tarfile.open(dest, "w") as tf:
        for c in range(copies):
            for p in paths:
                data = p.read_bytes()
                ti = tarfile.TarInfo(f"{p.stem}-{c}.JPEG".replace("'", ""))
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return len(paths) * copies


def floor_rate(folder: Path) -> float:
    m = read_manifest(folder, "train")
    blobs = [f["jpg"] for s in m.shards for _, f in iter_samples(folder / s.name)]
    t0 = time.perf_counter()
    for b in blobs:
        with Image.open(io.BytesIO(b)) as img:
            img.load()
    return len(blobs) / (time.perf_counter() - t0)


def verify_rate(folder: Path, workers: int) -> float:
    t0 = time.perf_counter()
    rep = verify(folder, "train", workers=workers)
    dt = time.perf_counter() - t0
    if not rep.ok:
        raise SystemExit(f"bench_verify: verify found problems: {rep.problems[:3]}")
    return rep.samples / dt


def run(scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    src = scratch / "input.tar"
    n = build_input(args.images, src, args.copies)
    many, one = scratch / "shards", scratch / "one"
    convert_splits(ConvertOptions(input=src, out=many, num_shards=8, workers=2, max_errors=n))
    convert_splits(ConvertOptions(input=src, out=one, num_shards=1, workers=2, max_errors=n))
    measures: dict[str, Callable[[], float]] = {
        "floor": lambda: floor_rate(many),
        "verify_1w": lambda: verify_rate(many, 1),
        "verify_2w": lambda: verify_rate(many, 2),
        "verify_1shard_1w": lambda: verify_rate(one, 1),
        "verify_1shard_2w": lambda: verify_rate(one, 2),
    }
    verify_rate(many, 2)  # warm the page cache and the decoder
    rates: dict[str, list[float]] = {k: [] for k in measures}
    for _ in range(args.repeat):
        for k, fn in measures.items():
            rates[k].append(fn())
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "images": read_manifest(many, "train").total_samples,
        "rates_img_per_s": med,
        "verify_1w_over_floor": med["verify_1w"] / med["floor"],
        "verify_2w_over_1w": med["verify_2w"] / med["verify_1w"],
        "verify_1shard_2w_over_1w": med["verify_1shard_2w"] / med["verify_1shard_1w"],
        "target_2w_over_1w": TARGET_2W_OVER_1W,
    }


def print_table(r: dict[str, Any]) -> None:
    print(f"verify on {r['images']} converted real images (img/s, median)")
    for k, v in r["rates_img_per_s"].items():
        print(f"  {k:<18} {v:9.1f}")
    print(f"  1 worker / floor        {r['verify_1w_over_floor']:.3f}")
    print(f"  2 workers / 1 worker    {r['verify_2w_over_1w']:.3f} (target >= "
          f"{TARGET_2W_OVER_1W}) {verdict(r['verify_2w_over_1w'], TARGET_2W_OVER_1W)}")
    print(f"  one shard, 2w / 1w      {r['verify_1shard_2w_over_1w']:.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES)
    ap.add_argument("--copies", type=int, default=8, help="times each image is repeated")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--out", type=Path, default=None, help="scratch parent folder")
    args = ap.parse_args()
    return run_main("bench_verify", args.images, args.out, lambda s: run(s, args), print_table)


if __name__ == "__main__":
    sys.exit(main())
