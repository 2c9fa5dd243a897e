"""Chains of ops against stock Pillow's calls made one after the other, on real crops in both
layouts: the tables composed before one pass (and the statistics taken through them), the
copy the geometric and sharpness ops read, and every op after another, all give Pillow's
bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from imgprep import augment
from tests.support.augment import Reference, as_ops, step

MEAN = (124, 116, 104)
CHAINS = {
    "tables": [step("posterize", 5), step("solarize", 100), step("invert"),
               step("brightness", 1.3), step("solarize_add", 30, 128)],
    "contrast-after-tables": [step("solarize", 200), step("contrast", 1.6)],
    "histograms-after-tables": [step("brightness", 0.7), step("equalize"), step("autocontrast"),
                                step("contrast", 0.4)],
    "color-after-a-table": [step("invert"), step("color", 1.5)],
    "sharpness-after-a-table": [step("posterize", 4), step("sharpness", 1.8)],
    "affine-after-a-table": [step("solarize_add", 40, 128),
                             step("rotate", 30, resample="bilinear", fill=MEAN)],
    "timm-like": [step("rotate", 15, resample="bicubic", fill=MEAN), step("color", 1.4)],
    "long": [step("affine", *augment.shear_matrix(0.2), fill=MEAN), step("equalize"),
             step("sharpness", 0.3), step("color", 0.2),
             step("rotate", -45, resample="bicubic"), step("contrast", 0.5),
             step("posterize", 2), step("affine", *augment.translate_matrix(-5.5, 3),
                                        resample="bilinear", fill=(255, 0, 0))],
}


@pytest.fixture(scope="module")
def pillows(reference: Path, crops: np.ndarray,
            tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """Stock Pillow's results: chains x crops x H x W x 3 (the first 10 crops)."""
    ref = Reference(crops[:10], list(CHAINS.values()), tmp_path_factory.mktemp("chains"),
                    full=True)
    return ref.result()["images"]


@pytest.mark.parametrize("planar", [True, False], ids=["planar", "rows"])
@pytest.mark.parametrize("name", list(CHAINS))
def test_a_chain_gives_pillows_bytes(name: str, planar: bool, pillows: np.ndarray,
                                     crops: np.ndarray) -> None:
    k = list(CHAINS).index(name)
    for i, theirs in enumerate(pillows[k]):
        ops = as_ops(CHAINS[name], crops.shape[2], crops.shape[1])
        img = np.ascontiguousarray(crops[i].transpose(2, 0, 1)) if planar else crops[i].copy()
        augment.apply(img, ops, planar=planar)
        ours = img.transpose(1, 2, 0) if planar else img
        diff = np.abs(ours.astype(np.int16) - theirs)
        assert diff.max() == 0, f"crop {i}: {np.count_nonzero(diff)} bytes differ, " \
                                f"by up to {diff.max()}"
