"""Benchmark ``imgprep convert`` against its own floor on the real ImageNet sample.

What it measures, in one run, on the 1000 real ILSVRC2012 JPEGs of
``<repo>/../shared/data/imagenet-sample/images`` (``--images`` to point elsewhere):

- floor: a tight one-process loop over image bytes preloaded in memory doing exactly what
  convert does to an image, with nothing around it: the C extension's one call
  (``imgprep.convert.native.one_call``: DCT-scaled decode of the part the resample reads,
  the largest centre square resized to 256 with LANCZOS, JPEG quality 90 encode). No I/O.
  Without the extension, the Pillow loop below.
- floor_pillow: the same work in Pillow: JPEG draft to (size, size), the centre square
  resized in one ``resize(..., box=...)`` call, JPEG quality 90 encode (transform version 1,
  the floor before convert's C path).
- transform: ``imgprep.convert.image.convert_image`` over the same preloaded bytes (the floor plus
  the library's checks), to tell per-image overhead from pipeline overhead;
  ``transform_whole`` is the same with the decode of only the part the resample reads forced
  off (``crop_decode=False``), and their ratio ``crop_decode_speedup`` is what that gains
  (the same output bytes).
- naive: what one writes by hand: full decode (no draft), ``convert("RGB")``, ``crop``,
  ``resize`` LANCZOS, encode q90; one process, preloaded bytes, on this environment's
  pillow-simd; and, with ``--stock-python PY`` (``make bench`` makes one), the same loop under
  an interpreter with stock Pillow from PyPI, the library a user who writes it by hand gets.
- convert: ``imgprep.convert_splits`` end to end (tar of the images -> webdataset shards +
  manifest) in-process with 1 and with 2 workers, a fresh output folder per pass.
- ceiling_2: two floor loops at once, one forked process each over half the images: what
  this machine allows two workers with nothing of imgprep between them (its shared caches,
  memory bandwidth and clocks), so that ``convert_2w_over_1w`` can be read against
  ``ceiling_2_over_floor``.
- memory: ``python -m imgprep convert ... --workers 2 --json -q`` as a subprocess while /proc
  is polled for the RSS (and PSS) sum of its whole process tree.
- listing: ``make_plan`` (list the tar, label, plan) of a synthetic ILSVRC2012-shaped train tar
  (1000 class tars, ``--listing-images`` tiny members, 200,000 by default; built in the scratch
  folder) with 1 worker and with every core, in microseconds per image; the planning process's
  own CPU time is the part that does not run in parallel.
- projection: minutes for the 1,281,167 train images on 16 and 64 cores: planning (its serial
  part plus its parallel part over the cores) then converting, where converting takes the
  longer of the one-worker rate times the cores and reading the 138 GB train tar at
  ``--disk-gbps`` (reading and converting overlap).

Each pass also records the CPU time of this process and its reaped children per image; the
``*_cpu`` ratios (medians over rounds) tell the overhead apart from other processes' load on a
busy machine, where the wall-time ratios are unreliable.

By default a conversion is one shard (the default shard size holds the 1000 sample images), so
``--workers 2`` splits the shard into parts, as it would any input with fewer shards than
workers; ``--shards 20`` measures 20 tasks instead.

Targets: convert 1 worker / floor >= 0.95, convert 2 workers / 1 worker >= 1.8, convert 1
worker / naive >= 1.3 (against the stock-Pillow naive loop when measured; the same loop on
pillow-simd is reported beside it), peak RSS of the 2-worker tree < 1000 MB. After one
warm-up, every measure runs once per round, ``--repeat`` rounds interleaved; each pass also
records how much CPU other processes took meanwhile (from /proc/stat), and rates are medians
over the passes nobody disturbed (up to 3 rounds are added to get enough of those; all passes
count when none was quiet, and the output then says it is unreliable). Each round runs the
floor, ``convert --workers 1``, the floor again, then ``--workers 2``: the one-worker pass is
compared with the mean time of the two floor passes around it, so a machine that slows down
or speeds up within the round weighs on both sides of the ratio, and every ratio is the median
over rounds of that round's own ratio.
A compact table goes to stdout and the last line of stdout is one JSON object with every
figure. Linux only.

``--form F`` (repeatable: ``kaggle``, ``kaggle-zip``, ``kaggle-zip-deflated``,
``hf-parquet``, ``hf-targz``, ``wds``, or ``all``) measures input forms instead: the same
images in form F and in the plain tar, converted in the same rounds, with F's rate over the
plain tar's and F's container cost (inflating, reading, spooling) timed alone beside it
(``bench/forms.py``).

Run (from the repository root, in the project's environment)::

    python -m bench.convert                    # the full run, a few minutes
    python -m bench.convert --limit 200 --repeat 1  # a quick look
    python -m bench.convert --form all --repeat 3

The images are read from the shared folder and never copied into the repository: the tar that
convert reads is built in a temporary folder (or under ``--out``) and removed afterwards.
Exit code 2 when the image folder is missing.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from PIL import Image

from bench.common import (
    DEFAULT_IMAGES,
    QUIET_FOREIGN_CORES,
    descendants,
    machine_busy_s,
    paired_ratio,
    proc_kb,
    run_main,
    verdict,
)
from bench.forms import FORMS, print_forms, run_forms
from imgprep import ConvertOptions, TransformOptions, convert_splits, imagenet_classes, pil_info
from imgprep.convert import native
from imgprep.convert.image import convert_image
from imgprep.convert.tasks import make_plan
from imgprep.shards.writers import RECORD, header_bytes

IMAGENET_TRAIN_IMAGES = 1_281_167
PROJECT_CORES = (16, 64)
TRAIN_TAR_BYTES = 137_747_057_664  # ILSVRC2012_img_train.tar
LISTING_CLASSES = 1000
SIZE = 256
QUALITY = 90
LANCZOS = Image.Resampling.LANCZOS
TARGETS = {
    "convert_1w_over_floor": 0.95,
    "convert_2w_over_1w": 1.8,
    "convert_1w_over_naive": 1.3,
}
RSS_TARGET_MB = 1000.0
POLL_S = 0.02
WARMUP_IMAGES = 100
MB = 1e6
EXTRA_ROUNDS = 3  # rounds added (at most) while some measure lacks quiet passes


# ---------------------------------------------------------------------------- per-image loops


_C_FLOOR = native.one_call(TransformOptions(size=SIZE, quality=QUALITY))


def floor_one(data: bytes) -> bytes:
    """Convert's per-image work and nothing else: the extension's one call (the Pillow loop
    where the extension is not built)."""
    return _C_FLOOR(data) if _C_FLOOR is not None else pillow_floor_one(data)


def pillow_floor_one(data: bytes) -> bytes:
    """The same work in Pillow: draft, crop+resize in one call, encode."""
    src = Image.open(io.BytesIO(data))
    src.draft(src.mode, (SIZE, SIZE))
    w, h = src.size
    s = min(w, h)
    left, top = (w - s) // 2, (h - s) // 2
    img = src.resize((SIZE, SIZE), LANCZOS, box=(left, top, left + s, top + s))
    if img.mode != "RGB":
        img = img.convert("RGB")
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=QUALITY)
    return buf.getvalue()


def transform_one(data: bytes) -> bytes:
    """The library's per-image function with convert's default options."""
    return convert_image(data, TransformOptions(size=SIZE, quality=QUALITY)).jpeg


def transform_whole_one(data: bytes) -> bytes:
    """The library's per-image function with the crop-aware decode forced off."""
    return convert_image(data, TransformOptions(size=SIZE, quality=QUALITY),
                         crop_decode=False).jpeg


