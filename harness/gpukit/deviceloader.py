"""``DeviceLoader``: batches a second on the device against the loader alone, and the
normalised tensor against a CPU reference.

- Rate: the same epoch of one loader (the trainer's: channels_last rows, the default worker
  count, batch and image size of the run), taken alone and through ``DeviceLoader``, each
  batch made ready before the next is asked for (as the trainer does); on CUDA the copy to
  the GPU and the normalisation run on a side stream one batch ahead, so they should cost
  next to nothing: target >= 0.95 on the full GPU run. The loader alone is taken as
  ``DeviceLoader`` takes it, in place (no copy out of the workers' shared memory); on CUDA
  that memory is page-locked, which a row reports.
- Equality: the first batches of an epoch normalised by ``DeviceLoader`` on the device equal
  ``loaders.normalize`` of the same batches on the CPU, element for element, labels too.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

import torch

from imgprep import World
from loaders import (
    DeviceLoader,
    Loader,
    LoaderOptions,
    TrainTransform,
    make_loader,
    normalize,
    worker_count,
)

from .context import Context
from .record import figure, holds, plural, ratio
from .timing import batch_rate, median, rates, ratio_of

TARGET = 0.95
COMPARED = 2  # batches compared with the CPU reference


def reference(loader: Loader, epoch: int, count: int) -> list[tuple[torch.Tensor, ...]]:
    """The first ``count`` batches of ``epoch``, normalised on the CPU."""
    mean = torch.tensor(loader.mean, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(loader.std, dtype=torch.float32).view(1, 3, 1, 1)
    loader.set_epoch(epoch)
    return [(normalize(images, mean, std), labels.clone())
            for images, labels in islice(iter(loader), count)]


def compare(ctx: Context, loader: Loader, epoch: int) -> tuple[bool, str]:
    """Whether ``DeviceLoader``'s first batches equal the CPU reference; and how far off."""
    ref = reference(loader, epoch, COMPARED)
    loader.set_epoch(epoch)
    dev = DeviceLoader(loader, ctx.device, loader.mean, loader.std)
    got = [(x.cpu(), y.cpu()) for x, y in islice(iter(dev), COMPARED)]
    if len(got) != len(ref) or not ref:
        return False, f"{len(got)} batches against {len(ref)}"
    gap = max(float((g[0] - r[0]).abs().max()) for g, r in zip(got, ref, strict=True))
    labels = all(torch.equal(g[1], r[1]) for g, r in zip(got, ref, strict=True))
    same = labels and all(torch.equal(g[0], r[0]) for g, r in zip(got, ref, strict=True))
    layout = all(g[0].is_contiguous(memory_format=torch.channels_last) for g in got)
    detail = f"{len(got)} batches: largest difference {gap:.3g}, labels " \
             f"{'equal' if labels else 'differ'}, channels_last {'yes' if layout else 'no'}"
    return same and layout, detail


def check(ctx: Context) -> dict[str, Any]:
    p = ctx.profile
    workers = worker_count("auto", World())
    loader = make_loader(ctx.data(), "train", World(), LoaderOptions(
        batch_size=p.loader_batch, workers=workers, seed=0,
        transform=TrainTransform(size=p.image_size), memory_format="channels_last"))
    dev = DeviceLoader(loader, ctx.device, loader.mean, loader.std)
    ok, detail = compare(ctx, loader, 0)  # also the warm-up: the workers start here
    alone, through = [], []
    for r in range(p.rounds):
        loader.set_epoch(r + 1)
        alone.append(batch_rate(loader.in_place(), p.many_batches, ctx.sync))
        loader.set_epoch(r + 1)
        through.append(batch_rate(dev, p.many_batches, ctx.sync))
    value = ratio_of(rates(through), rates(alone))
    c = "deviceloader"
    rows = [
        figure(c, f"loader alone ({plural(workers, 'worker')}), batch {p.loader_batch}, "
                  "batches/s",
               median(rates(alone)) / p.loader_batch, 2),
        figure(c, f"DeviceLoader to {ctx.device}, batches/s",
               median(rates(through)) / p.loader_batch, 2),
        ratio(c, "DeviceLoader / loader alone", value, TARGET, ctx.targets_apply),
        holds(c, f"normalised on {ctx.device} = loaders.normalize on the CPU", ok, detail),
    ]
    if ctx.device != "cpu":
        rows.append(holds(c, "batches copied to the GPU straight from the workers' shared "
                             "memory (page-locked)", loader.page_locked,
                          "yes" if loader.page_locked else "no: copied out to pinned memory"))
    return {"rows": rows, "alone": alone, "device_loader": through, "ratio": value}
