"""The colour and histogram ops against stock Pillow 13.0.0's own calls, on 50 real 64 px
crops at every TrivialAugmentWide magnitude bin (tests/support/augment.py): byte-equal.
(64 px, not larger: the 17,150 calls on each side keep the test to its share of the time
budget.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.augment import colour_chains, differing


@pytest.mark.slow
def test_colour_and_histogram_ops_give_pillows_bytes_at_every_bin(
        reference: Path, crops: np.ndarray, tmp_path: Path) -> None:
    chains = colour_chains()
    assert len(chains) == 4 + 4 * 61 + 33 + 31 + 31
    assert differing(crops, chains, tmp_path) == []
