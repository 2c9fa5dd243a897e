"""Benchmark the shard loader against its own floor, a webdataset peer and (optionally) FFCV.

What it measures, in one run, on the 1000 real ILSVRC2012 JPEGs of
``<repo>/../shared/data/imagenet-sample/images`` (``--images`` to point elsewhere):

- data: the images converted once with ``imgprep.convert.run`` (256 px, the defaults) into shards
  of 250 samples, then repeated into more shards whose samples are the same converted bytes
  under new keys (``r01-<key>``, ...; written with ``imgprep.shards.writers.ShardWriter``,
  listed in a manifest) until the set holds ``--samples`` (default 10,000). All of it lives
  in a scratch folder that is removed at the end; the images are never copied into the repository.
- floor: a tight one-process loop over the converted JPEG bytes preloaded in memory doing
  exactly the loader's per-sample work, ``loaders.SampleDecoder`` (the crop-aware decode of
  the random-resized-crop's region, one ``resize(box=...)`` to 224, flip and layout in one
  pass: uint8 CHW; ``floor_cl``: HWC, for the channels-last rows) into a preallocated batch
  array. No I/O, no processes. (Without the C extension the decoder takes the Pillow path.)
- loader: ``loaders.shards.ShardLoader(folder, "train", World(), LoaderOptions(batch_size,
  workers=1|2, seed=0))`` iterating whole epochs; and the same samples written as ONE shard
  read by 2 workers (fewer shards than workers: sample-granular plans keep both busy). Its
  workers are
  persistent: the first epoch (timed alone: first-batch latency with worker start-up, and its
  rate) is the warm-up, and every timed pass is a later epoch, end to end, so steady rates
  exclude worker start-up but include each epoch's pipeline fill.
- dali: the same ``ShardLoader`` with ``backend="dali"`` on the CPU (NVIDIA DALI decodes,
  random-resized-crops, resizes and flips in ``num_threads`` threads of the loader's process,
  fed the plan's samples by ``os.pread``; ``loaders.dali``), with as many threads as the
  Pillow rows have workers (1 and 2), the same plan, data and batch size; each epoch builds a
  DALI pipeline, inside the timed pass. Left out when DALI is not installed (``pip install
  'imgprep[dali]'``) or with ``--no-dali``; the DALI / Pillow ratios are reported, no target.
- peer, what a user writes instead: ``webdataset.WebDataset(urls, shardshuffle=False)
  .decode("pil").to_tuple("jpg", "cls").map(transform)`` (shards split over workers by
  webdataset's own ``split_by_worker``) where ``transform`` is the usual torchvision recipe
  written without torchvision: random-resized-crop on the fully decoded PIL image (the same
  box sampling as ``loaders.transforms.crop_box``, then ``crop(box).resize((224, 224),
  BILINEAR)``), a random horizontal flip (``transpose``), then
  ``torch.from_numpy(np.asarray(img)).permute(2, 0, 1)``; batched by a ``torch`` DataLoader
  with the same batch size and worker count (persistent workers, default collate). The peer
  does not shuffle samples; the loader does (a permutation of all samples each epoch, read by
  offset through the sample index), so the comparison does not favour the loader.
- FFCV 1.0.2 (``bench.ffcv_peer``), with ``--ffcv-python`` (or ``$IMGPREP_FFCV_PYTHON``), the
  python of FFCV's own virtualenv, in a process of its own: the set's JPEG bytes and labels
  stored as they are in a .beton (checked by a digest of what FFCV reads back), one FFCV
  ``Loader`` per worker count (``num_workers`` threads; ``RandomResizedCropRGBImageDecoder
  ((224, 224))``, ``RandomHorizontalFlip()``, ``ToTensor()``: uint8 NHWC; random order, full
  batches, the same batch size), each epoch timed end to end in FFCV's process.
  ``vs_ffcv_<w>w``: the loader over FFCV at as many workers, ``loader_cl_<w>w``: the loader
  with ``memory_format="channels_last"`` (NHWC in memory, as FFCV's) iterated with
  ``in_place()`` (each batch a view of the workers' shared memory, valid until the next is
  asked for, as FFCV's batches are views of its reused buffers). Without FFCV one line says
  its rows are skipped, and how not.

Targets: loader 1 worker >= 0.95 x floor; channels-last loader 1 worker >= 0.9 x its floor;
loader 2 workers >= 1.89 x loader 1 worker; loader >= 1.65 x peer at 1 and at 2 workers; one
shard read by 2 workers >= 1.7 x loader 1 worker; with FFCV, the channels-last loader >= 1.1
x FFCV at 1 and at 2 workers.
Rates per core divide by min(workers, cores); with 2 workers on 2 cores the main process
(which receives and reorders batches) shares the CPUs, so the table says how many cores the
main process and the whole process tree kept busy, and the tree's CPU time per image (what
caps the 2-worker rate once both cores are full). After the warm-up every measure runs once
per round, ``--repeat`` rounds interleaved; each pass records how much CPU other processes
took meanwhile (from /proc/stat, steal included, minus this process tree's own CPU), and
rates are medians over the passes nobody disturbed (up to 2 rounds are added to get enough
of those while time allows; all passes count when none was quiet, and the output then says
it is unreliable); every ratio is the median over rounds of that round's own ratio, so a slow
spell of a shared machine weighs on both sides of it. Peak RSS (VmHWM) of every worker is
read from /proc before the workers are shut down. A compact table goes to stdout and the last
line of stdout is one JSON object with every figure. Linux only.

``--augment NAME``: instead, an augmentation policy's cost per image (``loaders.augment``:
``ta_wide``, ``ra``, ``aa-imagenet``, a timm ``rand-...`` string) against plain RRC 224 in the
same run, floor and 1-worker loader (``bench.loader_augment``); the same JSON line form
(``"mode": "augment"``).
``--stores``: instead, the loader by storage mode (``convert --store``) and FFCV in each of
its own (``bench.loader_stores``).

``--sizes``: instead, the cost per image at each output size of a resolution schedule
(128, 160, 192, 224 px; ``bench.loader_sizes``), floor and 1-worker loader, with the target
160 px <= 0.7 x 224 px, what a worker restart per size change would cost and the ring's
memory per size; the same JSON line form (``"mode": "sizes"``).

Run (from the repository root, in the project's environment)::

    python -m bench.loader                            # full run, ~2 min on 2 cores
    python -m bench.loader --samples 3000 --repeat 1  # a quick look
    python -m bench.loader --sizes --samples 2000     # cost per image by output size
    python -m bench.loader --augment ta_wide --samples 2000  # a policy's cost over RRC
    python -m bench.loader --ffcv-python VENV/bin/python  # with FFCV (docs/benchmarks.md)

Exit code 2 when the image folder is missing.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import os
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import webdataset as wds
from PIL import Image
from torch.utils.data import DataLoader, get_worker_info

from bench import ffcv_peer, loader_augment, loader_sizes, loader_stores
from bench.common import (
    DEFAULT_IMAGES,
    QUIET_FOREIGN_CORES,
    descendants,
    machine_busy_s,
    paired_ratio,
    proc_kb,
    run_main,
    timed_epoch,
    verdict,
)
from imgprep import (
    ConvertOptions,
    Manifest,
    ShardEntry,
    TransformOptions,
    World,
    convert_splits,
    pil_info,
    read_manifest,
)
from imgprep.shards.index import write_index
from imgprep.shards.layout import Layout
from imgprep.shards.manifest import write_manifest
from imgprep.shards.tario import iter_samples
from imgprep.shards.writers import ShardWriter
from loaders import (
    AUGMENT_POLICIES,
    LoaderOptions,
    SampleDecoder,
    ShardLoader,
    TrainTransform,
    augment_policy,
)
from loaders.transforms import crop_box

SPLIT = "train"
SHARD_SAMPLES = 250  # samples per shard: 20 shards per worker at 10,000 samples and 2 workers
WORKER_COUNTS = (1, 2)
TARGETS = {
    "loader_1w_over_floor": 0.95,
    "loader_2w_over_1w": 1.89,
    "loader_1w_over_peer_1w": 1.65,
    "loader_2w_over_peer_2w": 1.65,
    "loader_1shard_2w_over_1w": 1.7,
    "loader_cl_1w_over_floor_cl": 0.9,
    "vs_ffcv_1w": 1.1,  # with FFCV only
    "vs_ffcv_2w": 1.1,
}
EXTRA_ROUNDS = 2  # rounds added (at most) while some measure lacks quiet passes...
EXTRA_ROUNDS_BEFORE_S = 150.0  # ...and only while the run is younger than this
MB = 1e6
TICK = os.sysconf("SC_CLK_TCK")
BILINEAR = Image.Resampling.BILINEAR
FLIP = Image.Transpose.FLIP_LEFT_RIGHT
TRAIN = TrainTransform()

Batch = tuple[torch.Tensor, ...]  # (images, labels), or with batch-level draws third


# ---------------------------------------------------------------------------- data


def write_set(folder: Path, m: Manifest, shards: list[tuple[ShardEntry, Layout]]) -> None:
    """The manifest and sample index of ``shards`` written in ``folder``."""
    entries = [e for e, _ in shards]
    write_manifest(folder, replace(m, shards=entries, total_samples=sum(e.samples for e in entries),
                                   index=write_index(folder, SPLIT, entries,
                                                     [lay for _, lay in shards])))


def one_shard(folder: Path, scratch: Path) -> Path:
    """The samples of ``folder`` written again as a single shard."""
    m = read_manifest(folder, SPLIT)
    one = scratch / "one"
    one.mkdir()
    with ShardWriter(one / f"{SPLIT}-000000.tar") as w:
        for s in m.shards:
            for key, fields in iter_samples(folder / s.name):
                w.add(key, fields)
    write_set(one, m, [(ShardEntry(w.path.name, w.samples, w.bytes, w.sha256), w.layout())])
    return one


def build_shards(images: Path, scratch: Path, samples: int, limit: int | None,
                 store: int | None = None) -> tuple[Path, list[bytes]]:
    """Convert ``images`` once (``imgprep convert``'s defaults, or with ``store`` their
    short side resized to that, the aspect kept), then repeat the converted samples under new
    keys into more shards until the set holds >= ``samples``; returns the folder and the
    distinct JPEGs."""
    src: Path = images
    if limit is not None:
        src = scratch / "images"
        src.mkdir()
        for p in sorted(q for q in images.iterdir() if q.suffix.lower() in (".jpeg", ".jpg")
                        )[:limit]:
            os.symlink(p, src / p.name)
    base = scratch / "base"
    listed = sum(1 for p in src.iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
    transform = TransformOptions() if store is None else TransformOptions(
        size=store, resize="short-side")
    summary = convert_splits(ConvertOptions(
        input=src, out=base, workers=os.cpu_count() or 1, transform=transform,
        num_shards=max(1, math.ceil(listed / SHARD_SAMPLES))))[0]
    if not summary.complete or summary.errors:
        raise SystemExit(f"bench_loader: converting {images} failed: "
                         f"{json.dumps(asdict(summary), sort_keys=True)}")
    m = read_manifest(base, SPLIT)
    data = scratch / "shards"
    data.mkdir()
    shards: list[tuple[ShardEntry, Layout]] = []
    blobs: list[bytes] = []
    copy = 0
    while sum(e.samples for e, _ in shards) < samples:
        for s in m.shards:
            name = f"{SPLIT}-{len(shards):06d}.tar"
            with ShardWriter(data / name) as w:
                for key, fields in iter_samples(base / s.name):
                    w.add(f"r{copy:02d}-{key}", fields)
                    if copy == 0:
                        blobs.append(fields["jpg"])
            shards.append((ShardEntry(name, w.samples, w.bytes, w.sha256), w.layout()))
        copy += 1
    write_set(data, m, shards)
    shutil.rmtree(base)
    return data, blobs


# ---------------------------------------------------------------------------- CPU accounting


def _stat_ticks(pid: int | str) -> tuple[int, int]:
    """(utime + stime, cutime + cstime) of ``pid`` in clock ticks; zeros if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def cpu_s() -> tuple[float, float]:
    """(CPU seconds of this process, of this whole process tree including reaped children)."""
    own, reaped = _stat_ticks("self")
    live = sum(sum(_stat_ticks(p)) for p in descendants())
    return own / TICK, (own + reaped + live) / TICK


