"""Small faithful copies of each form ImageNet is downloaded in, with known labels.

Every form is written from the one fake set of ``imgprep.inputs.fakeset`` (``sample_set``:
the same keys, classes and image bytes for the same ``SampleSpec``), so converting any two
forms of one spec gives the same samples. Each form names the ``"module:function"`` that
writes its fake (its ``FAKE``), ``write(out, spec) -> FakeSummary`` (what was written): a
module here, imported only when that form is asked for. ``FAKES`` maps each form's name to
it, in the registry's order.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from imgprep.inputs.fakeset import FakeSummary, SampleSpec
from imgprep.inputs.forms import FORMS

FAKES: dict[str, str] = {f.NAME: f.FAKE for f in FORMS}

__all__ = ["FAKES", "FakeSummary", "SampleSpec", "make_fake"]


def make_fake(form: str, out: Path, spec: SampleSpec) -> FakeSummary:
    """Write the fake set ``spec`` in ``form`` into ``out``; returns what was written."""
    target = FAKES.get(form)
    if target is None:
        raise ValueError(f"unknown form {form!r}; known: {', '.join(FAKES)}")
    module, _, name = target.partition(":")
    summary: FakeSummary = getattr(importlib.import_module(module), name)(out, spec)
    return summary
