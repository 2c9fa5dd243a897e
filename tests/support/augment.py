"""The augmentation tests' side of the stock-Pillow reference: where its environment is, how a
chain of steps is written for it (``tests/support/pillow_reference.py`` carries them out in
that environment, as a child), and the same chain as ``imgprep.augment`` ops."""

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
