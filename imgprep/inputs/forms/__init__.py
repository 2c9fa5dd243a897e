"""ImageNet as users hold it: one module per form over a small source protocol (``base``).

``detect(path)`` asks each form's ``probe`` in the order of ``FORMS`` and returns the first
``Detected``; ``list_split`` lists one of its splits with the module that recognised it. A
form module is imported only when its turn comes (a parquet reader's dependency loads only
when a parquet is seen). A new form is one module with ``probe`` and ``list_split`` and one
line in ``FORMS``, placed before the forms that would also claim its inputs.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from imgprep.errors import InputMissingError, SourceFormatError
from imgprep.inputs.forms.base import Detected, ListContext, Skip, SplitInput, TextFile
from imgprep.inputs.sources import Listing

__all__ = ["FORMS", "Detected", "ListContext", "Skip", "SplitInput", "TextFile", "detect",
           "form_names", "list_split"]

# (form name, module): probed in this order; the first Detected wins. ``ilsvrc`` (the
# image-net.org tars and folders) takes whatever exists, so it comes last;
# ``other-archive`` only refuses (another compression, a split archive): it comes first;
# ``in21k`` (archives of class tars, plain or gzip-compressed) before the Hub's tar.gz.
FORMS: tuple[tuple[str, str], ...] = (
    ("other-archive", "imgprep.inputs.forms.refusals"),
    ("kaggle-zip", "imgprep.inputs.forms.kagglezip"),
    ("kaggle", "imgprep.inputs.forms.kaggle"),
    ("hf-parquet", "imgprep.inputs.forms.parquet"),
    ("in21k", "imgprep.inputs.forms.in21k"),
    ("hf-targz", "imgprep.inputs.forms.targz"),
    ("wds", "imgprep.inputs.forms.wds"),
    ("ilsvrc", "imgprep.inputs.forms.ilsvrc"),
)


def form_names() -> tuple[str, ...]:
    """The forms ``--form`` accepts, in detection order."""
    return tuple(name for name, _ in FORMS if name != "other-archive")


def _module(form: str) -> ModuleType:
    for name, module in FORMS:
        if name == form:
            return importlib.import_module(module)
    raise ValueError(f"unknown form {form!r}; known: {', '.join(form_names())}")


def detect(path: Path, form: str | None = None) -> Detected:
    """What ``path`` holds, by the first form whose probe recognises it (only ``form``'s
    when given: refused naming it when that form does not recognise ``path``)."""
    if not path.exists():
        raise InputMissingError(
            f"input {path} does not exist; pass ImageNet as downloaded as INPUT "
            "(ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar, the Kaggle zip or a folder)")
    forms = FORMS if form is None else tuple((n, m) for n, m in FORMS if n == form)
    if not forms:
        raise SourceFormatError(f"--form {form} is not a known form; pass one of "
                                f"{', '.join(form_names())}, or leave --form out to detect it")
    for _, module in forms:
        found: Detected | None = importlib.import_module(module).probe(path)
        if found is not None:
            return found
    raise SourceFormatError(f"{path} is not in the {form} form; leave --form out to detect "
                            "its form, or pass the form it is in")


def list_split(split: SplitInput, ctx: ListContext) -> Listing:
    """Every image of ``split``, listed by the module of its form."""
    listing: Listing = _module(split.form).list_split(split, ctx)
    return listing