def naive_one(data: bytes) -> bytes:
    """The hand-written version: full decode, RGB, crop, resize, encode."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    s = min(w, h)
    left, top = (w - s) // 2, (h - s) // 2
    img = img.crop((left, top, left + s, top + s)).resize((SIZE, SIZE), LANCZOS)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=QUALITY)
    return buf.getvalue()


STOCK_LOOP = """
import io, json, sys, time
import PIL
from PIL import Image
SIZE, QUALITY = int(sys.argv[1]), int(sys.argv[2])
def naive(data):
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    s = min(w, h)
    left, top = (w - s) // 2, (h - s) // 2
    img = img.crop((left, top, left + s, top + s)).resize((SIZE, SIZE), Image.LANCZOS)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=QUALITY)
    return buf.getvalue()
blobs = [open(p, "rb").read() for p in sys.stdin.read().splitlines()]
for b in blobs[:100]:
    naive(b)
t0 = time.perf_counter()
for b in blobs:
    naive(b)
print(json.dumps({"rate": len(blobs) / (time.perf_counter() - t0), "pil": PIL.__version__}))
"""


def time_stock(python: Path, paths: Sequence[Path]) -> float:
    """The naive loop's rate under another interpreter (stock Pillow), timed inside it."""
    out = subprocess.run([str(python), "-c", STOCK_LOOP, str(SIZE), str(QUALITY)],
                         input="\n".join(map(str, paths)), capture_output=True, text=True,
                         check=True, timeout=600).stdout
    return float(json.loads(out.splitlines()[-1])["rate"])


