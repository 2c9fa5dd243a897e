"""imgprep's augmentation ops against stock Pillow's own calls, op by op, at 224 px, one thread.

Data: the real sample images (``../shared/data/imagenet-sample/images``, ``--images``), the
first ``--limit`` of them, each's centre square resized to 224 x 224 (bilinear). Each op
below runs on every crop in turn: ours (``imgprep.augment.apply``) on a 3 x 224 x 224 planar
copy of the crop made just before (the loader's layout; the extension works on the calling
thread), and stock Pillow 13.0.0's call that it equals, on an RGB image of the same crop, in
the reference environment ``make setup`` builds (``build/pillow-reference``;
tests/support/pillow_reference.py ``--time``, a child process, timing its calls the same
way). ``--kernel`` times one of the extension's kernels (default: the best this CPU runs;
all give the same bytes). ``--repeat`` rounds, each ours then Pillow's, so that a slow spell
of a shared machine weighs on both; a crop's figure for an op is its least time over the
rounds (another process only ever adds time). The table gives the mean over the crops, in
microseconds, and Pillow's time over ours (above 1: ours is faster), and names the worst op.
The last line of stdout is one JSON object.

    python -m bench.augment                  # about a minute on one core
    python -m bench.augment --limit 10 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bench.common import DEFAULT_IMAGES, REPO, run_main
from imgprep import augment

SIZE = 224
MEAN = [124, 116, 104]
SCRIPT = REPO / "tests" / "support" / "pillow_reference.py"
REFERENCE = REPO / "build" / "pillow-reference" / "bin" / "python"


def _step(op: str, *args: float, resample: str = "nearest") -> dict[str, Any]:
    return {"op": op, "args": list(args), "resample": resample, "fill": MEAN}


# name -> the reference script's step (tests/support/pillow_reference.py): a mid-range
# magnitude of each op, as TrivialAugmentWide draws them
STEPS: dict[str, dict[str, Any]] = {
    "brightness": _step("brightness", 1.5), "color": _step("color", 1.5),
    "contrast": _step("contrast", 1.5), "sharpness": _step("sharpness", 1.5),
    "posterize": _step("posterize", 4), "solarize": _step("solarize", 128.0),
    "solarize_add": _step("solarize_add", 40, 128), "autocontrast": _step("autocontrast"),
    "equalize": _step("equalize"), "invert": _step("invert"),
    **{f"shear_{r}": _step("affine", *augment.shear_matrix(0.3), resample=r)
       for r in augment.RESAMPLES},
    **{f"translate_{r}": _step("affine", *augment.translate_matrix(10.5, 0), resample=r)
       for r in augment.RESAMPLES},
    **{f"rotate_{r}": _step("rotate", 30.0, resample=r) for r in augment.RESAMPLES},
}


def op_of(s: dict[str, Any]) -> augment.Op:
    fill = (MEAN[0], MEAN[1], MEAN[2])
    if s["op"] == "rotate":
        return augment.Op("affine", augment.rotate_matrix(s["args"][0], SIZE, SIZE),
                          s["resample"], fill)
    return augment.Op(s["op"], tuple(s["args"]), s["resample"], fill)


def crops_of(files: Sequence[Path]) -> np.ndarray:
    """Each file's centre square at SIZE x SIZE: N x SIZE x SIZE x 3."""
    out = np.empty((len(files), SIZE, SIZE, 3), np.uint8)
    for i, path in enumerate(files):
        with Image.open(path) as img:
            img.draft("RGB", (SIZE, SIZE))
            rgb = img.convert("RGB")
        w, h = rgb.size
        s = min(w, h)
        box = ((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)
        out[i] = np.asarray(rgb.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=box))
    return out


def ours(planar: np.ndarray, best: np.ndarray, kernel: str) -> None:
    """One round: each op on each crop, ``best`` (ops x crops, us) lowered where faster."""
    work = np.empty_like(planar[0])
    for k, s in enumerate(STEPS.values()):
        ops = [op_of(s)]
        for i, crop in enumerate(planar):
            work[...] = crop  # warm in the cache, as a decoder leaves it
            t0 = time.perf_counter_ns()
            augment.apply(work, ops, planar=True, kernel=kernel)
            best[k, i] = min(best[k, i], (time.perf_counter_ns() - t0) / 1e3)