def measured(fn: Callable[[], dict[str, float]]) -> dict[str, float]:
    """Run one pass; add the cores this run's main process and whole tree kept busy, and how
    many cores other processes on the machine kept busy meanwhile."""
    b0, (m0, t0_cpu), t0 = machine_busy_s(), cpu_s(), time.perf_counter()
    res = fn()
    dt = time.perf_counter() - t0
    b1, (m1, t1_cpu) = machine_busy_s(), cpu_s()
    tree = t1_cpu - t0_cpu
    main = res.pop("process_cores", (m1 - m0) / dt)  # FFCV's process times its own
    return {**res, "main_cores": main, "tree_cores": tree / dt,
            "foreign_cores": max(0.0, ((b1 - b0) - tree) / dt)}


# ---------------------------------------------------------------------------- the floor


def floor_pass(blobs: Sequence[bytes], n: int, batch: int, channels_last: bool = False
               ) -> dict[str, float]:
    """The loader's per-sample work on preloaded bytes, one process, into a reused batch."""
    decode = SampleDecoder(TRAIN, channels_last=channels_last)
    row = (TRAIN.size, TRAIN.size, 3) if channels_last else (3, TRAIN.size, TRAIN.size)
    out = np.empty((batch, *row), dtype=np.uint8)
    rng = np.random.default_rng(0)
    k = len(blobs)
    t0 = time.perf_counter()
    for i in range(n):
        decode(blobs[i % k], rng, out[i % batch])
    return {"rate": n / (time.perf_counter() - t0), "images": n}


