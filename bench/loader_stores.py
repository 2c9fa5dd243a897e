"""``python -m bench.loader --stores``: the loader by storage mode (``imgprep convert
--store``), against FFCV 1.0.2 in each of its own storage modes when it is installed.

The shard set ``bench.loader`` builds (the real sample, 256 px centre crops, repeated under
new keys) is rewritten once per store with ``convert --from-shards`` (``jpeg``, ``yuv420``,
``rgb``, ``mixed-0.5`` and ``mixed-0.9``: half or 90 % of the images as YUV 4:2:0, picked by
a hash of the key; ``mixed-r0.226``: the images whose JPEG is at least 0.226 x their YUV
4:2:0 record, half of the sample's, by the bytes rule). Each round, interleaved: the floor
of each store (``SampleDecoder`` over the store's member bytes preloaded, one core, 224 px;
``jpeg`` and ``yuv420`` also at 160 px)
and the channels-last loader taken in place (FFCV's layout and buffer reuse, as
``bench.loader``'s FFCV rows) with 1 worker for every store and 2 for ``jpeg`` and
``yuv420``, plus ``yuv420`` at 160 px with 1 worker; and the C call alone
(``resample_yuv420_<size>``: ``rawpixels.sample`` on geometries drawn beforehand, the same
boxes at 224 and 160 px), whose ratio is the least the 160 px sample can cost against the
224 px one while its pixels stay the JPEG path's. Rates are medians of the quiet passes.

Targets: a yuv420 sample costs <= 0.4 x a JPEG sample (loader, 1 worker, RRC 224), and a
yuv420 sample at 160 px <= 0.7 x one at 224 px (the same).

FFCV (``--ffcv-python``, ``bench.ffcv_peer``): a .beton per FFCV storage mode, of the same
samples: ``jpg`` (its ``RGBImageField`` in jpg mode), ``proportion-0.5`` and
``proportion-0.1`` (its ``compress_probability``: half or 90 % of the images raw RGB, the
images the benchmark's key hash picks, the same as imgprep's ``mixed-0.5`` and ``mixed-0.9``
keep as pixels) and ``raw``; one FFCV loader per worker count each. ``vs_ffcv_<mode>_<w>w``:
the fastest imgprep store whose shards are at most 1.05 x that .beton's bytes over FFCV, at
1 and 2 workers (target >= 1.1). Without FFCV, the table gives the bytes FFCV's images would
take in each mode (its payloads, without its page and metadata overhead) and the pairing
they imply, and says the FFCV rows are skipped.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench import ffcv_peer
from bench.common import QUIET_FOREIGN_CORES, paired_ratio, timed_epoch, verdict
from imgprep import StoreOptions, World, from_shards, rawpixels, read_manifest
from imgprep.convert.store import unit_hash
from imgprep.rawformat import IMAGE_EXTS, read_header
from imgprep.shards.tario import iter_samples
from loaders import LoaderOptions, SampleDecoder, ShardLoader, TrainTransform

SPLIT = "train"
STORES: dict[str, StoreOptions | None] = {
    "jpeg": None, "yuv420": StoreOptions(mode="yuv420"), "rgb": StoreOptions(mode="rgb"),
    "mixed-0.5": StoreOptions(mode="mixed", fraction=0.5),
    "mixed-0.9": StoreOptions(mode="mixed", fraction=0.9),
    # the bytes rule at the sample's median JPEG / yuv420 record ratio: half the images, the
    # largest JPEGs
    "mixed-r0.226": StoreOptions(mode="mixed", min_ratio=0.226)}
FFCV_MODES = {"jpg": 0.0, "proportion-0.5": 0.5, "proportion-0.1": 0.9, "raw": 1.0}  # raw share
TWO_WORKERS = ("jpeg", "yuv420")
BYTES_SLACK = 1.05  # an imgprep store is paired with a .beton it is at most this x the bytes of
TARGETS = {"yuv420_over_jpeg_cost": 0.4, "yuv420_cost_160_over_224": 0.7}
RATIO_TARGET = 1.1  # vs FFCV
MB = 1e6


def store_sets(folder: Path, scratch: Path) -> dict[str, Path]:
    """The set kept every way of ``STORES`` (``jpeg``: ``folder`` itself)."""
    out = {}
    for name, opts in STORES.items():
        out[name] = folder if opts is None else scratch / f"store-{name}"
        if opts is not None:
            from_shards(folder, out[name], opts, workers=os.cpu_count() or 1)
    return out


def members(folder: Path, limit: int) -> list[bytes]:
    """The first ``limit`` samples' image members (JPEG or stored pixels), preloaded."""
    out: list[bytes] = []
    for s in read_manifest(folder, SPLIT).shards:
        for _, fields in iter_samples(folder / s.name):
            out.append(next(fields[e] for e in IMAGE_EXTS if e in fields))
            if len(out) == limit:
                return out
    return out


