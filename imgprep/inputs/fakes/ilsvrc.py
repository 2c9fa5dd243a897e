"""The fake set as image-net.org ships it: ``imgprep.inputs.fakeset.make_sample``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from imgprep.inputs.fakeset import SampleSpec, make_sample


def write(out: Path, spec: SampleSpec) -> dict[str, Any]:
    s = make_sample(out, spec.classes, spec.per_class, spec.val, spec.seed, spec.bad)
    return {**s, "form": "ilsvrc", "test_images": 0, "inputs": [s["train_tar"], s["val_tar"]]}
