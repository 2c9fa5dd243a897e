"""Where a training sample's time goes: the Pillow path against the crop-aware path, stage by
stage, in one process on one core.

Data: the real sample images (``../shared/data/imagenet-sample/images``, ``--images``)
converted as ``imgprep convert`` writes them (center square, 256 px, RGB, JPEG quality 90),
held in memory. Every stage runs over all of them, ``--repeat`` rounds interleaved; figures
are the least CPU time per image (``time.process_time``) over the rounds: on a shared machine
another process only ever adds time (cache and memory-bandwidth contention), so the fastest
round is the stage's own cost:

- Pillow path (``loaders.transforms``): open, the full decode (``load``, JPEG draft at scale 1
  for 256 px images), ``resize(box=...)`` to 224, flip (half of the images), split into
  planes (CHW), and the whole sample (``apply``);
- crop-aware path (``loaders.decode.SampleDecoder``): header probe, the random draws (the
  transform's ``geometry``), the decode of only the region the crop needs (and, for
  comparison, of the whole image through the same decoder), ``resize(box=...)`` of the frame
  by the installed Pillow and by imgprep's resampler (``imgprep.resample``, resize, flip and
  CHW layout in one pass: what the loader's path runs), the one-pass pack (CHW and HWC), and
  the whole sample in both layouts (one C call: ``jpegcrop.sample``).

The ratios printed: the whole Pillow sample over the whole crop-aware one (the per-image
speed-up), and the whole-image decode over the region decode (what decoding only the crop
saves by itself). The last line of stdout is one JSON object.

    python -m bench.decode            # ~1 min on one core
    python -m bench.decode --repeat 3 --limit 300
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bench.common import DEFAULT_IMAGES, run_main
from imgprep import jpegcrop, resample
from loaders import SampleDecoder, TrainTransform
from loaders.transforms import apply, crop_box, into_chw

BILINEAR = Image.Resampling.BILINEAR
FLIP = Image.Transpose.FLIP_LEFT_RIGHT
T = TrainTransform()


def as_shard_jpeg(path: Path) -> bytes:
    """``path`` as a shard holds it: the center square at 256 px, JPEG quality 90."""
    img = Image.open(path).convert("RGB")
    w, h = img.size
    s = min(w, h)
    box = ((w - s) / 2, (h - s) / 2, (w + s) / 2, (h + s) / 2)
    buf = io.BytesIO()
    img.resize((256, 256), BILINEAR, box=box).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def stages(blobs: Sequence[bytes]) -> dict[str, Callable[[int], object]]:
    """Every stage as a function of the image's number (its draws made beforehand)."""
    rng = np.random.default_rng(0)
    boxes = [crop_box(256, 256, T, rng) for _ in blobs]
    flips = [i % 2 == 0 for i in range(len(blobs))]
    decoded = [Image.open(io.BytesIO(b)).convert("RGB") for b in blobs]
    small = [d.resize((T.size, T.size), BILINEAR, box=bx)
             for d, bx in zip(decoded, boxes, strict=True)]
    chw, hwc = np.empty((3, T.size, T.size), np.uint8), np.empty((T.size, T.size, 3), np.uint8)
    probes = [jpegcrop.probe(b) for b in blobs]
    regions = []
    for bx in boxes:
        (x0, x1), (y0, y1) = (jpegcrop.reach(bx[0], bx[2], T.size, 256),
                              jpegcrop.reach(bx[1], bx[3], T.size, 256))
        regions.append((x0, y0, x1, y1))
    frame = jpegcrop.Frame()
    frame_buf, frame_img = frame.view(256, 256)
    frame_px = frame_buf.reshape(256, 256, 4)
    planar, packed = SampleDecoder(T), SampleDecoder(T, channels_last=True)

    def flip(i: int) -> object:
        return small[i].transpose(FLIP) if flips[i] else small[i]

    return {
        "pillow_open": lambda i: Image.open(io.BytesIO(blobs[i])),
        "pillow_decode": lambda i: Image.open(io.BytesIO(blobs[i])).load(),
        "pillow_resize": lambda i: decoded[i].resize((T.size, T.size), BILINEAR, box=boxes[i]),
        "pillow_flip": flip,
        "pillow_split_chw": lambda i: into_chw(small[i], chw),
        "pillow_sample": lambda i: apply(blobs[i], T, rng, chw),
        "fast_probe": lambda i: jpegcrop.probe(blobs[i]),
        "fast_draws": lambda i: T.geometry(256, 256, rng),
        "fast_decode_region": lambda i: frame.decode(blobs[i], probes[i], 1, regions[i]),
        "fast_decode_whole": lambda i: frame.decode(blobs[i], probes[i], 1, (0, 0, 256, 256)),
        "fast_resize": lambda i: frame_img.resize((T.size, T.size), BILINEAR, box=boxes[i]),
        "fast_resample_chw": lambda i: resample.resize(frame_px, boxes[i], (T.size, T.size),
                                                       chw, flip=flips[i], planar=True),
        "fast_pack_chw": lambda i: jpegcrop.pack(small[i], T.size, (0, 0, T.size, T.size), chw,
                                                 flip=flips[i], planar=True),
        "fast_pack_hwc": lambda i: jpegcrop.pack(small[i], T.size, (0, 0, T.size, T.size), hwc,
                                                 flip=flips[i], planar=False),
        "fast_sample_chw": lambda i: planar(blobs[i], rng, chw),
        "fast_sample_hwc": lambda i: packed(blobs[i], rng, hwc),
    }