def floor_pass(blobs: list[bytes], n: int, size: int) -> dict[str, float]:
    decode = SampleDecoder(TrainTransform(size=size))
    out = np.empty((3, size, size), np.uint8)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for i in range(n):
        decode(blobs[i % len(blobs)], rng, out)
    return {"rate": n / (time.perf_counter() - t0), "images": n}


def resample_pass(blobs: list[bytes], n: int, size: int) -> dict[str, float]:
    """The C call alone (``imgprep.rawpixels.sample``) on ``n`` stored-pixel records, with
    geometries drawn before the clock starts: the same boxes at every size (a crop's box does
    not depend on its output size), so the ratio of two sizes is the resampler's own."""
    t = TrainTransform(size=size)
    records = [(b, read_header(b)) for b in blobs]
    rng = np.random.default_rng(0)
    plan = [(data, h, t.geometry(h.width, h.height, rng))
            for data, h in (records[i % len(records)] for i in range(n))]
    out = np.empty((size, size, 3), np.uint8)
    t0 = time.perf_counter()
    for data, h, g in plan:
        rawpixels.sample(data, h.width, h.height, resize=g.resize, box=g.box, crop=g.crop,
                         out=out, flip=g.flip, planar=False)
    return {"rate": n / (time.perf_counter() - t0), "images": n}


def loader_pass(loader: ShardLoader, epoch: int) -> dict[str, float]:
    loader.set_epoch(epoch)
    return timed_epoch(loader.in_place(), lambda images: None)


def kept_raw(share: float, key: str) -> bool:
    """Whether the sample ``key`` is kept as pixels where ``share`` of them are (the key
    hash of imgprep's ``mixed`` store, so FFCV's raw images are imgprep's)."""
    return share >= 1.0 or unit_hash(key) < share


def ffcv_bytes(folder: Path, share: float) -> int:
    """The bytes FFCV's images take in a mode storing ``share`` of them raw (the same
    images as imgprep's ``mixed``): a JPEG's bytes, or 3 a pixel."""
    total = 0
    for s in read_manifest(folder, SPLIT).shards:
        for key, fields in iter_samples(folder / s.name):
            total += 3 * 256 * 256 if kept_raw(share, key) else len(fields["jpg"])
    return total


def _median(passes: list[dict[str, float]]) -> float:
    quiet = [p for p in passes if p["foreign_cores"] < QUIET_FOREIGN_CORES] or passes
    return statistics.median(p["rate"] for p in quiet)


def _loaders(sets: dict[str, Path], batch: int) -> dict[str, ShardLoader]:
    def make(name: str, workers: int, size: int = 224) -> ShardLoader:
        return ShardLoader(sets[name], SPLIT, World(), LoaderOptions(
            batch_size=batch, workers=workers, seed=0, memory_format="channels_last",
            transform=TrainTransform(size=size)))

    rows = {f"loader_{name}_1w": make(name, 1) for name in STORES}
    rows |= {f"loader_{name}_2w": make(name, 2) for name in TWO_WORKERS}
    rows["loader_yuv420_160_1w"] = make("yuv420", 1, 160)
    return rows


def _ffcv(args: argparse.Namespace, folder: Path, scratch: Path, batch: int
          ) -> tuple[Any, dict[str, Callable[[], dict[str, float]]], dict[str, Any]]:
    peer, note = ffcv_peer.start(args.ffcv_python, scratch)
    if peer is None:
        return None, {}, {"skipped": note}
    info: dict[str, Any] = {"versions": peer.versions, "betons": {}}
    rows: dict[str, Callable[[], dict[str, float]]] = {}
    try:
        for mode, share in FFCV_MODES.items():
            got = peer.write_beton(folder, SPLIT, scratch, name=f"ffcv-{mode}",
                                   raw=partial(kept_raw, share))
            info["betons"][mode] = got
            rows |= peer.open_loaders(got["beton"], batch, (1, 2), prefix=f"ffcv_{mode}")
    except BaseException:
        peer.close()
        raise
    return peer, rows, info