def pillows(inp: Path, out: Path, python: Path, best: np.ndarray) -> str:
    """One round of stock Pillow's calls in the reference environment, likewise; its
    version."""
    subprocess.run([str(python), "-I", str(SCRIPT), str(inp), str(out), "--time", "1"],
                   check=True)
    with np.load(out) as data:
        np.minimum(best, data["us"], out=best)
        return str(data["version"])


def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Rounds of ours then Pillow's, so that a slow spell of a shared machine weighs on both;
    each crop's least time per op, averaged over the crops."""
    files = sorted(p for p in args.images.iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
    crops = crops_of(files[:args.limit])
    planar = np.ascontiguousarray(crops.transpose(0, 3, 1, 2))
    inp, out = scratch / "in.npz", scratch / "out.npz"
    np.savez(inp, crops=crops, specs=np.array(json.dumps([[s] for s in STEPS.values()])))
    mine, theirs = (np.full((len(STEPS), len(crops)), np.inf) for _ in range(2))
    version = ""
    kernel = augment.kernel(args.kernel)
    for _ in range(args.repeat):
        ours(planar, mine, kernel)
        version = pillows(inp, out, args.reference, theirs)
    us = {name: round(float(t), 2) for name, t in zip(STEPS, mine.mean(axis=1), strict=True)}
    pil = {name: round(float(t), 2) for name, t in zip(STEPS, theirs.mean(axis=1), strict=True)}
    ratio = {name: round(pil[name] / us[name], 3) for name in STEPS}
    worst = min(ratio, key=lambda name: ratio[name])
    return {"images": len(crops), "size": SIZE, "repeat": args.repeat, "pillow": version,
            "layout": "planar", "threads": 1, "kernel": kernel, "ours_us": us,
            "pillow_us": pil, "pillow_over_ours": ratio, "worst_op": worst,
            "worst_ratio": ratio[worst]}


def print_table(res: dict[str, Any]) -> None:
    print(f"{res['images']} crops at {res['size']} px, planar, one thread, the {res['kernel']} "
          f"kernel; stock Pillow {res['pillow']}; us per image, the least of {res['repeat']} "
          "rounds")
    print(f"  {'op':22s} {'ours':>9s} {'Pillow':>9s} {'Pillow/ours':>12s}")
    for name in res["ours_us"]:
        print(f"  {name:22s} {res['ours_us'][name]:9.1f} {res['pillow_us'][name]:9.1f} "
              f"{res['pillow_over_ours'][name]:11.2f}x")
    ratio = res["worst_ratio"]
    verdict = "ours faster on every op" if ratio >= 1 else "ours SLOWER on this op"
    print(f"worst op: {res['worst_op']} at {ratio:.2f}x ({verdict})")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES,
                    help="folder of <wnid>_<name>.JPEG files (default: %(default)s)")
    ap.add_argument("--limit", type=int, default=50, help="crops (default %(default)s)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds (default %(default)s)")
    ap.add_argument("--reference", type=Path, default=REFERENCE,
                    help="the stock-Pillow environment's python (default: %(default)s, "
                         "which `make setup` builds)")
    ap.add_argument("--kernel", choices=augment.KERNELS, default=None,
                    help="the kernel to time (default: the best this CPU runs)")
    args = ap.parse_args(argv)
    if args.repeat < 1 or args.limit < 1:
        ap.error("--repeat and --limit must be >= 1")
    if not augment.AVAILABLE:
        print("bench.augment: the C extension's augmentation ops are not built (make ext)")
        return 2
    if not args.reference.exists():
        print(f"bench.augment: no stock-Pillow environment at {args.reference}; `make setup` "
              "builds it (or pass --reference PYTHON)")
        return 2
    return run_main("bench-augment", args.images, None, lambda s: run(args, s), print_table)


if __name__ == "__main__":
    raise SystemExit(main())