# ---------------------------------------------------------------------------- the peer

_peer_rng = np.random.default_rng(0)


def _peer_worker_init(worker_id: int) -> None:
    global _peer_rng
    info = get_worker_info()
    _peer_rng = np.random.default_rng(info.seed if info is not None else worker_id)
    # np.asarray(PIL image) is read-only; torch warns once per worker about that.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def peer_transform(sample: tuple[Image.Image, int]) -> tuple[torch.Tensor, int]:
    """torchvision's RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor, by hand."""
    img, label = sample
    w, h = img.size
    left, top, right, bottom = crop_box(w, h, TRAIN, _peer_rng)
    img = img.crop((int(left), int(top), int(right), int(bottom)))
    img = img.resize((TRAIN.size, TRAIN.size), BILINEAR)
    if _peer_rng.random() < 0.5:
        img = img.transpose(FLIP)
    return torch.from_numpy(np.asarray(img)).permute(2, 0, 1), label


def make_peer(folder: Path, batch: int, workers: int) -> DataLoader[Any]:
    urls = [str(p) for p in sorted(folder.glob(f"{SPLIT}-*.tar"))]
    ds = (wds.WebDataset(urls, shardshuffle=False)
          .decode("pil").to_tuple("jpg", "cls").map(peer_transform))
    return DataLoader(ds, batch_size=batch, num_workers=workers,
                      persistent_workers=workers > 0, worker_init_fn=_peer_worker_init)


