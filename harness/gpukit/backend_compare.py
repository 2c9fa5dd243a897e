"""What the GPU decoder checks (``dali``, ``nvjpeg``) share: a train loader of the kit's
converted set on a backend (on the GPU where the kit runs on CUDA), and the check that such a
backend gives every rank of a 2-rank World, step by step, the samples the Pillow backend
gives it."""

from __future__ import annotations

from itertools import islice

from imgprep import World
from loaders import Loader, LoaderOptions, TrainTransform, make_loader

from .context import Context

STEPS = 3  # compared per rank
GPU_BACKENDS = ("dali", "nvjpeg")


def loader(ctx: Context, world: World, backend: str, workers: int) -> Loader:
    """The kit's train loader on ``backend``, channels_last."""
    device = "gpu" if backend in GPU_BACKENDS and ctx.device == "cuda" else "cpu"
    return make_loader(ctx.data(), "train", world, LoaderOptions(
        batch_size=ctx.profile.loader_batch, workers=workers, seed=0,
        transform=TrainTransform(size=ctx.profile.image_size), backend=backend, device=device,
        memory_format="channels_last"))


def steps(ld: Loader) -> list[tuple[list[int], tuple[int, ...], str]]:
    """The first steps' labels, image shape and dtype."""
    ld.set_epoch(0)
    return [(labels.cpu().tolist(), tuple(images.shape), str(images.dtype))
            for images, labels in islice(iter(ld), STEPS)]


def same_samples(ctx: Context, backend: str) -> tuple[bool, str]:
    """Whether ``backend`` gives each of 2 ranks Pillow's first steps, and what differed."""
    ranks = [World(rank=r, world_size=2, local_rank=0, local_world_size=1, node_rank=r,
                   num_nodes=2) for r in (0, 1)]
    diffs = [f"rank {w.rank}" for w in ranks
             if (pil := steps(loader(ctx, w, "pillow", 1))) != steps(loader(ctx, w, backend, 1))
             or not pil]
    return not diffs, "; ".join(diffs) + " differ" if diffs else \
        f"2 ranks x {STEPS} steps: labels, shapes, dtype equal"
