"""The shard loader on every core: images/s of random-resized-crop at the run's size (224 px
on the GPU run) with ``workers="auto"`` (a worker a core, less one for the rank's own
process), against the same loader with one worker, scaled to the cores: the ratio to cores x
the one-worker rate (at most (cores - 1) / cores with ``auto``; reported, no target).

Both read the converted set from local disk, channels_last rows (the trainer's), batches
taken as the trainer takes them (``iter(loader)``: pinned where CUDA is); each loader's first
pass is its warm-up (worker start-up), then the two are timed in interleaved rounds.
"""

from __future__ import annotations

from typing import Any

from imgprep import World
from loaders import Loader, LoaderOptions, TrainTransform, make_loader, worker_count

from .context import Context
from .machine import cores
from .record import figure, plural
from .timing import batch_rate, median, rates, ratio_of


def timed(loader: Loader, epoch: int, limit: int) -> dict[str, float]:
    loader.set_epoch(epoch)
    return batch_rate(loader, limit)


def check(ctx: Context) -> dict[str, Any]:
    p = ctx.profile
    n = cores()
    auto = worker_count("auto", World())
    one, many = (make_loader(ctx.data(), "train", World(), LoaderOptions(
        batch_size=p.loader_batch, workers=w, seed=0, transform=TrainTransform(size=p.image_size),
        memory_format="channels_last")) for w in (1, auto))
    timed(one, 0, 2)  # warm-up: worker start-up
    timed(many, 0, 2 * auto)
    singles, alls = [], []
    for r in range(p.rounds):
        singles.append(timed(one, r + 1, p.one_worker_batches))
        alls.append(timed(many, r + 1, p.many_batches))
    value = ratio_of(rates(alls), [n * x for x in rates(singles)])
    c = "loader"
    rows = [
        figure(c, f"random-resized-crop {p.image_size}, batch {p.loader_batch}, 1 worker, "
                  "img/s", median(rates(singles))),
        figure(c, f"workers=auto ({plural(auto, 'worker')} on {n} cores), img/s",
               median(rates(alls))),
        figure(c, f"auto / ({n} x 1 worker)", f"{value:.3f}"),
    ]
    return {"rows": rows, "cores": n, "workers": auto, "one_worker": singles, "auto": alls,
            "ratio": value}