# ---------------------------------------------------------------------------- epochs


def nchw_problem(images: torch.Tensor) -> str | None:
    if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, TRAIN.size, TRAIN.size):
        return f"{images.dtype} {tuple(images.shape)}, not uint8 NCHW"
    return None


def epoch_pass(batches: Iterable[Batch]) -> dict[str, float]:
    """One epoch end to end: images/s, first-batch latency, and the rate after it."""
    return timed_epoch(batches, nchw_problem)


def loader_epoch(loader: ShardLoader, epoch: int) -> dict[str, float]:
    loader.set_epoch(epoch)
    cl = loader.options.channels_last
    return epoch_pass(loader.in_place() if cl else loader)


# ---------------------------------------------------------------------------- report


def quiet(passes: list[dict[str, float]]) -> list[dict[str, float]]:
    """The passes no other process disturbed (all of them if none was quiet)."""
    return [p for p in passes if p["foreign_cores"] < QUIET_FOREIGN_CORES] or passes


def med(passes: list[dict[str, float]], key: str = "rate") -> float:
    return statistics.median(p[key] for p in quiet(passes))


def summarise(passes: list[dict[str, float]], workers: int, cores: int) -> dict[str, Any]:
    rate = med(passes)
    out: dict[str, Any] = {
        "median": round(rate, 1),
        "per_core": round(rate / min(max(workers, 1), cores), 1),
        "median_all_passes": round(statistics.median(p["rate"] for p in passes), 1),
        "best": round(max(p["rate"] for p in passes), 1),
        "passes": [round(p["rate"], 1) for p in passes],
        "foreign_cores": [round(p["foreign_cores"], 2) for p in passes],
        "quiet_passes": sum(1 for p in passes if p["foreign_cores"] < QUIET_FOREIGN_CORES),
        "main_process_cores": round(med(passes, "main_cores"), 2),
        "tree_cores": round(med(passes, "tree_cores"), 2),
        "cpu_ms_per_image": round(statistics.median(
            1000 * p["tree_cores"] / p["rate"] for p in quiet(passes)), 3),
        "images_per_pass": int(passes[0]["images"]),
    }
    if "first_batch_s" in passes[0]:
        out["first_batch_s"] = round(med(passes, "first_batch_s"), 3)
        out["rate_after_first_batch"] = round(med(passes, "rate_after_first_batch"), 1)
    return out


