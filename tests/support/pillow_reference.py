"""Stock Pillow's own augmentation calls, run in the reference environment that ``make setup``
builds (``build/pillow-reference``: pillow==13.0.0 and numpy, nothing else), as a child:

    build/pillow-reference/bin/python tests/support/pillow_reference.py IN.npz OUT.npz [--full]
    build/pillow-reference/bin/python tests/support/pillow_reference.py IN.npz OUT.npz --time R

IN.npz holds ``crops`` (N x H x W x 3 uint8, RGB) and ``specs`` (a JSON text: a list of op
chains, each a list of steps ``{"op", "args", "resample", "fill"}``, carried out in order on
every crop). Each step is the Pillow call that imgprep.augment's op of the same name equals
(docs/augment.md), plus ``rotate`` (``args`` [degrees]: ``Image.rotate``). OUT.npz holds
``digests`` (chains x N x 16: BLAKE2b-128 of each result's H x W x 3 bytes), with ``--full``
also ``images`` (chains x N x H x W x 3), or with ``--time R`` only ``us`` (chains x N: each
call's least wall time over R runs, microseconds); and ``version``, PIL's.

Standard library, numpy and PIL only: it runs where imgprep is not installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import PIL
from PIL import Image, ImageEnhance, ImageOps

RESAMPLE = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
            "bicubic": Image.Resampling.BICUBIC}
ENHANCE = {"brightness": ImageEnhance.Brightness, "color": ImageEnhance.Color,
           "contrast": ImageEnhance.Contrast, "sharpness": ImageEnhance.Sharpness}


def posterize(img: Image.Image, bits: int) -> Image.Image:
    """ImageOps.posterize; bits 0 (which Pillow 13 refuses and timm's levels reach): its own
    table, ``i & ~(2 ** 8 - 1)``, through Image.point."""
    if bits >= 1:
        return ImageOps.posterize(img, bits)
    mask = ~(2 ** (8 - bits) - 1)
    return img.point([i & mask for i in range(256)] * 3)


def solarize_add(img: Image.Image, add: float, thresh: float) -> Image.Image:
    """timm's solarize_add (timm/data/auto_augment.py), transcribed."""
    lut = []
    for i in range(256):
        if i < thresh:
            lut.append(min(255, i + add))
        else:
            lut.append(i)
    return img.point(lut + lut + lut)


def step(img: Image.Image, s: dict[str, Any]) -> Image.Image:
    """One step: the Pillow call for ``s["op"]``."""
    op, args = s["op"], s.get("args", [])
    resample, fill = RESAMPLE[s.get("resample", "nearest")], tuple(s.get("fill", (0, 0, 0)))
    calls: dict[str, Callable[[], Image.Image]] = {
        "identity": lambda: img,
        "affine": lambda: img.transform(img.size, Image.Transform.AFFINE, args, resample,
                                        fillcolor=fill),
        "rotate": lambda: img.rotate(args[0], resample, fillcolor=fill),
        "posterize": lambda: posterize(img, int(args[0])),
        "solarize": lambda: ImageOps.solarize(img, args[0]),
        "solarize_add": lambda: solarize_add(img, args[0], args[1]),
        "autocontrast": lambda: ImageOps.autocontrast(img),
        "equalize": lambda: ImageOps.equalize(img),
        "invert": lambda: ImageOps.invert(img),
    }
    if op in ENHANCE:
        return ENHANCE[op](img).enhance(args[0])
    return calls[op]()


def run_chain(img: Image.Image, chain: list[dict[str, Any]]) -> Image.Image:
    for s in chain:
        img = step(img, s)
    return img


def digest(arr: np.ndarray) -> np.ndarray:
    return np.frombuffer(hashlib.blake2b(arr.tobytes(), digest_size=16).digest(), np.uint8)


def results(crops: np.ndarray, chains: list[list[dict[str, Any]]],
            full: bool) -> dict[str, np.ndarray]:
    images = [Image.fromarray(c, "RGB") for c in crops]
    digests = np.empty((len(chains), len(crops), 16), np.uint8)
    out = np.empty((len(chains), *crops.shape), np.uint8) if full else None
    for k, chain in enumerate(chains):
        for i, img in enumerate(images):
            arr = np.asarray(run_chain(img, chain))
            digests[k, i] = digest(arr)
            if out is not None:
                out[k, i] = arr
    return {"digests": digests} if out is None else {"digests": digests, "images": out}


def timings(crops: np.ndarray, chains: list[list[dict[str, Any]]], repeat: int) -> np.ndarray:
    """Each chain's least wall time on each crop over ``repeat`` rounds, microseconds."""
    images = [Image.fromarray(c, "RGB") for c in crops]
    best = np.full((len(chains), len(images)), np.inf)
    for _ in range(repeat):
        for k, chain in enumerate(chains):
            for i, img in enumerate(images):
                t0 = time.perf_counter_ns()
                run_chain(img, chain)
                best[k, i] = min(best[k, i], (time.perf_counter_ns() - t0) / 1e3)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--full", action="store_true", help="write every result image too")
    ap.add_argument("--time", type=int, default=0, metavar="R", help="time each chain instead")
    args = ap.parse_args(argv)
    with np.load(args.inp) as data:
        crops, chains = data["crops"], json.loads(str(data["specs"]))
    if args.time:
        np.savez(args.out, us=timings(crops, chains, args.time), version=np.array(PIL.__version__))
    else:
        np.savez(args.out, **results(crops, chains, args.full), version=np.array(PIL.__version__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
