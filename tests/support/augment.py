"""The augmentation tests' side of the stock-Pillow reference: where its environment is, how a
chain of steps is written for it (``tests/support/pillow_reference.py`` carries them out in
that environment, as a child), the same chain as ``imgprep.augment`` ops; and the sweeps'
cases, every op at every magnitude bin of torchvision's TrivialAugmentWide (both signs of the
signed ones), with the check that imgprep's ops give Pillow's bytes on the same crops."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from imgprep import augment
from tests.support.paths import REPO

# `make setup` builds it (the Makefile's PILLOW_REF): pillow==13.0.0 and numpy, nothing else
REFERENCE_ENV = Path(os.environ.get("IMGPREP_PILLOW_REFERENCE",
                                    REPO / "build" / "pillow-reference"))
REFERENCE_PYTHON = REFERENCE_ENV / "bin" / "python"
SCRIPT = REPO / "tests" / "support" / "pillow_reference.py"
PILLOW_VERSION = "13.0.0"
Step = dict[str, Any]  # {"op", "args", "resample", "fill"}: pillow_reference.py's steps


def step(op: str, *args: float, resample: str = "nearest",
         fill: Sequence[int] = (0, 0, 0)) -> Step:
    return {"op": op, "args": [float(a) for a in args], "resample": resample,
            "fill": [int(v) for v in fill]}


def as_ops(chain: Sequence[Step], width: int, height: int) -> list[augment.Op]:
    """The chain as imgprep ops: ``rotate`` (Image.rotate) as the affine op of
    ``rotate_matrix``, every other step as the op of its name."""
    ops = []
    for s in chain:
        fill = tuple(s["fill"])
        if s["op"] == "rotate":
            matrix = augment.rotate_matrix(s["args"][0], width, height)
            ops.append(augment.Op("affine", matrix, s["resample"], fill))  # type: ignore[arg-type]
        else:
            ops.append(augment.Op(s["op"], tuple(s["args"]), s["resample"], fill))  # type: ignore[arg-type]
    return ops


def digest(hwc: np.ndarray) -> bytes:
    """What the reference script writes for a result: BLAKE2b-128 of its H x W x 3 bytes."""
    return hashlib.blake2b(np.ascontiguousarray(hwc).tobytes(), digest_size=16).digest()


class Reference:
    """One run of the reference script over ``crops`` (N x H x W x 3) and ``chains``, started
    at once in the background (the caller computes its own side meanwhile)."""

    def __init__(self, crops: np.ndarray, chains: Sequence[Sequence[Step]], work: Path, *,
                 full: bool = False) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.inp, self.out = work / "reference-in.npz", work / "reference-out.npz"
        np.savez(self.inp, crops=crops, specs=np.array(json.dumps([list(c) for c in chains])))
        cmd = [str(REFERENCE_PYTHON), "-I", str(SCRIPT), str(self.inp), str(self.out)]
        self.proc = subprocess.Popen([*cmd, *(["--full"] if full else [])],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def result(self) -> dict[str, np.ndarray]:
        """``digests`` (chains x N x 16), ``images`` with ``full``, and ``version``."""
        text, _ = self.proc.communicate(timeout=600)
        if self.proc.returncode != 0:
            raise AssertionError(f"the reference script failed ({self.proc.returncode}):\n{text}")
        with np.load(self.out) as data:
            return {k: data[k] for k in data.files}


BINS = 31
FILLS = ((0, 0, 0), (124, 116, 104))  # black, and timm's default fill (the ImageNet mean)
LEVEL_DENOM = 10.0  # timm/data/auto_augment.py's _LEVEL_DENOM


def trivial_augment_wide(num_bins: int = BINS) -> dict[str, tuple[list[float], bool]]:
    """torchvision's ``TrivialAugmentWide._augmentation_space(num_bins)``, transcribed from
    torchvision/transforms/autoaugment.py (torchvision 0.12 and later; 0.11 started Solarize
    at 256.0, pytorch/vision#4805): op name -> (magnitudes, signed), each magnitude as
    ``float(magnitudes[i].item())`` (``int`` for Posterize) gives it to ``_apply_op``."""
    import torch

    space = {
        # op_name: (magnitudes, signed)
        "Identity": (torch.tensor(0.0), False),
        "ShearX": (torch.linspace(0.0, 0.99, num_bins), True),
        "ShearY": (torch.linspace(0.0, 0.99, num_bins), True),
        "TranslateX": (torch.linspace(0.0, 32.0, num_bins), True),
        "TranslateY": (torch.linspace(0.0, 32.0, num_bins), True),
        "Rotate": (torch.linspace(0.0, 135.0, num_bins), True),
        "Brightness": (torch.linspace(0.0, 0.99, num_bins), True),
        "Color": (torch.linspace(0.0, 0.99, num_bins), True),
        "Contrast": (torch.linspace(0.0, 0.99, num_bins), True),
        "Sharpness": (torch.linspace(0.0, 0.99, num_bins), True),
        "Posterize": (8 - (torch.arange(num_bins) / ((num_bins - 1) / 6)).round().int(), False),
        "Solarize": (torch.linspace(255.0, 0.0, num_bins), False),
        "AutoContrast": (torch.tensor(0.0), False),
        "Equalize": (torch.tensor(0.0), False),
    }
    return {name: (mags.reshape(-1).tolist(), signed) for name, (mags, signed) in space.items()}


def magnitudes(name: str) -> list[float]:
    """Every bin of the op ``name``, and its negative where the op is signed (0 once)."""
    mags, signed = trivial_augment_wide()[name]
    return [*mags, *(-m for m in mags if m != 0)] if signed else mags


def colour_chains() -> list[list[Step]]:
    """The colour and histogram ops: TrivialAugmentWide's at every bin (the enhance factors
    ``1 + m``), with invert, posterize's 1 and 0 bits (timm's levels reach them) and timm's
    solarize_add at 31 levels of its range (``int(level / 10 * 110)``, threshold 128)."""
    chains = [[step("identity")], [step("autocontrast")], [step("equalize")], [step("invert")]]
    for name in ("Brightness", "Color", "Contrast", "Sharpness"):
        chains += [[step(name.lower(), 1.0 + m)] for m in magnitudes(name)]
    chains += [[step("posterize", bits)] for bits in [*magnitudes("Posterize"), 1, 0]]
    chains += [[step("solarize", t)] for t in magnitudes("Solarize")]
    levels = [LEVEL_DENOM * i / (BINS - 1) for i in range(BINS)]
    chains += [[step("solarize_add", int(level / LEVEL_DENOM * 110), 128)] for level in levels]
    return chains


def geometry_chains() -> list[list[Step]]:
    """Shear x and y (timm's matrices), translate x and y (pixels), rotate (Image.rotate), at
    every bin and both signs, for each filter and both fills."""
    chains = []
    for resample in augment.RESAMPLES:
        for fill in FILLS:
            for m in magnitudes("ShearX"):
                chains.append([step("affine", *augment.shear_matrix(m, 0), resample=resample,
                                    fill=fill)])
            for m in magnitudes("ShearY"):
                chains.append([step("affine", *augment.shear_matrix(0, m), resample=resample,
                                    fill=fill)])
            for m in magnitudes("TranslateX"):
                chains.append([step("affine", *augment.translate_matrix(m, 0),
                                    resample=resample, fill=fill)])
            for m in magnitudes("TranslateY"):
                chains.append([step("affine", *augment.translate_matrix(0, m),
                                    resample=resample, fill=fill)])
            for m in magnitudes("Rotate"):
                chains.append([step("rotate", m, resample=resample, fill=fill)])
    return chains


def differing(crops: np.ndarray, chains: Sequence[Sequence[Step]], work: Path) -> list[str]:
    """Each chain on each crop, by imgprep (planar for even chains, rows of pixels for odd)
    and by stock Pillow (in the reference environment, meanwhile): the chains whose bytes
    differ on some crop, with how many."""
    ref = Reference(crops, chains, work)
    n, h, w = crops.shape[:3]
    planar = np.ascontiguousarray(crops.transpose(0, 3, 1, 2))
    ours = np.empty((len(chains), n, 16), np.uint8)
    for k, chain in enumerate(chains):
        ops = as_ops(chain, w, h)
        for i in range(n):
            if k % 2 == 0:
                out = planar[i].copy()
                augment.apply(out, ops, planar=True)
                result = out.transpose(1, 2, 0)
            else:
                result = crops[i].copy()
                augment.apply(result, ops, planar=False)
            ours[k, i] = np.frombuffer(digest(result), np.uint8)
    theirs = ref.result()
    assert str(theirs["version"]) == "13.0.0"
    bad = (ours != theirs["digests"]).any(axis=2)
    return [f"{chains[k]}: {int(bad[k].sum())} of {n} crops differ" for k in np.flatnonzero(
        bad.any(axis=1))]