def run_stores(args: argparse.Namespace, folder: Path, measured: Any,
               scratch: Path) -> dict[str, Any]:
    """Every store's floor and loader rows (and FFCV's, when installed), interleaved;
    ``measured`` wraps a pass with the machine's load (``bench.loader.measured``)."""
    start, load0 = time.perf_counter(), os.getloadavg()
    batch, n = args.batch_size, read_manifest(folder, SPLIT).total_samples
    sets = store_sets(folder, scratch)
    nbytes = {k: read_manifest(p, SPLIT).total_bytes for k, p in sets.items()}
    loaders = _loaders(sets, batch)
    ffcv, ffcv_rows, ffcv_info = _ffcv(args, folder, scratch, batch)
    for loader in loaders.values():
        loader_pass(loader, 0)  # warm-up: worker start-up, page cache
    for row in ffcv_rows.values():
        row()  # warm-up: numba compiles FFCV's pipeline
    blobs = {k: members(p, min(n, 1000)) for k, p in sets.items()}
    floors = {f"floor_{k}_224": (k, 224) for k in STORES} | {
        "floor_jpeg_160": ("jpeg", 160), "floor_yuv420_160": ("yuv420", 160)}
    resamples = {f"resample_yuv420_{size}": size for size in (224, 160)}
    passes: dict[str, list[dict[str, float]]] = {
        k: [] for k in (*floors, *resamples, *loaders, *ffcv_rows)}
    for r in range(args.repeat):
        for k, (store, size) in floors.items():
            passes[k].append(measured(partial(floor_pass, blobs[store], min(n, 2000), size)))
        for k, size in resamples.items():
            passes[k].append(measured(partial(resample_pass, blobs["yuv420"], min(n, 2000),
                                              size)))
        for k, loader in loaders.items():
            passes[k].append(measured(partial(loader_pass, loader, r + 1)))
        for k, row in ffcv_rows.items():
            passes[k].append(measured(row))
    del loaders
    gc.collect()
    if ffcv is not None:
        ffcv.close()
    return summarise(passes, nbytes, n, ffcv_info, folder, start, load0, args)


def _pairs(passes: dict[str, list[dict[str, float]]], key: str) -> list[tuple[float, float]]:
    return [(p["rate"], p["foreign_cores"]) for p in passes[key]]


def _ffcv_pairing(passes: dict[str, list[dict[str, float]]], nbytes: dict[str, int],
                  folder: Path, info: dict[str, Any]) -> dict[str, Any]:
    """Per FFCV mode: its bytes (measured, or its payloads), the imgprep store paired with
    it, and where FFCV ran, the ratios at 1 and 2 workers."""
    out: dict[str, Any] = {}
    for mode, share in FFCV_MODES.items():
        beton = info.get("betons", {}).get(mode)
        size = int(beton["beton_mb"] * MB) if beton else ffcv_bytes(folder, share)
        fits = [k for k in TWO_WORKERS if nbytes[k] <= BYTES_SLACK * size]
        best = max(fits, key=lambda k: _median(passes[f"loader_{k}_1w"]), default=None)
        row: dict[str, Any] = {"ffcv_mb": round(size / MB, 1),
                               "measured": beton is not None, "imgprep": best,
                               "imgprep_mb": round(nbytes[best] / MB, 1) if best else None}
        if beton and best:
            for w in (1, 2):
                v = paired_ratio(_pairs(passes, f"loader_{best}_{w}w"),
                                 _pairs(passes, f"ffcv_{mode}_{w}w"))
                row[f"vs_ffcv_{w}w"] = {"value": round(v, 3), "target": RATIO_TARGET,
                                        "result": verdict(v, RATIO_TARGET)}
        out[mode] = row
    return out


