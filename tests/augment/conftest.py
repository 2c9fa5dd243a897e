"""The augmentation tests' inputs: the stock-Pillow reference environment (or a clear skip,
a failure under CI), and real crops of the sample images, made once a session."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imgprep import augment
from tests.support.augment import PILLOW_VERSION, REFERENCE_PYTHON

CROPS = 50  # real crops in the sweeps


@pytest.fixture(scope="session")
def reference() -> Path:
    """The reference environment's Python, checked to run stock Pillow PILLOW_VERSION. Absent:
    a failure under CI (CI=true), else a skip; both say to run `make setup`."""
    if not augment.AVAILABLE:
        pytest.skip("the C extension's augmentation ops are not built: make ext")
    problem = None
    if not REFERENCE_PYTHON.exists():
        problem = f"the stock-Pillow reference environment is missing ({REFERENCE_PYTHON})"
    else:
        got = subprocess.run([str(REFERENCE_PYTHON), "-I", "-c", "import PIL, numpy; "
                              "print(PIL.__version__)"], capture_output=True, text=True)
        if got.returncode != 0 or got.stdout.strip() != PILLOW_VERSION:
            problem = (f"{REFERENCE_PYTHON} does not run stock Pillow {PILLOW_VERSION} with "
                       f"numpy ({(got.stdout + got.stderr).strip()[-200:]})")
    if problem is not None:
        message = f"{problem}: run `make setup`, which builds it (build/pillow-reference)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return REFERENCE_PYTHON


def center_crops(real_data: Path, count: int, size: int) -> np.ndarray:
    """``count`` of the sample's images spread over its classes (grayscale ones converted),
    each's centre square resized to ``size`` (bilinear): count x size x size x 3."""
    files = sorted((real_data / "images").iterdir())
    out = np.empty((count, size, size, 3), np.uint8)
    for i, path in enumerate(files[::len(files) // count][:count]):
        with Image.open(path) as img:
            img.draft("RGB", (2 * size, 2 * size))
            rgb = img.convert("RGB")
        w, h = rgb.size
        s = min(w, h)
        box = ((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)
        out[i] = np.asarray(rgb.resize((size, size), Image.Resampling.BILINEAR, box=box))
    return out


@pytest.fixture(scope="session")
def crops(real_data: Path) -> np.ndarray:
    """50 real crops, 64 px."""
    return center_crops(real_data, CROPS, 64)


@pytest.fixture(scope="session")
def small_crops(crops: np.ndarray) -> np.ndarray:
    """The same crops at 32 px (bilinear)."""
    return np.stack([np.asarray(Image.fromarray(c).resize((32, 32), Image.Resampling.BILINEAR))
                     for c in crops])
