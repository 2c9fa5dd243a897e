"""Small faithful copies of each form ImageNet is downloaded in, with known labels.

Every form is written from the one fake set of ``imgprep.inputs.fakeset`` (``sample_set``:
the same keys, classes and image bytes for the same ``SampleSpec``), so converting any two
forms of one spec gives the same samples. ``FAKES`` maps a form name to the
``"module:function"`` that writes it, ``write(out, spec) -> FakeSummary`` (what was
written), imported only when that form is asked for.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from imgprep.inputs.fakeset import FakeSummary, SampleSpec

FAKES: dict[str, str] = {
    "ilsvrc": "imgprep.inputs.fakes.ilsvrc:write",
    "kaggle": "imgprep.inputs.fakes.kaggle:write_tree",
    "kaggle-zip": "imgprep.inputs.fakes.kaggle:write_zip",
    "hf-parquet": "imgprep.inputs.fakes.parquet:write",
    "hf-targz": "imgprep.inputs.fakes.targz:write",
    "wds": "imgprep.inputs.fakes.wds:write",
    "in21k": "imgprep.inputs.fakes.in21k:write",
}

__all__ = ["FAKES", "FakeSummary", "SampleSpec", "make_fake"]


def make_fake(form: str, out: Path, spec: SampleSpec) -> FakeSummary:
    """Write the fake set ``spec`` in ``form`` into ``out``; returns what was written."""
    target = FAKES.get(form)
    if target is None:
        raise ValueError(f"unknown form {form!r}; known: {', '.join(FAKES)}")
    module, _, name = target.partition(":")
    summary: FakeSummary = getattr(importlib.import_module(module), name)(out, spec)
    return summary