LABELS = {
    "floor": "floor: SampleDecoder CHW, preloaded, 1 core",
    "floor_cl": "floor: SampleDecoder HWC, preloaded, 1 core",
    "loader_1w": "ShardLoader workers=1 (epoch e2e)",
    "loader_2w": "ShardLoader workers=2 (epoch e2e)",
    "loader_cl_1w": "ShardLoader workers=1, channels_last, in place",
    "loader_cl_2w": "ShardLoader workers=2, channels_last, in place",
    "loader_1shard_2w": "ShardLoader workers=2, ONE shard",
    "dali_1w": "ShardLoader DALI CPU, num_threads=1",
    "dali_2w": "ShardLoader DALI CPU, num_threads=2",
    "peer_1w": "webdataset+DataLoader workers=1",
    "peer_2w": "webdataset+DataLoader workers=2",
    "ffcv_1w": "FFCV Loader num_workers=1",
    "ffcv_2w": "FFCV Loader num_workers=2",
}


def print_table(res: dict[str, Any]) -> None:
    r, pil = res["rates"], res["pil"]
    print(f"loader benchmark: {res['samples']:,} samples in {res['shards']} shards "
          f"({res['shards_mb']:.0f} MB; {res['distinct_images']} distinct 256 px JPEGs "
          f"converted from {res['images_dir']}), batch {res['batch_size']}")
    print(f"PIL {pil['pil_version']} pillow-simd={pil['pillow_simd']} "
          f"libjpeg-turbo={pil['libjpeg_turbo']}; torch {res['torch']}; webdataset "
          f"{res['webdataset']}; {res['cpus']} CPUs; {res['rounds']} interleaved rounds "
          f"after a warm-up epoch each; load average {res['loadavg_start']} -> "
          f"{res['loadavg_end']}")
    print()
    print(f"{'rates (images/s)':40s} {'median*':>8s} {'/core':>7s} {'best':>7s} "
          f"{'main':>5s} {'tree':>5s} {'cpu ms':>6s}  passes (! = disturbed)")
    for k, label in LABELS.items():
        if k not in r:
            continue
        v = r[k]
        marks = ("" if f < QUIET_FOREIGN_CORES else "!" for f in v["foreign_cores"])
        print(f"{label:40s} {v['median']:8.1f} {v['per_core']:7.1f} {v['best']:7.1f} "
              f"{v['main_process_cores']:5.2f} {v['tree_cores']:5.2f} "
              f"{v['cpu_ms_per_image']:6.3f}  "
              f"{' '.join(f'{p:.0f}{m}' for p, m in zip(v['passes'], marks, strict=True))}")
    print(f"* median of the passes during which other processes used < {QUIET_FOREIGN_CORES} "
          "cores (of all passes when none was that quiet); /core = rate / min(workers, "
          f"{res['cpus']} cores); main, tree = cores kept busy by the main process (FFCV's: "
          "its own) and by this run's process tree; cpu ms = CPU time of the tree per image")
    if res["noisy"]:
        print("WARNING: other processes kept the CPUs busy during most passes; the rates and "
              "ratios below are unreliable: rerun on an idle machine")
    print()
    print(f"{'latency and start-up':40s} {'1st batch':>10s} {'epoch 1':>9s} "
          f"{'later 1st':>10s} {'after 1st':>10s}")
    for k in (k for k in LABELS if k in res["cold"]):
        c, v = res["cold"][k], r[k]
        print(f"{LABELS[k]:40s} {c['first_batch_s']:9.3f}s {c['rate']:9.1f} "
              f"{v['first_batch_s']:9.3f}s {v['rate_after_first_batch']:10.1f}")
    print("(1st batch and epoch 1 images/s: the first epoch, worker start-up included; later "
          "1st: first-batch latency of later epochs on persistent workers; after 1st: "
          "images/s from the first batch to the last, median)")
    print()
    print(f"{'ratio':32s} {'value':>8s} {'target':>9s}  result")
    for k, v in res["ratios"].items():
        target = "" if v["target"] is None else f">= {v['target']}"
        print(f"{k:32s} {v['value']:8.3f} {target:>9s}  {v['result']}")
    if res["dali"] is None:
        print("(no DALI rows: NVIDIA DALI is not installed or --no-dali was given)")
    else:
        print(f"(DALI {res['dali']}: decodes in threads of the loader's process, one pipeline "
              "built per epoch)")
    print(ffcv_peer.table_line(res["ffcv"]))
    print()
    mem = res["memory"]
    print("peak RSS (VmHWM) per worker, MB (PSS at the end in brackets): "
          + "; ".join(f"{k}: " + (", ".join(f"{w['peak_rss_mb']:.0f} ({w['pss_mb']:.0f})"
                                            for w in v) or "none (threads)")
                      for k, v in mem["workers"].items())
          + f"; main process peak {mem['main_peak_rss_mb']:.0f}")


