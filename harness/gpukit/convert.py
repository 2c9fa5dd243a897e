"""``imgprep convert`` on every core: the synthetic ILSVRC2012-shaped train tar (``data``)
converted with a worker a core, against this machine's own one-process floor and its
ceiling, and the projection to the 1,281,167 train images against the 2.5-minute target.

The floor and the conversion are ``bench.convert``'s (``floor_one``: the C extension's one
call per image, DCT-scaled decode, the centre square resized to 256 with LANCZOS, JPEG q90
encode, over preloaded bytes; ``time_convert``: an in-process ``convert_splits`` into a fresh
folder), interleaved in rounds. The ceiling is what the machine itself allows: as many
independent floor loops as there are cores, started together, each its own process with no
imgprep in between, their images over the wall time from the first start to the last end.
``convert / ceiling`` is the share of that which convert reaches; ``ceiling / (cores x
floor)`` is how the machine scales with every core busy (shared caches, memory, clocks), the
bound against which every many-worker ratio here (convert's, the loader's) is read.

Two rows tell whether the output disk is what holds convert back: the same conversion into
tmpfs (``/dev/shm``, no disk, where it has room), and the work folder's sequential write rate
(up to 1 GiB in 1 MB writes, fsync included) beside the MB/s convert writes at its
rate.

The projection is measured, never derived, whichever PIL is installed (the C path does not use
it for JPEGs). A run has a fixed cost (the workers' start, imports, finishing the manifest)
that a short synthetic run pays in full and the 1,281,167 images pay once: the same tar with
half the images, converted in the same rounds, separates it from the rate per image (the
marginal rate: the images the larger run adds over the seconds it adds, planning included).
The projection is the larger run's time plus the remaining images at the marginal rate; the
plain rate's projection is a row too.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.convert import IMAGENET_TRAIN_IMAGES, floor_one, time_convert, time_loop
from imgprep import pil_info

from .context import Context
from .data import HALF, TRAIN_TAR, pool_blobs
from .machine import cores
from .record import Row, below, figure
from .timing import median, ratio_of

TARGET_MINUTES = 2.5
TMPFS = Path("/dev/shm")
OUT_BYTES_PER_IMAGE = 60_000  # room asked of tmpfs per image (outputs are ~40 kB)
DISK_TEST_MB = 1024


_BLOBS: list[Sequence[bytes]] = []  # the floor's bytes, inherited by the forked loops


def _floor_span(start: Any) -> tuple[float, float]:
    """One floor loop in this process after every loop is ready: its start and end."""
    start.wait()
    t0 = time.perf_counter()
    time_loop(floor_one, _BLOBS[0])
    return t0, time.perf_counter()


def ceiling(blobs: Sequence[bytes], loops: int) -> float:
    """Images per second of ``loops`` floor loops at once, one process each, forked with the
    module and the bytes already in memory; from the first start to the last end."""
    ctx = multiprocessing.get_context("fork")
    _BLOBS[:] = [blobs]
    try:
        with ctx.Manager() as manager:
            start = manager.Barrier(loops)
            with ctx.Pool(loops) as pool:
                spans = pool.map(_floor_span, [start] * loops)
    finally:
        _BLOBS.clear()
    first, last = min(s for s, _ in spans), max(e for _, e in spans)
    return loops * len(blobs) / (last - first)


def tmpfs_room(images: int) -> Path | None:
    """``/dev/shm`` when it is a writable folder with room for ``images`` outputs, else None."""
    try:
        room = shutil.disk_usage(TMPFS).free
    except OSError:
        return None
    ok = TMPFS.is_dir() and os.access(TMPFS, os.W_OK) and room > images * OUT_BYTES_PER_IMAGE
    return TMPFS if ok else None


def disk_write_mbps(folder: Path, mb: int = DISK_TEST_MB) -> float:
    """MB/s of a ``mb`` MB sequential write into ``folder`` in 1 MB writes, fsync included."""
    path = folder / "disk-write-test"
    chunk = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        for _ in range(mb):
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
        return mb * (1 << 20) / 1e6 / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def check(ctx: Context) -> dict[str, Any]:
    p = ctx.profile
    folder = ctx.input()
    blobs = pool_blobs(folder, p.floor_images)
    workers = cores()
    time_loop(floor_one, blobs[: min(len(blobs), 16)])  # warm-up: imports, caches
    floors: list[float] = []
    ceilings: list[float] = []
    converts: list[float] = []
    halves: list[float] = []
    in_ram: list[float] = []
    half = p.images // 2
    shm = tmpfs_room(p.images)
    for _ in range(p.rounds):
        floors.append(time_loop(floor_one, blobs))
        ceilings.append(ceiling(blobs, workers))
        converts.append(time_convert(folder / TRAIN_TAR, ctx.work / "convert-out", workers,
                                     None, p.images))
        halves.append(time_convert(folder / HALF / TRAIN_TAR, ctx.work / "convert-out",
                                   workers, None, half))
        if shm is not None:
            in_ram.append(time_convert(folder / TRAIN_TAR, shm / "imgprep-convert-out",
                                       workers, None, p.images))
    out_bytes = sum(len(floor_one(b)) for b in blobs) / len(blobs)
    disk = disk_write_mbps(ctx.work, min(DISK_TEST_MB, max(
        16, p.images * OUT_BYTES_PER_IMAGE >> 20)))
    rate = median(converts)
    many = [workers * f for f in floors]
    pil = pil_info(check_avx2=False)
    c = "convert"
    seconds, fixed, marginal = _fixed_and_marginal(p.images, rate, half, median(halves))
    minutes = (seconds + (IMAGENET_TRAIN_IMAGES - p.images) / marginal) / 60
    rows = [
        figure(c, "floor: one process, the C path's call (decode, centre 256 LANCZOS, q90), "
                  "img/s", median(floors)),
        figure(c, f"ceiling: {workers} floor loops at once, one process each, img/s",
               median(ceilings)),
        figure(c, f"convert --workers {workers}, {p.images:,} synthetic ILSVRC images, img/s",
               rate),
        figure(c, f"ceiling / ({workers} x floor)", f"{ratio_of(ceilings, many):.3f}"),
        figure(c, f"convert / ({workers} x floor)", f"{ratio_of(converts, many):.3f}"),
        figure(c, "convert / ceiling", f"{ratio_of(converts, ceilings):.3f}"),
        *_disk_rows(c, workers, in_ram, ceilings, disk, rate * out_bytes / 1e6),
        figure(c, f"fixed cost of a run (from {half:,} and {p.images:,} images), s", fixed, 2),
        figure(c, "marginal rate (past the fixed cost), img/s", marginal),
        figure(c, "marginal rate / ceiling", f"{marginal / median(ceilings):.3f}"),
        figure(c, f"{IMAGENET_TRAIN_IMAGES:,} images at the {p.images:,}-image run's plain "
                  "rate, min", IMAGENET_TRAIN_IMAGES / rate / 60),
        below(c, f"{IMAGENET_TRAIN_IMAGES:,} images on {workers} cores (measured: fixed cost "
                 f"+ marginal rate, PIL {pil.pil_version}), min", minutes, TARGET_MINUTES,
              ctx.targets_apply),
    ]
    return {"rows": rows, "workers": workers, "floor": floors, "ceiling": ceilings,
            "convert": converts, "half": halves, "in_ram": in_ram, "disk_mbps": disk,
            "out_bytes_per_image": out_bytes, "fixed_s": fixed, "marginal": marginal,
            "minutes": minutes, "pillow_simd": pil.pillow_simd, "crop_decode": pil.crop_decode}


def _disk_rows(c: str, workers: int, in_ram: list[float], ceilings: list[float],
               disk: float, writes: float) -> list[Row]:
    """The rows that tell the output disk's part: convert into tmpfs, the disk's write rate
    and what convert writes."""
    rows = [figure(c, "output disk (the work folder): sequential write, MB/s", disk),
            figure(c, "what convert writes at its rate, MB/s", writes)]
    if in_ram:
        rows[:0] = [
            figure(c, f"convert --workers {workers}, output in tmpfs ({TMPFS}), img/s",
                   median(in_ram)),
            figure(c, "convert in tmpfs / ceiling", f"{ratio_of(in_ram, ceilings):.3f}")]
    return rows


def _fixed_and_marginal(n: int, rate: float, half: int, half_rate: float
                        ) -> tuple[float, float, float]:
    """The larger run's seconds, the fixed cost of a run and the marginal rate, from the
    rates of converting ``n`` and ``half`` images. Where the larger run is not slower (too
    small to tell), no fixed cost: the plain rate."""
    seconds, half_seconds = n / rate, half / half_rate
    if seconds <= half_seconds:
        return seconds, 0.0, rate
    marginal = (n - half) / (seconds - half_seconds)
    return seconds, max(0.0, seconds - n / marginal), marginal