def summarise(passes: dict[str, list[dict[str, float]]], nbytes: dict[str, int], n: int,
              ffcv_info: dict[str, Any], folder: Path, start: float,
              load0: tuple[float, ...], args: argparse.Namespace) -> dict[str, Any]:
    us = {k: round(1e6 / _median(v), 1) for k, v in passes.items()}
    cost = {  # cost ratios: the rate of the reference over the rate of the row
        "yuv420_over_jpeg_cost": paired_ratio(_pairs(passes, "loader_jpeg_1w"),
                                              _pairs(passes, "loader_yuv420_1w")),
        "yuv420_cost_160_over_224": paired_ratio(_pairs(passes, "loader_yuv420_1w"),
                                                 _pairs(passes, "loader_yuv420_160_1w")),
        "floor_yuv420_over_jpeg_cost": paired_ratio(_pairs(passes, "floor_jpeg_224"),
                                                    _pairs(passes, "floor_yuv420_224")),
        "floor_yuv420_cost_160_over_224": paired_ratio(_pairs(passes, "floor_yuv420_224"),
                                                       _pairs(passes, "floor_yuv420_160")),
        "floor_jpeg_cost_160_over_224": paired_ratio(_pairs(passes, "floor_jpeg_224"),
                                                     _pairs(passes, "floor_jpeg_160")),
        "resample_yuv420_cost_160_over_224": paired_ratio(
            _pairs(passes, "resample_yuv420_224"), _pairs(passes, "resample_yuv420_160"))}
    ratios = {k: {"value": round(v, 3), "target": TARGETS.get(k),
                  "result": verdict(v, TARGETS[k] + 1e-12, below=True) if k in TARGETS
                  else "info"} for k, v in cost.items()}
    ffcv = _ffcv_pairing(passes, nbytes, folder, ffcv_info)
    judged = [v["result"] for v in ratios.values() if v["target"]] + [
        r[k]["result"] for r in ffcv.values() for k in ("vs_ffcv_1w", "vs_ffcv_2w") if k in r]
    return {
        "benchmark": "loader", "mode": "stores", "samples": n, "batch_size": args.batch_size,
        "repeat": args.repeat, "bytes_per_image": {k: round(v / n) for k, v in nbytes.items()},
        "shards_mb": {k: round(v / MB, 1) for k, v in nbytes.items()},
        "us_per_image": us, "ratios": ratios, "ffcv": ffcv,
        "ffcv_info": {k: v for k, v in ffcv_info.items() if k != "betons"},
        "quiet_passes": {k: sum(1 for p in v if p["foreign_cores"] < QUIET_FOREIGN_CORES)
                         for k, v in passes.items()},
        "loadavg_start": [round(x, 2) for x in load0],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "all_pass": all(r == "PASS" for r in judged),
        "seconds": round(time.perf_counter() - start, 1),
    }


def print_stores(res: dict[str, Any]) -> None:
    print(f"loader by storage mode: {res['samples']:,} samples (256 px centre crops), batch "
          f"{res['batch_size']}, channels-last in place, {res['repeat']} interleaved rounds; "
          f"load average {res['loadavg_start']} -> {res['loadavg_end']}")
    us = res["us_per_image"]
    print(f"{'store':>10s} {'bytes/img':>10s} {'floor us':>9s} {'loader 1w us':>13s} "
          f"{'loader 2w us':>13s}")
    for k, b in res["bytes_per_image"].items():
        two = us.get(f"loader_{k}_2w")
        print(f"{k:>10s} {b:10,d} {us[f'floor_{k}_224']:9.1f} {us[f'loader_{k}_1w']:13.1f} "
              f"{'' if two is None else f'{two:13.1f}'}")
    print(f"160 px, 1 worker: yuv420 {us['loader_yuv420_160_1w']:.1f} us (floor "
          f"{us['floor_yuv420_160']:.1f}); jpeg floor {us['floor_jpeg_160']:.1f}")
    print(f"yuv420, the C call alone on the same boxes: {us['resample_yuv420_224']:.1f} us at "
          f"224 px, {us['resample_yuv420_160']:.1f} us at 160 px")
    for k, r in res["ratios"].items():
        mark = f"  (target <= {r['target']}: {r['result']})" if r["target"] else ""
        print(f"  {k}: {r['value']:.3f}{mark}")
    if "skipped" in res["ffcv_info"]:
        print(res["ffcv_info"]["skipped"])
    for mode, r in res["ffcv"].items():
        what = "its .beton" if r["measured"] else "its images' payloads (FFCV not run)"
        line = (f"  FFCV {mode}: {r['ffcv_mb']} MB ({what}); imgprep {r['imgprep']} "
                f"{r['imgprep_mb']} MB")
        for w in (1, 2):
            if f"vs_ffcv_{w}w" in r:
                v = r[f"vs_ffcv_{w}w"]
                line += f"; vs_ffcv_{w}w {v['value']:.3f} ({v['result']})"
        print(line)