# ---------------------------------------------------------------------------- main


def dali_version() -> str:
    import nvidia.dali

    return str(nvidia.dali.__version__)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES,
                    help="folder of <wnid>_<name>.JPEG files (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="timed passes of every measurement; the median is reported (default 3)")
    ap.add_argument("--samples", type=int, default=10_000,
                    help="samples in the shard set (the converted images repeated; default "
                         "%(default)s)")
    ap.add_argument("--batch-size", type=int, default=64, help="default %(default)s")
    ap.add_argument("--limit", type=int, default=None,
                    help="convert only the first N images (sorted by name)")
    ap.add_argument("--dali", action=argparse.BooleanOptionalAction,
                    default=importlib.util.find_spec("nvidia") is not None
                    and importlib.util.find_spec("nvidia.dali") is not None,
                    help="add the DALI CPU backend's rows (default: when DALI is installed)")
    ap.add_argument("--ffcv-python", default=os.environ.get(ffcv_peer.ENV) or None,
                    metavar="PATH", help="python of a virtualenv holding FFCV 1.0.2, for the "
                    f"FFCV rows (default: ${ffcv_peer.ENV}; none: the rows are skipped)")
    ap.add_argument("--out", type=Path, default=None,
                    help="parent of the scratch folder (default: the system's temporary "
                         "folder); the scratch folder is removed afterwards")
    ap.add_argument("--sizes", action="store_true",
                    help="only the cost per image at each output size (bench.loader_sizes)")
    ap.add_argument("--store-size", type=int, default=None, metavar="PX",
                    help="convert the images with their short side resized to PX (aspect "
                         "kept: shards as a resolution schedule's recipes store them) instead "
                         "of the default 256 px centre crop")
    ap.add_argument("--augment", default=None, metavar="NAME",
                    help="only an augmentation policy's cost over plain RRC (bench."
                         f"loader_augment): one of {', '.join(AUGMENT_POLICIES)}, ra-nN-mM "
                         "or a timm rand-... string")
    ap.add_argument("--stores", action="store_true",
                    help="instead: the loader by storage mode (convert --store), and FFCV in "
                         "each of its own (bench.loader_stores)")
    ap.add_argument("--size-list", type=lambda t: [int(x) for x in t.split(",")],
                    default=list(loader_sizes.SIZES), metavar="S,S,...",
                    help="the sizes of --sizes (default: %(default)s)")
    args = ap.parse_args(argv)
    if (args.repeat < 1 or args.samples < 1 or args.batch_size < 1
            or (args.limit is not None and args.limit < 1)):
        ap.error("--repeat, --samples, --batch-size and --limit must be >= 1")
    if args.augment:
        try:
            augment_policy(args.augment)
        except ValueError as e:
            ap.error(f"--augment: {e}")
    return args


