"""ImageNet as users hold it: one module per form over a small source protocol (``base``).

``FORMS`` is the registry: the form modules themselves, each keeping the ``Form`` protocol
(mypy checks each one against it), each named once, by its own ``NAME``. ``detect(path)``
first refuses the downloads no form reads (``refusals``), then asks each form's ``probe`` in
the order of ``FORMS`` and returns the first ``Detected``; ``list_split`` lists one of its
splits with the form that recognised it. A form module imports its optional dependency
(pyarrow, zlib-ng) only inside the functions that read such a file, so that importing the
registry stays cheap. A new form is one module and one entry in ``FORMS``, placed before the
forms that would also claim its inputs.
"""

from __future__ import annotations

from pathlib import Path

from imgprep.errors import InputMissingError, SourceFormatError
from imgprep.inputs.forms import ilsvrc, in21k, kaggle, kagglezip, parquet, targz, wds
from imgprep.inputs.forms.base import Detected, Form, ListContext, Skip, SplitInput, TextFile
from imgprep.inputs.forms.refusals import is_tar, refuse
from imgprep.inputs.sources import Listing

__all__ = ["FORMS", "Detected", "Form", "ListContext", "Skip", "SplitInput", "TextFile",
           "detect", "form_names", "form_of", "list_split", "what_is"]

# Probed in this order; the first Detected wins. ``ilsvrc`` (the image-net.org tars and
# folders) takes whatever exists, so it comes last; ``in21k`` (archives of class tars, plain
# or gzip-compressed) before the Hub's tar.gz, which would take a gzip-compressed one.
FORMS: tuple[Form, ...] = (kagglezip, kaggle, parquet, in21k, targz, wds, ilsvrc)


def form_names() -> tuple[str, ...]:
    """The forms ``--form`` accepts, in detection order."""
    return tuple(f.NAME for f in FORMS)


def form_of(name: str) -> Form:
    """The form called ``name``; ValueError naming the known ones."""
    for f in FORMS:
        if f.NAME == name:
            return f
    raise ValueError(f"unknown form {name!r}; known: {', '.join(form_names())}")


def detect(path: Path, form: str | None = None) -> Detected:
    """What ``path`` holds, by the first form whose probe recognises it (only ``form``'s
    when given: refused saying what ``path`` is when that form does not recognise it)."""
    if not path.exists():
        raise InputMissingError(
            f"input {path} does not exist; pass ImageNet as downloaded as INPUT "
            "(ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar, the Kaggle zip or a folder)")
    refuse(path)  # read by no form, whatever --form says
    forms = FORMS if form is None else tuple(f for f in FORMS if f.NAME == form)
    if not forms:
        raise SourceFormatError(f"--form {form} is not a known form; pass one of "
                                f"{', '.join(form_names())}, or leave --form out to detect it")
    for f in forms:
        found = f.probe(path)
        if found is not None:
            return found
    raise SourceFormatError(f"{path} is not in the {form} form: {what_is(path)}; leave --form "
                            "out to detect its form, or pass the form it is in")


def what_is(path: Path) -> str:
    """What ``path`` holds ("it is …"), for the refusal of a ``--form`` it is not in: what
    ``refuse`` or another form's probe finds, else its first bytes."""
    try:
        refuse(path)
        for f in FORMS:
            found = f.probe(path)
            if found is not None and (f.NAME != "ilsvrc" or path.is_dir() or is_tar(path)):
                return f"it is {found.description} (--form {found.form})"
    except SourceFormatError as e:
        said = str(e)
        return f"it {said[len(str(path)) + 1:]}" if said.startswith(f"{path} ") else said
    with open(path, "rb") as fh:
        head = fh.read(16)
    return f"it is in no form imgprep reads (it starts {head!r})"


def list_split(split: SplitInput, ctx: ListContext) -> Listing:
    """Every image of ``split``, listed by the module of its form."""
    return form_of(split.form).list_split(split, ctx)