def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    del scratch  # everything stays in memory
    files = sorted(p for p in args.images.iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
    blobs = [as_shard_jpeg(p) for p in files[:args.limit]]
    fns = stages(blobs)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.repeat):
        for name, fn in fns.items():
            t0 = time.process_time()
            for i in range(len(blobs)):
                fn(i)
            times[name].append((time.process_time() - t0) / len(blobs) * 1e6)
    us = {name: round(min(v), 1) for name, v in times.items()}
    return {
        "images": len(blobs), "repeat": args.repeat, "us_per_image": us,
        "crop_decode": jpegcrop.status(), "resampler": resample.status(),
        "pillow_over_fast_chw": round(us["pillow_sample"] / us["fast_sample_chw"], 3),
        "pillow_over_fast_hwc": round(us["pillow_sample"] / us["fast_sample_hwc"], 3),
        "whole_over_region_decode": round(us["fast_decode_whole"] / us["fast_decode_region"],
                                          3),
    }


def print_table(res: dict[str, Any]) -> None:
    print(f"{res['images']} images as shards hold them, least of {res['repeat']} rounds, "
          "CPU us per image")
    for name, us in res["us_per_image"].items():
        print(f"  {name:22s} {us:8.1f}")
    print(f"whole Pillow sample / crop-aware sample: {res['pillow_over_fast_chw']:.2f}x (CHW), "
          f"{res['pillow_over_fast_hwc']:.2f}x (HWC)")
    print(f"whole-image decode / crop-region decode (same decoder): "
          f"{res['whole_over_region_decode']:.2f}x")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES,
                    help="folder of <wnid>_<name>.JPEG files (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds (default %(default)s)")
    ap.add_argument("--limit", type=int, default=None, help="use the first N images")
    args = ap.parse_args(argv)
    if args.repeat < 1 or (args.limit is not None and args.limit < 1):
        ap.error("--repeat and --limit must be >= 1")
    if not jpegcrop.AVAILABLE:
        print(f"bench.decode: the crop-aware decoder is {jpegcrop.status()}")
        return 2
    return run_main("bench-decode", args.images, None, lambda s: run(args, s), print_table)


if __name__ == "__main__":
    raise SystemExit(main())
