"""``imgprep convert`` on every core: the synthetic ILSVRC2012-shaped train tar (``data``)
converted with a worker a core, against this machine's own one-process floor, and the
projection to the 1,281,167 train images against the 2.5-minute target.

The floor and the conversion are ``bench.convert``'s (``floor_one``: draft, the centre square
resized to 256 with LANCZOS, JPEG q90 encode, over preloaded bytes; ``time_convert``: an
in-process ``convert_splits`` into a fresh folder), interleaved in rounds. The projection is
the conversion's own rate (its planning included) at the measured cores, given twice: with
the PIL the machine has, and with the other one, by the pillow-simd / stock Pillow ratio of
the floor measured on the development machine (``SIMD_OVER_STOCK``). The target is judged on
the pillow-simd figure, the product's configuration; the row names which figure is measured
and which is derived.
"""

from __future__ import annotations

from typing import Any

from bench.convert import IMAGENET_TRAIN_IMAGES, floor_one, time_convert, time_loop
from imgprep import pil_info

from .context import Context
from .data import TRAIN_TAR, pool_blobs
from .machine import cores
from .record import below, figure
from .timing import median, ratio_of

# convert's floor (bench.convert.floor_one) with pillow-simd 12.1.1 built with AVX2 over the
# same with stock Pillow 13.0.0, on 64 JPEGs of the kit's pool, on the 2-core development
# machine: the median of 5 alternating pairs, 2.31 to 2.70 (docs/benchmarks.md, "GPU
# acceptance kit").
SIMD_OVER_STOCK = 2.41
TARGET_MINUTES = 2.5


def projection_rows(rate: float, workers: int, simd: bool, applies: bool) -> list[Any]:
    """Minutes for the full train set: measured with this PIL, derived for the other."""
    measured = IMAGENET_TRAIN_IMAGES / rate / 60
    c, at = "convert", f"{IMAGENET_TRAIN_IMAGES:,} images on {workers} cores"
    if simd:
        return [below(c, f"{at}, pillow-simd (measured), min", measured, TARGET_MINUTES,
                      applies),
                below(c, f"{at}, stock Pillow (derived: x {SIMD_OVER_STOCK}), min",
                      measured * SIMD_OVER_STOCK, TARGET_MINUTES, False)]
    return [below(c, f"{at}, stock Pillow (measured), min", measured, TARGET_MINUTES, False),
            below(c, f"{at}, pillow-simd (derived: / {SIMD_OVER_STOCK}), min",
                  measured / SIMD_OVER_STOCK, TARGET_MINUTES, applies)]


def check(ctx: Context) -> dict[str, Any]:
    p = ctx.profile
    folder = ctx.input()
    blobs = pool_blobs(folder, p.floor_images)
    workers = cores()
    time_loop(floor_one, blobs[: min(len(blobs), 16)])  # warm-up: imports, caches
    floors: list[float] = []
    converts: list[float] = []
    for _ in range(p.rounds):
        floors.append(time_loop(floor_one, blobs))
        converts.append(time_convert(folder / TRAIN_TAR, ctx.work / "convert-out", workers,
                                     None, p.images))
    rate = median(converts)
    efficiency = ratio_of(converts, [workers * f for f in floors])
    simd = pil_info(check_avx2=False).pillow_simd
    c = "convert"
    rows = [
        figure(c, "floor: one process, draft + centre 256 LANCZOS + q90, img/s",
               median(floors)),
        figure(c, f"convert --workers {workers}, {p.images:,} synthetic ILSVRC images, img/s",
               rate),
        figure(c, f"convert / ({workers} x floor)", f"{efficiency:.3f}"),
        *projection_rows(rate, workers, simd, ctx.targets_apply),
    ]
    return {"rows": rows, "workers": workers, "floor": floors, "convert": converts,
            "efficiency": efficiency, "pillow_simd": simd, "simd_over_stock": SIMD_OVER_STOCK}
