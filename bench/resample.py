"""imgprep's resampler against the installed Pillow's resize (pillow-simd or stock Pillow),
on real crops, in one process on one core: speed per image and byte differences.

Data: the real sample images (``../shared/data/imagenet-sample/images``, ``--images``)
converted as ``imgprep convert`` makes them (center square, 256 px, lanczos, JPEG quality 90:
convert's own per-image function), decoded into RGBX frames as the crop-aware decoder leaves
them, with one random-resized-crop box each (the loader's default train transform's draws,
seeded); and, for convert's own resize, the originals decoded at their JPEG draft scale, as
convert decodes them, with their center square. Every stage runs on each image in turn, its
pixels copied into one frame just before (warm in the cache, as a decoder leaves them), each
call timed; ``--repeat`` rounds, and an image's figure for a stage is its least time over the
rounds (on a shared machine another process only ever adds time); the table gives the mean
over the images, in microseconds:

- ``pillow_rrc``: ``Image.resize((224, 224), BILINEAR, box=box)`` of the frame (a Pillow view
  of it, as the loader resizes today); ``ours_rrc``: ``imgprep.resample.resize`` of the same
  box into a 224 x 224 x 3 array; ``ours_rrc_chw_flip``: the same into 3 x 224 x 224, mirrored
  on every other image (what a training batch row needs, which Pillow's stage leaves to a
  pack after it); ``ours_rrc_<kernel>``: each kernel this CPU runs, forced;
- ``pillow_convert`` / ``ours_convert``: the center square of a draft-decoded original to
  256 x 256 with lanczos (convert's default).

Bytes: ours against the installed Pillow on the same crops, for every filter (the RRC boxes
at 224) and for convert's resize: per channel, the largest and the mean absolute difference,
and the share of bytes that differ. The ratios printed: Pillow's time over ours (>= 0.91:
within 10 % of Pillow's speed). The last line of stdout is one JSON object.

    python -m bench.resample                 # ~1 min on one core
    python -m bench.resample --repeat 3 --limit 300
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import io
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import PIL
from PIL import Image

from bench.common import DEFAULT_IMAGES, run_main
from imgprep import TransformOptions, resample
from imgprep.convert.image import convert_image
from loaders import TrainTransform
from loaders.transforms import crop_box

SIZE = 224
CONVERT_SIZE = 256
T = TrainTransform()
Box = tuple[float, float, float, float]


def frame_of(img: Image.Image) -> np.ndarray:
    """``img`` as an RGBX frame (H x W x 4)."""
    return np.ascontiguousarray(np.asarray(img.convert("RGBX")))


def shard_frames(files: Sequence[Path]) -> list[np.ndarray]:
    """Each file as convert writes it (256 px JPEG), decoded."""
    return [frame_of(Image.open(io.BytesIO(convert_image(p.read_bytes(),
                                                          TransformOptions()).jpeg)))
            for p in files]


def draft_frames(files: Sequence[Path]) -> list[np.ndarray]:
    """Each original decoded at the draft scale convert uses for a 256 px output."""
    out = []
    for path in files:
        img = Image.open(path)
        img.draft("RGB", (CONVERT_SIZE, CONVERT_SIZE))
        out.append(frame_of(img.convert("RGB")))
    return out


def center(w: int, h: int) -> Box:
    s = min(w, h)
    left, top = (w - s) // 2, (h - s) // 2
    return (left, top, left + s, top + s)


class Work:
    """A frame's pixels copied into one buffer before its stages run, as a decoder leaves
    them (warm in the cache), with a Pillow image over the same memory."""

    def __init__(self, frames: Sequence[np.ndarray]) -> None:
        self.frames = frames
        self.buf = np.empty(max(f.size for f in frames), np.uint8)
        self.arr = frames[0]
        self.img = Image.new("RGBX", (1, 1))

    def load(self, i: int) -> None:
        f = self.frames[i]
        h, w = f.shape[:2]
        self.arr = self.buf[:f.size].reshape(f.shape)
        self.arr[...] = f
        self.img = Image.frombuffer("RGBX", (w, h), self.arr, "raw", "RGBX", 0, 1)


Stage = Callable[[int], object]


def rrc_stages(work: Work, boxes: Sequence[Box]) -> dict[str, Stage]:
    """The loader's resize, image by image: Pillow's, ours, ours in CHW with the flip, and
    ours with each kernel this CPU runs."""
    hwc = np.empty((SIZE, SIZE, 3), np.uint8)
    chw = np.empty((3, SIZE, SIZE), np.uint8)
    bilinear = Image.Resampling.BILINEAR

    def ours(kernel: str | None) -> Stage:
        return lambda i: resample.resize(work.arr, boxes[i], (SIZE, SIZE), hwc, kernel=kernel)

    fns: dict[str, Stage] = {
        "pillow_rrc": lambda i: work.img.resize((SIZE, SIZE), bilinear, box=boxes[i]),
        "ours_rrc": ours(None),
        "ours_rrc_chw_flip": lambda i: resample.resize(work.arr, boxes[i], (SIZE, SIZE), chw,
                                                       planar=True, flip=i % 2 == 0),
    }
    for k in resample.kernels():
        fns[f"ours_rrc_{k}"] = ours(k)
    return fns


def convert_stages(work: Work, boxes: Sequence[Box]) -> dict[str, Stage]:
    """Convert's resize: the center square to 256 px with lanczos, Pillow's and ours."""
    out = np.empty((CONVERT_SIZE, CONVERT_SIZE, 3), np.uint8)
    cut, lanczos = (CONVERT_SIZE, CONVERT_SIZE), Image.Resampling.LANCZOS
    return {
        "pillow_convert": lambda i: work.img.resize(cut, lanczos, box=boxes[i]),
        "ours_convert": lambda i: resample.resize(work.arr, boxes[i], cut, out,
                                                  filter="lanczos"),
    }


def timed(work: Work, stages: dict[str, Stage], repeat: int) -> dict[str, float]:
    """Mean over the images of each stage's least wall time over ``repeat`` rounds, in us:
    the stages of an image run one after the other, each on the image's pixels freshly
    copied into the frame, so a slow spell of a shared machine weighs on all of them, and
    the least of the rounds leaves it out."""
    n = len(work.frames)
    best = {name: [float("inf")] * n for name in stages}
    for _ in range(repeat):
        for i in range(n):
            for name, fn in stages.items():
                work.load(i)  # warm for each stage: the one before may have evicted it
                t0 = time.perf_counter_ns()
                fn(i)
                t = time.perf_counter_ns() - t0
                if t < best[name][i]:
                    best[name][i] = t
    return {name: round(sum(v) / n / 1e3, 2) for name, v in best.items()}


def differences(frames: Sequence[np.ndarray], boxes: Sequence[Box], size: tuple[int, int],
                filt: str) -> dict[str, Any]:
    """Ours against Pillow's resize of the same boxes: per channel max and mean |diff|."""
    worst = np.zeros(3, np.int64)
    total = np.zeros(3, np.int64)
    differ = count = 0
    out = np.empty((size[1], size[0], 3), np.uint8)
    for arr, box in zip(frames, boxes, strict=True):
        img = Image.frombuffer("RGBX", arr.shape[1::-1], arr, "raw", "RGBX", 0, 1)
        ref = np.asarray(img.resize(size, Image.Resampling[filt.upper()], box=box))[..., :3]
        resample.resize(arr, box, size, out, filter=filt)
        d = np.abs(out.astype(np.int16) - ref.astype(np.int16)).reshape(-1, 3)
        worst = np.maximum(worst, d.max(axis=0))
        total += d.sum(axis=0)
        differ += int(np.count_nonzero(d))
        count += d.size
    return {"max": worst.tolist(), "mean": [round(float(t) / (count / 3), 4) for t in total],
            "differing": round(differ / count, 5)}