def stock_pil_version(python: Path) -> str:
    out = subprocess.run([str(python), "-c", "import PIL; print(PIL.__version__)"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return out.strip()


def own_cpu_s() -> float:
    """CPU seconds of this process and of its reaped children (convert's workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def measured(fn: Callable[[], float]) -> tuple[float, float]:
    """``fn()``'s rate and how many cores other processes kept busy meanwhile."""
    b0, o0, t0 = machine_busy_s(), own_cpu_s(), time.perf_counter()
    rate = fn()
    dt = time.perf_counter() - t0
    return rate, max(0.0, ((machine_busy_s() - b0) - (own_cpu_s() - o0)) / dt)


def time_loop(fn: Callable[[bytes], bytes], blobs: Sequence[bytes]) -> float:
    """Images per second of ``fn`` over ``blobs`` (one pass)."""
    t0 = time.perf_counter()
    for b in blobs:
        fn(b)
    return len(blobs) / (time.perf_counter() - t0)


def time_floor_procs(blobs: Sequence[bytes], procs: int) -> float:
    """Images per second of ``procs`` floor loops at once, one forked process each over its
    share of ``blobs``: what the machine itself allows ``procs`` workers, with no imgprep
    in between (shared caches, memory bandwidth and clocks included)."""
    t0 = time.perf_counter()
    pids = []
    for k in range(procs):
        pid = os.fork()
        if pid == 0:  # the child: its share of the loop, then out without cleanup
            code = 0
            try:
                time_loop(floor_one, blobs[k::procs])
            except BaseException:  # noqa: BLE001 - reported through the exit code
                code = 1
            os._exit(code)
        pids.append(pid)
    failed = [pid for pid in pids if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0]
    if failed:
        raise SystemExit(f"bench_convert: {len(failed)} floor loop process(es) failed")
    return len(blobs) / (time.perf_counter() - t0)


def floor_matches_transform(blobs: Sequence[bytes]) -> bool:
    """Whether the floor loop gives imgprep's bytes (the same options, so the same work)."""
    return all(floor_one(b) == transform_one(b) for b in blobs)


# ---------------------------------------------------------------------------- inputs


def list_images(folder: Path, limit: int | None) -> list[Path]:
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
    return paths[:limit] if limit else paths


def build_tar(paths: Sequence[Path], dest: Path) -> None:
    """A flat tar of the images (``<wnid>_<name>.JPEG``: convert labels them by the prefix),
    in GNU format like ILSVRC2012's own tars: one header per member, no PAX records."""
    with tarfile.open(dest, "w", format=tarfile.GNU_FORMAT) as tf:
        for p in paths:
            tf.add(p, arcname=p.name, recursive=False)


# ---------------------------------------------------------------------------- convert runs


def convert_options(tar: Path, out: Path, workers: int, shards: int | None) -> ConvertOptions:
    return ConvertOptions(input=tar, out=out, workers=workers, num_shards=shards,
                          transform=TransformOptions(size=SIZE, quality=QUALITY))


def check_summary(summary: dict[str, Any], n: int, what: str) -> None:
    if not summary.get("complete") or summary.get("samples") != n or summary.get("errors"):
        raise SystemExit(f"bench_convert: {what} did not convert all {n} images: "
                         f"{json.dumps(summary, sort_keys=True)}")


def time_convert(tar: Path, out: Path, workers: int, shards: int | None, n: int) -> float:
    """Images per second of one in-process ``convert`` into the fresh folder ``out``."""
    if out.exists():
        shutil.rmtree(out)  # a leftover folder would resume and skip everything
    t0 = time.perf_counter()
    summary = asdict(convert_splits(convert_options(tar, out, workers, shards))[0])
    dt = time.perf_counter() - t0
    check_summary(summary, n, f"convert --workers {workers}")
    if summary["tasks_resumed"]:
        raise SystemExit(f"bench_convert: {out} was not fresh ({summary['tasks_resumed']} resumed)")
    shutil.rmtree(out)
    return n / dt


def time_plan(tar: Path, out: Path, shards: int | None, workers: int = 1) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of convert's planning step alone (list the
    tar on ``workers`` processes, label, fingerprint, cut into tasks)."""
    t0, c0 = time.perf_counter(), time.process_time()
    make_plan(convert_options(tar, out, workers, shards))
    return time.perf_counter() - t0, time.process_time() - c0


def build_train_tar(dest: Path, images: int) -> None:
    """An ILSVRC2012-shaped train tar: 1000 class tars of tiny members (only listed)."""
    wnids = imagenet_classes().wnids
    per, extra = divmod(images, LISTING_CLASSES)
    data = b"\xff" * 100 + bytes(412)
    with open(dest, "wb") as f:
        for c, wnid in enumerate(wnids[:LISTING_CLASSES]):
            inner = b"".join(header_bytes(f"{wnid}_{j}.JPEG", 100) + data
                             for j in range(per + (c < extra)))
            inner += bytes(-(len(inner) + 1024) % RECORD + 1024)
            f.write(header_bytes(f"{wnid}.tar", len(inner)) + inner)
        f.write(bytes(1024))


def measure_listing(scratch: Path, images: int) -> dict[str, Any]:
    """Planning cost per image of a ``images``-image train tar, with 1 and all workers."""
    tar = scratch / "ILSVRC2012_img_train.tar"
    build_train_tar(tar, images)
    cores = len(os.sched_getaffinity(0))
    time_plan(tar, scratch / "plan", None, cores)  # warm the page cache
    one = min(time_plan(tar, scratch / "plan", None, 1) for _ in range(2))
    many = min(time_plan(tar, scratch / "plan", None, cores) for _ in range(2))
    tar.unlink()
    return {"images": images, "cores": cores,
            "us_per_image_1_worker": round(one[0] / images * 1e6, 2),
            "us_per_image": round(many[0] / images * 1e6, 2),
            "serial_us_per_image": round(many[1] / images * 1e6, 2)}


def measure_cli_memory(tar: Path, out: Path, workers: int, shards: int | None,
                       n: int) -> dict[str, Any]:
    """Run the CLI as a subprocess and poll /proc for its process tree's memory."""
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "imgprep", "convert", str(tar), "-o", str(out),
           "--workers", str(workers), *(["--shards", str(shards)] if shards else []),
           "--json", "-q"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    peak_rss = peak_pss = peak_single = 0
    peak_procs = 0
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:
        pids = [proc.pid, *descendants(proc.pid)]
        rss = [proc_kb(p, "VmRSS:") for p in pids]
        pss = sum(proc_kb(p, "Pss:", "smaps_rollup") for p in pids)
        peak_rss, peak_pss = max(peak_rss, sum(rss)), max(peak_pss, pss)
        peak_single = max(peak_single, *rss)
        peak_procs = max(peak_procs, sum(1 for r in rss if r))
        time.sleep(POLL_S)
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode != 0:
        raise SystemExit(f"bench_convert: {' '.join(cmd)} exited {proc.returncode}:\n{stderr}")
    summary = json.loads(stdout.strip().splitlines()[-1])
    check_summary(summary, n, "the CLI")
    shutil.rmtree(out)
    return {
        "command": " ".join(cmd),
        "peak_rss_tree_mb": round(peak_rss * 1024 / MB, 1),
        "peak_pss_tree_mb": round(peak_pss * 1024 / MB, 1),
        "peak_rss_one_process_mb": round(peak_single * 1024 / MB, 1),
        "max_processes_seen": peak_procs,
        "ru_maxrss_children_mb": round(after * 1024 / MB, 1) if after > before else None,
        "wall_s": round(wall, 3),
        "images_per_s_wall": round(n / wall, 1),
        "images_per_s_reported": summary["images_per_s"],
    }


# ---------------------------------------------------------------------------- report


def project_hours(rate_per_core: float, cores: int) -> float:
    return IMAGENET_TRAIN_IMAGES / (rate_per_core * cores) / 3600


def project(per_core: float, sample_plan_s: float, listing: dict[str, Any],
            disk_gbps: float) -> dict[str, Any]:
    """The full-train projection on ``PROJECT_CORES``: planning (serial part + parallel part
    over the cores), then the longer of converting and reading the train tar."""
    n = IMAGENET_TRAIN_IMAGES
    rate = 1 / max(1 / per_core - sample_plan_s, 1e-9)  # convert 1w without its planning
    serial = listing["serial_us_per_image"] * 1e-6
    parallel = max(listing["us_per_image_1_worker"] * 1e-6 - serial, 0.0)
    read_s = TRAIN_TAR_BYTES / (disk_gbps * 1e9)
    minutes, plan_s = {}, {}
    for c in PROJECT_CORES:
        plan_s[str(c)] = round(n * (serial + parallel / c), 1)
        minutes[str(c)] = round((plan_s[str(c)] + max(n / (rate * c), read_s)) / 60, 2)
    return {
        "images": n,
        "rate_per_core": round(per_core, 1),
        "hours": {str(c): round(project_hours(per_core, c), 4) for c in PROJECT_CORES},
        "assumption": ("rate = convert --workers 1 median x cores: linear scaling, one worker "
                       "per core as fast as this machine's, and this sample's image sizes "
                       "typical of the train set; planning = its serial part + its parallel "
                       "part / cores, as measured on the synthetic train tar; the tar is read "
                       f"at {disk_gbps} GB/s while converting (the two overlap)"),
        "disk_gbps": disk_gbps,
        "read_s": round(read_s, 1),
        "plan_s": plan_s,
        "minutes_with_listing": minutes,
        "target_minutes_16_cores": 2.5,
        "result_16_cores": verdict(minutes["16"], 2.5, below=True),
    }


def quiet_rates(passes: list[tuple[float, float]]) -> list[float]:
    """The rates of the passes no other process disturbed (all of them if none was quiet)."""
    quiet = [r for r, foreign in passes if foreign < QUIET_FOREIGN_CORES]
    return quiet or [r for r, _ in passes]


def summarise(passes: list[tuple[float, float]]) -> dict[str, Any]:
    rates = [r for r, _ in passes]
    return {
        "median": round(statistics.median(quiet_rates(passes)), 1),
        "median_all_passes": round(statistics.median(rates), 1),
        "best": round(max(rates), 1),
        "passes": [round(r, 1) for r in rates],
        "foreign_cores": [round(f, 2) for _, f in passes],
        "quiet_passes": sum(1 for _, f in passes if f < QUIET_FOREIGN_CORES),
    }


def print_table(res: dict[str, Any]) -> None:
    r, rat, mem = res["rates"], res["ratios"], res["memory_2_workers"]
    pil = res["pil"]
    print(f"imgprep convert benchmark: {res['images']} images ({res['input_mb']:.1f} MB) "
          f"from {res['images_dir']}")
    print(f"PIL {pil['pil_version']} pillow-simd={pil['pillow_simd']} "
          f"libjpeg-turbo={pil['libjpeg_turbo']} cpu_avx2={pil['cpu_avx2']}; "
          f"{res['cpus']} CPUs; {res['rounds']} interleaved rounds after a warm-up; "
          f"{res['shards'] or 'default-size'} shards; load average {res['loadavg_start']} -> "
          f"{res['loadavg_end']}")
    print(f"naive peer for the target: {res['naive_peer']}")
    print("floor loop output identical to imgprep.convert.image: "
          f"{res['floor_matches_transform']}; "
          f"images that JPEG draft can shrink (short side >= {2 * SIZE}): "
          f"{res['draft_reducible_images']} of {res['images']}")
    print()
    print(f"{'rates (images/s)':44s} {'median*':>8s} {'best':>8s}  passes (! = disturbed)")
    labels = {
        "floor": "floor: the C path's one call, 1 core",
        "floor_pillow": "the same in Pillow: draft+crop/resize+q90",
        "transform": "imgprep.convert.image.convert_image, 1 core",
        "transform_whole": "the same, crop-aware decode forced off",
        "naive": "naive: no draft, crop, resize, 1 core",
        "naive_stock": "naive on stock Pillow (subprocess), 1 core",
        "convert_1w": "convert --workers 1 (in-process, e2e)",
        "floor_after": "floor again, right after convert --workers 1",
        "convert_2w": "convert --workers 2 (in-process, e2e)",
        "ceiling_2": "ceiling: 2 floor loops at once, 1 process each",
    }
    for k, label in labels.items():
        if k not in r:
            continue
        v = r[k]
        marks = ("" if f < QUIET_FOREIGN_CORES else "!" for f in v["foreign_cores"])
        print(f"{label:44s} {v['median']:8.1f} {v['best']:8.1f}  "
              f"{' '.join(f'{p:.0f}{m}' for p, m in zip(v['passes'], marks, strict=True))}")
    print(f"{'CLI convert --workers 2 (subprocess, wall)':44s} "
          f"{mem['images_per_s_wall']:8.1f}")
    print(f"* median of the passes during which other processes used < {QUIET_FOREIGN_CORES} "
          "cores (of all passes when none was that quiet)")
    if res["noisy"]:
        print("WARNING: other processes kept the CPUs busy during most passes; the rates and "
              "ratios below are unreliable: rerun on an idle machine")
    print()
    print(f"{'ratio':30s} {'value':>8s} {'target':>9s}  result")
    for k, v in rat.items():
        target = "" if v["target"] is None else f">= {v['target']}"
        print(f"{k:30s} {v['value']:8.3f} {target:>9s}  {v['result']}")
    print(f"{'peak RSS, 2-worker tree (MB)':30s} {mem['peak_rss_tree_mb']:8.1f} "
          f"{'< ' + str(int(RSS_TARGET_MB)):>9s}  {mem['result']}")
    print(f"  (PSS sum {mem['peak_pss_tree_mb']:.1f} MB, largest process "
          f"{mem['peak_rss_one_process_mb']:.1f} MB, {mem['max_processes_seen']} processes; "
          f"ru_maxrss of children {mem['ru_maxrss_children_mb']} MB)")
    print()
    proj = res["projection"]
    print(f"projection for {IMAGENET_TRAIN_IMAGES:,} images at "
          f"{proj['rate_per_core']:.1f} images/s per core:")
    lst = res["listing"]
    for cores, hours in proj["hours"].items():
        print(f"  {cores:>3s} cores: converting {hours * 60:.1f} min; with planning "
              f"({proj['plan_s'][cores]:.1f} s) and the tar read at {proj['disk_gbps']} GB/s "
              f"({proj['read_s']:.0f} s, overlapped): {proj['minutes_with_listing'][cores]:.2f} "
              "min" + (f" (target < {proj['target_minutes_16_cores']}: "
                       f"{proj['result_16_cores']})" if cores == "16" else ""))
    print(f"  assumption: {proj['assumption']}")
    print(f"  listing + planning of a {lst['images']:,}-image train tar: "
          f"{lst['us_per_image']:.2f} us/image on {lst['cores']} cores "
          f"({lst['us_per_image_1_worker']:.2f} on 1; serial part "
          f"{lst['serial_us_per_image']:.2f})")


# ---------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES,
                    help="folder of <wnid>_<name>.JPEG files (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=5,
                    help="timed passes of every measurement; the median is reported (default 5)")
    ap.add_argument("--limit", type=int, default=None,
                    help="use only the first N images (sorted by name), for a quick run")
    ap.add_argument("--out", type=Path, default=None,
                    help="scratch folder for the tar and the shards (default: a temporary "
                         "folder, removed afterwards)")
    ap.add_argument("--stock-python", type=Path, default=None,
                    help="a Python interpreter with stock Pillow (not pillow-simd) to time the "
                         "naive loop under, as a user writing it by hand would run it")
    ap.add_argument("--shards", type=int, default=None,
                    help="shards (= tasks) per conversion (default: convert's shard size, one "
                         "shard for the sample, which 2 workers convert in parts)")
    ap.add_argument("--listing-images", type=int, default=200_000,
                    help="images in the synthetic train tar whose listing is timed (default "
                         "%(default)s)")
    ap.add_argument("--form", action="append", choices=(*FORMS, "all"), default=[],
                    help="measure this input form against the plain tar instead (repeatable; "
                         "all: every form)")
    ap.add_argument("--listing-only", action="store_true",
                    help="time only the listing of the synthetic train tar and print its JSON")
    ap.add_argument("--disk-gbps", type=float, default=2.0,
                    help="read rate of the 138 GB train tar assumed in the projection, GB/s "
                         "(default %(default)s: one NVMe drive)")
    args = ap.parse_args(argv)
    if args.repeat < 1 or (args.limit is not None and args.limit < 1) or \
            (args.shards is not None and args.shards < 1) or args.listing_images < 1000:
        ap.error("--repeat, --limit and --shards must be >= 1, --listing-images >= 1000")
    return args


