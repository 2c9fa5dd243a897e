"""Nearest translations are made in place (each row fill or one run of one source row, rows in
an order that reads each source row before it is written over; no copy of the image): against
stock Pillow 13.0.0's Image.transform on real crops, for fractional shifts (timm's relative
translations land between pixels), shifts of more than the image (all fill), none, both
directions on both axes, and after a lookup table still pending: byte-equal."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from imgprep import augment
from tests.support.augment import differing, step

MEAN = (124, 116, 104)
SHIFTS = [-70.0, -64.0, -31.7, -10.5, -0.49, 0.0, 0.5, 3.2, 28.8, 63.9, 64.0, 100.0]


def test_a_translation_by_nearest_gives_pillows_bytes(reference: Path, crops: np.ndarray,
                                                      tmp_path: Path) -> None:
    chains = [[step("affine", *augment.translate_matrix(dx, dy), fill=MEAN)]
              for dx in SHIFTS for dy in (-12.25, 0.0, 5.5)]
    chains += [[step("affine", *augment.translate_matrix(dx, dx), fill=MEAN)]
               for dx in SHIFTS]
    chains += [[step("solarize", 100), step("affine", *augment.translate_matrix(-7.5, 9.25))],
               [step("posterize", 3), step("invert"),
                step("affine", *augment.translate_matrix(20, -3), fill=(255, 0, 9)),
                step("equalize")]]
    assert differing(crops[:10], chains, tmp_path) == []
