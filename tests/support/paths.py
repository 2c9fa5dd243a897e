"""Where the tests find the repository and the real ImageNet sample."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REAL_DATA = Path(os.environ.get("IMGPREP_SAMPLE_DATA",
                                REPO.parent / "shared" / "data" / "imagenet-sample"))