def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    paths = list_images(args.images, args.limit)
    if not paths:
        print(f"bench_convert: no .JPEG files in {args.images}", file=sys.stderr)
        raise SystemExit(2)
    n = len(paths)
    shards = min(args.shards, n) if args.shards else None
    load0 = os.getloadavg()
    pil = asdict(pil_info(check_avx2=False))
    tar = scratch / "imagenet-sample.tar"
    build_tar(paths, tar)

    # Memory first: RUSAGE_CHILDREN's ru_maxrss is a running max over all reaped children, so
    # it must be read before this process forks workers that inherit the preloaded bytes.
    memory = measure_cli_memory(tar, scratch / "cli-2w", 2, shards, n)
    memory["result"] = verdict(memory["peak_rss_tree_mb"], RSS_TARGET_MB, below=True)

    blobs = [p.read_bytes() for p in paths]
    draftable = sum(1 for b in blobs if min(Image.open(io.BytesIO(b)).size) >= 2 * SIZE)
    warm = blobs[:WARMUP_IMAGES]
    matches = floor_matches_transform(warm)
    loops: dict[str, Callable[[bytes], bytes]] = {
        "floor": floor_one, "floor_after": floor_one, "transform": transform_one,
        "transform_whole": transform_whole_one, "floor_pillow": pillow_floor_one,
        "naive": naive_one,
    }
    for fn in loops.values():
        time_loop(fn, warm)
    time_convert(tar, scratch / "warmup", 1, shards, n)

    # Rounds interleave every measure, so that a slow spell hits all of them; passes during
    # which other processes took CPU are set aside, and rounds are added (up to EXTRA_ROUNDS)
    # while some measure has fewer quiet passes than half of --repeat.
    stock = args.stock_python
    stock_version = stock_pil_version(stock) if stock else None
    if stock_version is not None and "post" in stock_version:
        print(f"bench_convert: {stock} imports PIL {stock_version}, which looks like "
              "pillow-simd; the stock peer needs stock Pillow", file=sys.stderr)
        raise SystemExit(2)
    passes: dict[str, list[tuple[float, float]]] = {
        k: [] for k in (*loops, "convert_1w", "convert_2w", "ceiling_2",
                        *(["naive_stock"] if stock else []))}
    plan_s: list[float] = []
    cpu_passes: dict[str, list[float]] = {}  # CPU seconds per image, this process + children
    listing = measure_listing(scratch, args.listing_images)
    need = (args.repeat + 1) // 2
    rounds = 0
    while rounds < args.repeat or (
            rounds < args.repeat + EXTRA_ROUNDS
            and min(sum(1 for _, f in v if f < QUIET_FOREIGN_CORES) for v in passes.values())
            < need):
        # the floor on both sides of convert_1w (a drift within the round weighs on both sides
        # of their ratio), then convert_2w right after it
        for name in ("floor", "convert_1w", "floor_after", "convert_2w", "ceiling_2",
                     "transform", "transform_whole", "floor_pillow", "naive"):
            c0 = own_cpu_s()
            if name == "ceiling_2":
                passes[name].append(measured(partial(time_floor_procs, blobs, 2)))
            elif name.startswith("convert_"):
                w = int(name[-2])
                passes[name].append(measured(partial(
                    time_convert, tar, scratch / f"convert-{w}w-{rounds}", w, shards, n)))
            else:
                passes[name].append(measured(partial(time_loop, loops[name], blobs)))
            cpu_passes.setdefault(name, []).append((own_cpu_s() - c0) / n)
        if stock:
            passes["naive_stock"].append(measured(partial(time_stock, stock, paths)))
        plan_s.append(time_plan(tar, scratch / "plan", shards)[0])
        rounds += 1
    load1 = os.getloadavg()
    cpu = {k: statistics.median(v) for k, v in cpu_passes.items()}

    rates = {k: summarise(v) for k, v in passes.items()}
    med = {k: statistics.median(quiet_rates(v)) for k, v in passes.items()}
    best = {k: max(r for r, _ in v) for k, v in passes.items()}
    floor_around = [(2 / (1 / a + 1 / b), max(fa, fb))  # the rate of their mean time
                    for (a, fa), (b, fb) in zip(passes["floor"], passes["floor_after"],
                                                strict=True)]
    values = {
        "convert_1w_over_floor": paired_ratio(passes["convert_1w"], floor_around),
        "convert_2w_over_1w": paired_ratio(passes["convert_2w"], passes["convert_1w"]),
        "convert_1w_over_naive": paired_ratio(passes["convert_1w"],
                                              passes["naive_stock" if stock else "naive"]),
    }
    ratios = {k: {"value": round(v, 3), "target": TARGETS[k], "result": verdict(v, TARGETS[k])}
              for k, v in values.items()}
    info: dict[str, float] = {}  # figures without a target, in the table's order
    if stock:
        info["convert_1w_over_naive_same_pil"] = med["convert_1w"] / med["naive"]
    info |= {
        "floor_over_naive": med["floor"] / med["naive"],
        "convert_2w_over_1w_best_passes": best["convert_2w"] / best["convert_1w"],
        "ceiling_2_over_floor": paired_ratio(passes["ceiling_2"], passes["floor"]),
        "convert_2w_over_ceiling_2": paired_ratio(passes["convert_2w"], passes["ceiling_2"]),
        "transform_over_floor": med["transform"] / med["floor"],
        "floor_over_floor_pillow": paired_ratio(passes["floor"], passes["floor_pillow"]),
        "crop_decode_speedup": paired_ratio(passes["transform"], passes["transform_whole"]),
        "convert_1w_over_transform": med["convert_1w"] / med["transform"],
        # CPU time, not wall: what the ratios would be with free cores (the 2-worker figure
        # is 2 x the CPU efficiency of the split: an upper bound that assumes a second idle
        # core).
        "convert_1w_over_floor_cpu": statistics.median(
            (f + g) / 2 / c for f, g, c in zip(cpu_passes["floor"], cpu_passes["floor_after"],
                                               cpu_passes["convert_1w"], strict=True)),
        "convert_2w_over_1w_cpu_bound": statistics.median(
            2 * a / b for a, b in zip(cpu_passes["convert_1w"], cpu_passes["convert_2w"],
                                      strict=True)),
    }
    ratios |= {k: {"value": round(v, 3), "target": None, "result": "info"}
               for k, v in info.items()}
    projection = project(med["convert_1w"], statistics.median(plan_s) / n, listing,
                         args.disk_gbps)
    return {
        "convert_1w_over_floor": ratios["convert_1w_over_floor"]["value"],
        "convert_2w_over_1w": ratios["convert_2w_over_1w"]["value"],
        "listing_us_per_image": listing["us_per_image"],
        "projection_minutes_with_listing": projection["minutes_with_listing"],
        "benchmark": "convert",
        "images_dir": str(args.images),
        "images": n,
        "input_mb": round(sum(len(b) for b in blobs) / MB, 2),
        "repeat": args.repeat,
        "rounds": rounds,
        "quiet_foreign_cores": QUIET_FOREIGN_CORES,
        "shards": shards,
        "loadavg_start": [round(x, 2) for x in load0],
        "loadavg_end": [round(x, 2) for x in load1],
        "size": SIZE,
        "quality": QUALITY,
        "filter": "lanczos",
        "cpus": os.cpu_count(),
        "pil": {k: pil[k] for k in ("pil_version", "pillow_simd", "stock_pillow_installed",
                                    "libjpeg_turbo", "jpeg_version", "cpu_avx2")},
        "floor_matches_transform": matches,
        "naive_peer": f"stock Pillow {stock_version}" if stock else "same PIL (pillow-simd)",
        "draft_reducible_images": draftable,
        "rates": rates,
        "cpu_us_per_image": {k: round(v * 1e6, 1) for k, v in cpu.items()},
        "ratios": ratios,
        "memory_2_workers": memory,
        "rss_target_mb": RSS_TARGET_MB,
        "listing": listing,
        "projection": projection,
        "noisy": min(v["quiet_passes"] for v in rates.values()) < need,
        "all_pass": all(v["result"] == "PASS" for v in ratios.values() if v["target"])
        and memory["result"] == "PASS",
    }


