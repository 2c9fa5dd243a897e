"""The affine op against stock Pillow 13.0.0's Image.transform and Image.rotate, on 50 real
crops at every TrivialAugmentWide magnitude bin of shear x and y, translate x and y and rotate
(both signs), with nearest, bilinear and bicubic resampling and two fills: byte-equal
(tests/support/augment.py). The crops are 32 px: 91,500 transforms on each side (bicubic's
cost grows with the pixels) keep the test to its share of the time budget, and every path of
Pillow's is met at that size (nearest's scale and fixed-point paths, rotate's 90-degree
shortcut, the interpolations' clamped edges, fill where a sample falls outside)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.augment import differing, geometry_chains


@pytest.mark.slow
def test_affine_gives_pillows_bytes_at_every_bin_filter_and_fill(
        reference: Path, small_crops: np.ndarray, tmp_path: Path) -> None:
    chains = geometry_chains()
    assert len(chains) == 3 * 2 * 5 * 61
    assert differing(small_crops, chains, tmp_path) == []
