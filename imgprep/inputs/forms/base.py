"""The source protocol: what a form is, what its probe finds and what its lister is given.

A form is one module that keeps the ``Form`` protocol: its name (``NAME``, written once: the
registry, ``FORMS`` in ``imgprep.inputs.forms``, holds the module itself), where its fake is
written (``FAKE``), ``probe(path) -> Detected | None`` (cheap: names, magic bytes, a zip's
central directory at most; None: not this form; a SourceFormatError: this form, but
unreadable as it stands, saying what was seen and what works) and
``list_split(split, ctx) -> Listing`` (every image of one split, with the class its form
carries in the ``wnid`` column, so one downstream path labels and checks every form). mypy
checks every module of the registry against the protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from imgprep.inputs.reader import TextFile
from imgprep.inputs.sources import Listing
from imgprep.inputs.synsets import ClassTable, imagenet_classes
from imgprep.sections import SPLITS

# Why a test split is not converted by default (said once per form that holds one).
TEST_REASON = "images without labels; --split test converts them as an unlabelled split"
__all__ = ["Detected", "Form", "ListContext", "Skip", "SplitInput", "TextFile"]


@dataclass(frozen=True, kw_only=True)
class SplitInput:
    """One split of a detected input: which form lists it, where its images and labels are.

    ``split``: train, val or test; None when only the listing tells (a flat tar or folder:
    ``val`` when every name is ``ILSVRC2012_val_*``, else train). ``path``: the file or
    folder holding the images; ``prefix``: the member-name prefix inside an archive.
    ``where`` and ``labels`` say it for people. ``truth``: ground-truth files the form found
    (used when no ``--labels`` is given). ``by_default``: converted when no ``--split`` is
    given (a test split without labels is not). ``spool_bytes``: disk the one staging copy
    takes, for a form without random access (0: read in place). ``images``: the count, when
    it is cheap to know before listing. ``own_classes``: the class table is the sorted wnids
    the split holds (ImageNet-21k), not the ILSVRC2012 one, unless ``--classes`` gives one.
    ``dry_listed``: ``--dry-run`` lists it (without a staging copy) and checks its labels as
    the run does; False: it can be listed only through its staging copy, and a dry run says
    what the probe tells.
    """

    form: str
    split: str | None
    path: Path
    prefix: str = ""
    where: str
    labels: str
    labelled: bool = True
    truth: tuple[TextFile, ...] = ()
    by_default: bool = True
    spool_bytes: int = 0
    images: int | None = None
    own_classes: bool = False
    dry_listed: bool = True

    def __post_init__(self) -> None:
        if self.split is not None and self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS} or None, not {self.split!r}")
        if self.spool_bytes < 0 or (self.images is not None and self.images < 0):
            raise ValueError("spool_bytes and images are counts (>= 0)")


@dataclass(frozen=True, kw_only=True)
class Skip:
    """Something the input holds that is not converted, and why (said in one line);
    ``split``: the split it is, when ``--split`` can pick it (then it is not said)."""

    what: str
    reason: str
    split: str | None = None

    def __str__(self) -> str:
        return f"{self.what}: {self.reason}"


@dataclass(frozen=True, kw_only=True)
class Detected:
    """What ``detect`` recognised at ``root``: the form, its splits in conversion order
    (train first), and what it holds that is not converted."""

    form: str
    root: Path
    description: str
    splits: tuple[SplitInput, ...]
    skipped: tuple[Skip, ...] = ()

    def split(self, name: str) -> SplitInput | None:
        """The split called ``name``, or None."""
        return next((s for s in self.splits if s.split == name), None)

    def not_converted(self, picked: Iterable[str | None]) -> tuple[Skip, ...]:
        """What is skipped when the splits ``picked`` are converted: a skipped split that
        ``--split`` picked is converted, so it is not said."""
        chosen = set(picked)
        return tuple(s for s in self.skipped if s.split is None or s.split not in chosen)


@dataclass(frozen=True, kw_only=True)
class ListContext:
    """What ``list_split`` is given besides the split: ``workers`` (processes it may use to
    list; the listing must not depend on it), ``classes`` (the class table, for forms that
    carry class indices: map index -> wnid through it), ``spool_dir`` (an empty-or-resumable
    folder under the output's state folder for the one staging copy of a form without random
    access; None: write nothing, as in ``--dry-run``), ``spool_start`` (which of its source
    files this process spools first: its rank, so that the ranks of a job share the work),
    ``max_image_bytes`` (the staging copy refuses an image larger than this before reading
    it; None: no cap), ``trust_labels`` (``--trust-labels``: a form that cannot check a
    label against its image's name takes it as given instead of refusing it)."""

    workers: int | None = None
    classes: ClassTable = field(default_factory=imagenet_classes)
    spool_dir: Path | None = None
    spool_start: int = 0
    max_image_bytes: int | None = None
    trust_labels: bool = False


class Form(Protocol):
    """An input form: a module with these names (module constants for the properties).

    ``NAME``: the form's one name (``--form``, ``SplitInput.form``, ``Detected.form``).
    ``FAKE``: ``"module:function"`` that writes a small fake of it (``imgprep make-sample
    --form NAME``, ``imgprep.inputs.fakes``), imported only when it is asked for.
    """

    @property
    def NAME(self) -> str: ...

    @property
    def FAKE(self) -> str: ...

    def probe(self, path: Path) -> Detected | None:
        """What ``path`` holds in this form, None when it is not in this form."""
        ...

    def list_split(self, split: SplitInput, ctx: ListContext) -> Listing:
        """Every image of ``split``, one of those this form's probe found."""
        ...


def hub_splits(*, form: str, path: Path, found: dict[str, list[Path]], files_are: str, one: str,
               labels: str, description: str,
               count: Callable[[list[Path]], int | None] | None = None) -> Detected:
    """The splits of a copy whose files name their split (the Hub's parquet files or tar.gz
    archives): one staged split each, its staging copy as large as its files; the test split
    skipped, saying so, unless ``--split test``. ``files_are``: what several files are called
    ("parquet files"), ``one``: what one is ("parquet"); ``count``: the images, where the files
    tell them cheaply."""
    splits: list[SplitInput] = []
    skipped: list[Skip] = []
    for name in sorted(found, key=SPLITS.index):
        files = found[name]
        where = (f"{len(files)} {name} {files_are} in {files[0].parent}" if len(files) > 1
                 else f"{files[0]} ({one})")
        images = count(files) if count is not None else None
        test = name == "test"
        splits.append(SplitInput(
            form=form, split=name, path=path, where=where, labels="none" if test else labels,
            labelled=not test, by_default=not test, images=images,
            spool_bytes=sum(p.stat().st_size for p in files)))
        if test:
            counted = f"{images:,} " if images is not None else ""
            skipped.append(Skip(what=where, reason=f"{counted}{TEST_REASON}", split="test"))
    return Detected(form=form, root=path, splits=tuple(splits), skipped=tuple(skipped),
                    description=description)