def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    start = time.perf_counter()
    load0 = os.getloadavg()
    cores = os.cpu_count() or 1
    folder, blobs = build_shards(args.images, scratch, args.samples, args.limit)
    m = read_manifest(folder, SPLIT)
    n = m.total_samples
    batch = args.batch_size

    # Loaders first, so that their workers fork before the floor's bytes are loaded here;
    # the first epoch of each is the warm-up (worker start-up, page cache, imports).
    def opts(workers: int, **more: Any) -> LoaderOptions:
        return LoaderOptions(batch_size=batch, workers=workers, seed=0, **more)

    loaders = {f"loader_{w}w": ShardLoader(folder, SPLIT, World(), opts(w))
               for w in WORKER_COUNTS}
    loaders["loader_1shard_2w"] = ShardLoader(one_shard(folder, scratch), SPLIT, World(),
                                              opts(2))
    if args.dali:  # as many DALI threads as the Pillow rows have workers
        loaders |= {f"dali_{w}w": ShardLoader(folder, SPLIT, World(), opts(w, backend="dali"))
                    for w in WORKER_COUNTS}
    # the rows FFCV's NHWC batches are compared with
    loaders |= {f"loader_cl_{w}w": ShardLoader(folder, SPLIT, World(),
                                               opts(w, memory_format="channels_last"))
                for w in WORKER_COUNTS}
    peers = {f"peer_{w}w": make_peer(folder, batch, w) for w in WORKER_COUNTS}
    ffcv, ffcv_rows, ffcv_info = ffcv_peer.setup(args.ffcv_python, folder, SPLIT, scratch,
                                                 batch, WORKER_COUNTS)
    cold: dict[str, dict[str, float]] = {}
    pids: dict[str, set[int]] = {}
    for name in (*loaders, *peers, *ffcv_rows):
        before = descendants()
        if name in loaders:
            cold[name] = loader_epoch(loaders[name], 0)
        elif name in peers:
            cold[name] = epoch_pass(peers[name])
        else:
            cold[name] = ffcv_rows[name]()
        pids[name] = {ffcv.pid} if ffcv and name in ffcv_rows else descendants() - before
    floor_pass(blobs, min(n, 500), batch)

    passes: dict[str, list[dict[str, float]]] = {
        k: [] for k in LABELS
        if k.startswith("floor") or k in loaders or k in peers or k in ffcv_rows}
    need = (args.repeat + 1) // 2
    rounds = 0
    while rounds < args.repeat or (
            rounds < args.repeat + EXTRA_ROUNDS
            and time.perf_counter() - start < EXTRA_ROUNDS_BEFORE_S
            and min(sum(1 for p in v if p["foreign_cores"] < QUIET_FOREIGN_CORES)
                    for v in passes.values()) < need):
        passes["floor"].append(measured(partial(floor_pass, blobs, n, batch)))
        passes["floor_cl"].append(measured(partial(floor_pass, blobs, n, batch, True)))
        for name, loader in loaders.items():
            passes[name].append(measured(partial(loader_epoch, loader, rounds + 1)))
        for name, peer in peers.items():
            passes[name].append(measured(partial(epoch_pass, peer)))
        for name, epoch in ffcv_rows.items():
            passes[name].append(measured(epoch))
        rounds += 1
    load1 = os.getloadavg()

    memory: dict[str, Any] = {"workers": {
        name: [{"pid": p, "peak_rss_mb": round(proc_kb(p, "VmHWM:") * 1024 / MB, 1),
                "pss_mb": round(proc_kb(p, "Pss:", "smaps_rollup") * 1024 / MB, 1)}
               for p in sorted(ps)]
        for name, ps in pids.items()},
        "main_peak_rss_mb": round(proc_kb(os.getpid(), "VmHWM:") * 1024 / MB, 1)}
    del loaders, peers
    gc.collect()
    if ffcv is not None:
        ffcv.close()

    workers_of = {"floor": 1, "floor_cl": 1, "loader_1shard_2w": 2,
                  **{f"{k}_{w}w": w for k in ("loader", "loader_cl", "dali", "peer", "ffcv")
                     for w in WORKER_COUNTS}}
    rates = {k: summarise(v, workers_of[k], cores) for k, v in passes.items()}
    r = {k: [(p["rate"], p["foreign_cores"]) for p in v] for k, v in passes.items()}
    values = {
        "loader_1w_over_floor": paired_ratio(r["loader_1w"], r["floor"]),
        "loader_2w_over_1w": paired_ratio(r["loader_2w"], r["loader_1w"]),
        "loader_1w_over_peer_1w": paired_ratio(r["loader_1w"], r["peer_1w"]),
        "loader_2w_over_peer_2w": paired_ratio(r["loader_2w"], r["peer_2w"]),
        "loader_1shard_2w_over_1w": paired_ratio(r["loader_1shard_2w"], r["loader_1w"]),
        "loader_cl_1w_over_floor_cl": paired_ratio(r["loader_cl_1w"], r["floor_cl"]),
    }
    ffcv_info["compared"] = "loader_cl"
    for w in WORKER_COUNTS if ffcv_rows else ():
        values[f"vs_ffcv_{w}w"] = paired_ratio(r[f"loader_cl_{w}w"], r[f"ffcv_{w}w"])
    ratios: dict[str, dict[str, Any]] = {
        k: {"value": round(v, 3), "target": TARGETS[k], "result": verdict(v, TARGETS[k])}
        for k, v in values.items()}
    info = {
        "loader_2w_over_floor": paired_ratio(r["loader_2w"], r["floor"]),
        "peer_1w_over_floor": paired_ratio(r["peer_1w"], r["floor"]),
        "peer_2w_over_1w": paired_ratio(r["peer_2w"], r["peer_1w"]),
    }
    if args.dali:
        for w in WORKER_COUNTS:
            info[f"dali_{w}w_over_loader_{w}w"] = paired_ratio(r[f"dali_{w}w"], r[f"loader_{w}w"])
            info[f"dali_{w}w_over_peer_{w}w"] = paired_ratio(r[f"dali_{w}w"], r[f"peer_{w}w"])
        info["dali_2w_over_1w"] = paired_ratio(r["dali_2w"], r["dali_1w"])
    for w in WORKER_COUNTS:
        info[f"loader_cl_{w}w_over_loader_{w}w"] = paired_ratio(r[f"loader_cl_{w}w"],
                                                                r[f"loader_{w}w"])
    for k, v in info.items():
        ratios[k] = {"value": round(v, 3), "target": None, "result": "info"}
    pil = asdict(pil_info(check_avx2=False))
    return {
        "benchmark": "loader",
        "images_dir": str(args.images),
        "distinct_images": len(blobs),
        "samples": n,
        "shards": len(m.shards),
        "shards_mb": round(m.total_bytes / MB, 1),
        "batch_size": batch,
        "repeat": args.repeat,
        "rounds": rounds,
        "quiet_foreign_cores": QUIET_FOREIGN_CORES,
        "loadavg_start": [round(x, 2) for x in load0],
        "loadavg_end": [round(x, 2) for x in load1],
        "cpus": cores,
        "torch": torch.__version__,
        "webdataset": getattr(wds, "__version__", "?"),
        "dali": dali_version() if args.dali else None,
        "ffcv": ffcv_info,
        "pil": {k: pil[k] for k in ("pil_version", "pillow_simd", "stock_pillow_installed",
                                    "libjpeg_turbo", "jpeg_version", "cpu_avx2")},
        "rates": rates,
        "cold": {k: {kk: round(vv, 3) for kk, vv in v.items()} for k, v in cold.items()},
        "ratios": ratios,
        "memory": memory,
        "noisy": min(v["quiet_passes"] for v in rates.values()) < need,
        "all_pass": all(v["result"] == "PASS" for v in ratios.values() if v["target"]),
        "seconds": round(time.perf_counter() - start, 1),
    }