def run_form_rounds(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """``--form``: the forms against the plain tar of the same images."""
    paths = list_images(args.images, args.limit)
    if not paths:
        print(f"bench_convert: no .JPEG files in {args.images}", file=sys.stderr)
        raise SystemExit(2)
    tar = scratch / "imagenet-sample.tar"
    build_tar(paths, tar)
    load0 = os.getloadavg()
    forms = FORMS if "all" in args.form else tuple(dict.fromkeys(args.form))
    res = run_forms(forms, paths, tar, scratch, args.repeat,
                    min(args.shards, len(paths)) if args.shards else None)
    return {"benchmark": "convert-forms", "images_dir": str(args.images),
            "loadavg_start": [round(x, 2) for x in load0],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()], **res}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.form:
        return run_main("bench_convert", args.images, args.out,
                        partial(run_form_rounds, args), print_forms)
    if args.listing_only:
        with tempfile.TemporaryDirectory(prefix="bench-convert-", dir=args.out) as tmp:
            print(json.dumps({"benchmark": "convert-listing", "loadavg": os.getloadavg(),
                              **measure_listing(Path(tmp), args.listing_images)}))
        return 0
    return run_main("bench_convert", args.images, args.out, partial(run, args), print_table)


if __name__ == "__main__":
    sys.exit(main())
