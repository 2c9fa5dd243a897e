"""The fake set as image-net.org ships it: ``imgprep.inputs.fakeset.make_sample``."""

from __future__ import annotations

from pathlib import Path

from imgprep.inputs.fakeset import FakeSummary, SampleSpec, make_sample


def write(out: Path, spec: SampleSpec) -> FakeSummary:
    return make_sample(out, spec.classes, spec.per_class, spec.val, spec.seed, spec.bad)