def pillow_simd() -> bool:
    """Whether the imported PIL is pillow-simd's."""
    try:
        return md.version("pillow-simd") == PIL.__version__
    except md.PackageNotFoundError:
        return False


def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    del scratch  # everything stays in memory
    files = sorted(p for p in args.images.iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
    files = files[:args.limit]
    shards = shard_frames(files)
    originals = draft_frames(files[:args.convert_limit])
    rng = np.random.default_rng(0)
    boxes = [crop_box(a.shape[1], a.shape[0], T, rng) for a in shards]
    centers = [center(a.shape[1], a.shape[0]) for a in originals]
    work, big = Work(shards), Work(originals)
    us = timed(work, rrc_stages(work, boxes), args.repeat)
    us |= timed(big, convert_stages(big, centers), args.repeat)
    diff = {f: differences(shards, boxes, (SIZE, SIZE), f) for f in resample.FILTERS}
    diff["convert_lanczos"] = differences(originals, centers, (CONVERT_SIZE, CONVERT_SIZE),
                                          "lanczos")
    return {
        "images": len(shards), "convert_images": len(originals), "repeat": args.repeat,
        "pil": PIL.__version__, "pillow_simd": pillow_simd(),
        "kernel": resample.kernel(), "us_per_image": us,
        "pillow_over_ours_rrc": round(us["pillow_rrc"] / us["ours_rrc"], 3),
        "pillow_over_ours_convert": round(us["pillow_convert"] / us["ours_convert"], 3),
        "differences": diff,
    }


def print_table(res: dict[str, Any]) -> None:
    flavour = "pillow-simd" if res["pillow_simd"] else "stock Pillow"
    print(f"{res['images']} crops of shard-sized images ({res['convert_images']} originals for "
          f"convert's resize), PIL {res['pil']} ({flavour}); us per image, the least of "
          f"{res['repeat']} rounds; our kernel: {res['kernel']}")
    for name, us in res["us_per_image"].items():
        print(f"  {name:20s} {us:8.1f}")
    for what in ("rrc", "convert"):
        ratio = res[f"pillow_over_ours_{what}"]
        verdict = ("ours faster" if ratio >= 1 else "within 10 %" if ratio >= 1 / 1.1
                   else "ours SLOWER by over 10 %")
        print(f"{flavour} / ours, {what}: {ratio:.2f}x ({verdict})")
    print("ours vs the installed Pillow, per channel: max |diff|, mean |diff|, bytes differing")
    for name, d in res["differences"].items():
        print(f"  {name:16s} max {d['max']}  mean {d['mean']}  differing {d['differing']:.3%}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES,
                    help="folder of <wnid>_<name>.JPEG files (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds (default %(default)s)")
    ap.add_argument("--limit", type=int, default=None, help="use the first N images")
    ap.add_argument("--convert-limit", type=int, default=300,
                    help="originals for convert's resize (default %(default)s: memory)")
    args = ap.parse_args(argv)
    if args.repeat < 1 or (args.limit is not None and args.limit < 1) or args.convert_limit < 1:
        ap.error("--repeat, --limit and --convert-limit must be >= 1")
    if not resample.AVAILABLE:
        print(f"bench.resample: the resampler is {resample.status()}")
        return 2
    return run_main("bench-resample", args.images, None, lambda s: run(args, s), print_table)


if __name__ == "__main__":
    raise SystemExit(main())