def run_sizes(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """``--sizes``: the shard set built as for the full run, then ``bench.loader_sizes``."""
    folder, blobs = build_shards(args.images, scratch, args.samples, args.limit,
                                 args.store_size)
    return loader_sizes.run_sizes(args, folder, blobs, measured)


def run_augment(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """``--augment``: the shard set built as for the full run, then
    ``bench.loader_augment``."""
    folder, blobs = build_shards(args.images, scratch, args.samples, args.limit)
    return loader_augment.run_augment(args, folder, blobs, measured, scratch)


def run_stores(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """``--stores``: the shard set built as for the full run, then ``bench.loader_stores``."""
    folder, _ = build_shards(args.images, scratch, args.samples, args.limit)
    return loader_stores.run_stores(args, folder, measured, scratch)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.augment:
        return run_main("bench_loader", args.images, args.out, partial(run_augment, args),
                        loader_augment.print_augment)
    if args.stores:
        return run_main("bench_loader", args.images, args.out, partial(run_stores, args),
                        loader_stores.print_stores)
    if args.sizes:
        return run_main("bench_loader", args.images, args.out, partial(run_sizes, args),
                        loader_sizes.print_sizes)
    return run_main("bench_loader", args.images, args.out, partial(run, args), print_table)


if __name__ == "__main__":
    sys.exit(main())
