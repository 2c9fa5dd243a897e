"""The nvJPEG spike: how fast a GPU decodes and crops a batch of shard JPEGs, stage by stage.

    python -m harness.gpukit.nvjpeg_spike --out DIR              # on the GPU machine
    python -m harness.gpukit.nvjpeg_spike --device cpu --out DIR # its CPU form, anywhere

It makes its own data on the machine (the kit's synthetic ILSVRC-shaped input converted into
256 px shards by ``python -m imgprep convert``: ``harness.gpukit.data``, 4,096 images on a
GPU, 192 in the CPU form, in ``--work DIR`` or a temporary folder), reads every sample's
JPEG bytes from the shards into memory, then times batches of ``--batch`` (256 on a GPU),
each stage synchronised before the clock stops:

- ``decode``: ``torchvision.io.decode_jpeg(list, device="cuda")``, one call a batch (the
  ``nvjpeg`` backend's ``nvjpeg_decode``); in the CPU form Pillow's whole-image decode, one
  image after the other (its fallback, ``cpu_decode``);
- ``draws``: the random-resized-crop boxes and flips, drawn on the CPU one image after the
  other by the Pillow backend's own draws (``loaders.batchcrop.boxes``);
- ``crop``: every box resampled to 224 px and flipped in one batched gather
  (``loaders.batchcrop.crop_resize``, channels_last rows, the trainer's layout);
- ``pipeline``: the three in a row, as the backend makes a batch (reading aside);

and, for scale, the Pillow backend's per-image work (decode + crop, ``SampleDecoder``) on
one CPU core, and how far the GPU's val crops are from the Pillow path's (mean absolute
difference, of 255). Every stage runs ``--rounds`` passes over the set after one warm-up
batch (nvJPEG's and CUDA's start-up); the figures are medians over the passes. The record
goes to ``DIR/nvjpeg_spike.json`` and a summary to stdout. About a minute on the GPU
machine, data included.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from imgprep import write_bytes_atomic
from loaders import SampleDecoder, TrainTransform, ValTransform
from loaders.batchcrop import boxes, crop_resize
from loaders.nvjpeg import cpu_decode, load_nvjpeg, nvjpeg_decode
from loaders.transforms import apply

from .data import converted
from .machine import cores
from .profile import profile_for

JSON_NAME = "nvjpeg_spike.json"
PILLOW_IMAGES = 256  # the Pillow reference's images
VAL_IMAGES = 64  # compared with the Pillow path's val crops


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m harness.gpukit.nvjpeg_spike",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--out", type=Path, required=True, help="folder for nvjpeg_spike.json")
    ap.add_argument("--work", type=Path, default=None,
                    help="folder for the data, kept (default: a temporary folder)")
    ap.add_argument("--batch", type=int, default=0, help="images a batch (0: 256 on a GPU, "
                    "32 in the CPU form)")
    ap.add_argument("--size", type=int, default=224, help="the crop's side")
    ap.add_argument("--rounds", type=int, default=3, help="timed passes over the set")
    return ap.parse_args(argv)


def read_jpegs(folder: Path) -> list[bytes]:
    """Every sample's JPEG of the converted train split, in shard order."""
    out = []
    for shard in sorted(folder.glob("train-*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf:
                f = tf.extractfile(m) if m.name.endswith(".jpg") else None
                if f is not None:
                    out.append(f.read())
    if not out:
        raise RuntimeError(f"{folder}: no train-*.tar shard holds a .jpg sample")
    return out


def timed(batches: int, batch: int, rounds: int, step: Callable[[int], Any],
          sync: Callable[[], None]) -> dict[str, float]:
    """``step(k)`` for every batch ``k``, ``rounds`` times after one warm-up batch: the
    median images/s and ms a batch."""
    step(0)
    sync()
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for k in range(batches):
            step(k)
        sync()
        rates.append(batches * batch / (time.perf_counter() - t0))
    rate = statistics.median(rates)
    return {"images_per_s": round(rate, 1), "ms_per_batch": round(1e3 * batch / rate, 2)}


def decoder_for(device: torch.device) -> tuple[Callable[[list[bytes]], list[Any]], str]:
    """A batch's decode on ``device`` and its name: nvJPEG through torchvision, or Pillow."""
    if device.type == "cuda":
        nvjpeg = load_nvjpeg(0)
        import torchvision

        def on_gpu(batch: list[bytes]) -> list[Any]:
            return nvjpeg_decode(nvjpeg, batch, device)

        return on_gpu, f"nvJPEG (torchvision {torchvision.__version__}, batched)"

    def on_cpu(batch: list[bytes]) -> list[Any]:
        return [cpu_decode(d, "spike") for d in batch]

    return on_cpu, "Pillow on the CPU (whole image, one at a time)"


def stages(batches: list[list[bytes]], device: torch.device, size: int, rounds: int
           ) -> dict[str, Any]:
    """The four timed stages (module docstring), and how many samples nvJPEG refused."""
    decode, name = decoder_for(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    t = TrainTransform(size=size)
    decoded = [decode(b) for b in batches]
    refused = sum(1 for images in decoded for im in images if im is None)
    decoded = [[im for im in images if im is not None] for images in decoded]
    sizes = [[(im.shape[2], im.shape[1]) for im in images] for images in decoded]
    drawn = [boxes(s, t, np.random.default_rng(k)) for k, s in enumerate(sizes)]

    def draws(k: int) -> Any:
        return boxes(sizes[k], t, np.random.default_rng(k))

    def crop(k: int) -> Any:
        return crop_resize(decoded[k], *drawn[k], size, channels_last=True)

    def pipeline(k: int) -> Any:
        images = [im for im in decode(batches[k]) if im is not None]
        box, flip = boxes([(im.shape[2], im.shape[1]) for im in images], t,
                          np.random.default_rng(k))
        return crop_resize(images, box, flip, size, channels_last=True)

    out = {"decoder": name, "nvjpeg_refused": refused}
    steps: dict[str, Callable[[int], Any]] = {
        "decode": lambda k: decode(batches[k]), "draws": draws, "crop": crop,
        "pipeline": pipeline}
    for stage, step in steps.items():
        out[stage] = timed(len(batches), len(batches[0]), rounds, step, sync)
    return out


def pillow_reference(jpegs: list[bytes], size: int) -> dict[str, float]:
    """The Pillow backend's per-image work (decode + random-resized-crop + flip), one core."""
    decoder = SampleDecoder(TrainTransform(size=size), channels_last=True)
    row = np.empty((size, size, 3), np.uint8)
    rng = np.random.default_rng(0)
    images = [jpegs[i % len(jpegs)] for i in range(PILLOW_IMAGES)]
    t0 = time.perf_counter()
    for data in images:
        decoder(data, rng, row)
    return {"images_per_s": round(len(images) / (time.perf_counter() - t0), 1),
            "crop_aware_images": decoder.fast_count}


def val_gap(jpegs: list[bytes], device: torch.device, size: int) -> dict[str, float]:
    """Val crops (short side 256, center ``size``) of the GPU path against the Pillow path:
    the mean absolute difference per image (of 255), its mean and largest."""
    t = ValTransform(size=size, resize=round(size * 256 / 224))
    decode, _ = decoder_for(device)
    images = [im for im in decode(jpegs[:VAL_IMAGES]) if im is not None]
    box, flip = boxes([(im.shape[2], im.shape[1]) for im in images], t,
                      np.random.default_rng(0))
    got = crop_resize(images, box, flip, size).cpu().float()
    want = np.empty((len(images), 3, size, size), np.uint8)
    for i, data in enumerate(jpegs[:len(images)]):
        apply(data, t, np.random.default_rng(0), want[i])
    gap = (got - torch.from_numpy(want).float()).abs().mean(dim=(1, 2, 3))
    return {"images": len(images), "mean": round(float(gap.mean()), 3),
            "largest": round(float(gap.max()), 3)}


def machine(device: torch.device) -> dict[str, Any]:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "gpu": gpu, "cores": cores()}


def spike(args: argparse.Namespace, device: torch.device, work: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    profile = profile_for(device.type, quick=True)
    data = converted(work, profile, profile.timeout_s)
    jpegs = read_jpegs(data)
    batch = args.batch or (256 if device.type == "cuda" else 32)
    batches = [jpegs[i:i + batch] for i in range(0, len(jpegs) - batch + 1, batch)]
    if not batches:
        raise RuntimeError(f"{len(jpegs)} images make no batch of {batch}")
    made_s = time.perf_counter() - t0
    record: dict[str, Any] = {"machine": machine(device), "device": device.type,
                              "batch": batch, "batches": len(batches), "size": args.size,
                              "rounds": args.rounds, "data_seconds": round(made_s, 1)}
    record["stages"] = stages(batches, device, args.size, args.rounds)
    record["pillow_one_core"] = pillow_reference(jpegs, args.size)
    record["val_vs_pillow"] = val_gap(jpegs, device, args.size)
    if device.type == "cuda":
        record["peak_gpu_memory_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20)
    record["seconds"] = round(time.perf_counter() - t0, 1)
    return record


def summary(record: dict[str, Any]) -> list[str]:
    s = record["stages"]
    lines = [f"{record['machine']['gpu'] or 'CPU'}; torch {record['machine']['torch']}; "
             f"decoder: {s['decoder']}; batch {record['batch']} x {record['batches']}"]
    for stage in ("decode", "draws", "crop", "pipeline"):
        lines.append(f"{stage}: {s[stage]['images_per_s']:,.0f} img/s "
                     f"({s[stage]['ms_per_batch']} ms a batch)")
    lines.append(f"Pillow backend's per-image work, one core: "
                 f"{record['pillow_one_core']['images_per_s']:,.0f} img/s")
    gap = record["val_vs_pillow"]
    lines.append(f"val crops against the Pillow path: mean |diff| {gap['mean']} "
                 f"(largest {gap['largest']}) of 255; nvJPEG refused {s['nvjpeg_refused']}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    asked = args.device
    if asked == "auto":
        asked = "cuda" if torch.cuda.is_available() else "cpu"
    if asked == "cuda" and not torch.cuda.is_available():
        print("nvjpeg_spike: error: --device cuda, but torch sees no CUDA device",
              file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if asked == "cuda" else torch.device("cpu")
    work = args.work or Path(tempfile.mkdtemp(prefix="nvjpeg-spike-"))
    try:
        record = spike(args, device, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(args.out / JSON_NAME,
                       (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
    for line in summary(record):
        print(f"nvjpeg_spike: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
