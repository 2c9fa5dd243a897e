"""A CPU load that is the loader itself: ``python -m harness.gpukit.burn DATA --size PX
--batch N --seconds S`` iterates the Pillow loader over DATA (``workers="auto"`` as before:
the cores less one, nothing pinned, nice 0) and drops its batches, epoch after epoch, until
S seconds have passed or it is stopped. The ``feed`` check runs the trainer on synthetic
batches beside it: the loader's load without its data (``harness.gpukit.feed``)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from imgprep import World
from loaders import LoaderOptions, TrainTransform, make_loader


def burn(data: Path, size: int, batch: int, seconds: float) -> int:
    """Batches made before ``seconds`` ran out."""
    options = LoaderOptions(batch_size=batch, transform=TrainTransform(size=size),
                            memory_format="channels_last", pin_cpus=False, worker_nice=0,
                            pin_memory=False)  # no CUDA context: the trainer's GPU alone
    ld = make_loader(data, "train", World.single(), options)
    end, made, epoch = time.monotonic() + seconds, 0, 0
    while time.monotonic() < end:
        ld.set_epoch(epoch)
        for _ in ld.in_place():
            made += 1
            if time.monotonic() >= end:
                break
        epoch += 1
    return made


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.gpukit.burn",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=600.0)
    args = ap.parse_args(argv)
    print(f"burn: {burn(args.data, args.size, args.batch, args.seconds)} batches", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
