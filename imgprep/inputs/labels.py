"""Every listed image's label, from ground truth, from what the input carries, or from the
published validation labels, and the checks those labels pass.

Ground truth (``--labels``) labels the images it names, and every image must be named. Without
it an image's label is the class its input carries for it (its class folder or tar, a
``_<wnid>`` name suffix, a ``.cls``, a parquet ``label``: the listing's ``wnid`` column), else
the wnid its name starts with (``n01440764_10026``), else, for a published validation name
(``ILSVRC2012_val_%08d``), its published label: a validation split with canonical names needs
no label file.

Carried labels meet the check ground-truth files meet (``imgprep.inputs.groundtruth``): at a
published validation name the carried class must be the published one (a constant shift, as
1-based labels give, is named as such; any difference is refused naming how many and the first
ones), and a name that starts with a wnid must agree with the class carried for it. ``trust``
(``--trust-labels``) takes them as given, counted. Everything is numpy over the listing's
columns, one pass for 1.28 M images; Python runs once per distinct wnid, not per image.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from imgprep.errors import LabelError
from imgprep.inputs.groundtruth import (
    PUBLISHED,
    SHIFT_MIN_NAMES,
    SHOW_DIFFERING,
    UNKNOWN,
    GroundTruth,
    LabelCheck,
    listed,
)
from imgprep.inputs.sources import Listing
from imgprep.inputs.synsets import (
    VAL_PREFIX,
    ClassTable,
    imagenet_classes,
    imagenet_val_labels,
    name_wnids,
    val_numbers,
)

NONE = -2  # this source gives the image no label
OUTSIDE = -3  # this source names a wnid that is not in the class table
# Where a split's labels came from (convert's summary and manifest): ground truth, the input
# (folders, tars, names, .cls, a label column), the published table, both, or none (unlabelled).
SOURCES = ("ground-truth", "input", "published", "input+published", "none")
FIX = ("fix the input, pass --labels with the validation ground truth to label them from it, "
       "or pass --trust-labels to convert these labels as given")


@dataclass(frozen=True)
class Labelled:
    """Every listed image's label (``UNKNOWN`` for an image named with a wnid outside the class
    table, which the caller logs), the check they passed, and their source (``SOURCES``)."""

    labels: np.ndarray
    check: LabelCheck
    source: str

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, not {self.source!r}")


def _index(wnid: str, classes: ClassTable) -> int:
    i = classes.index(wnid)
    return OUTSIDE if i is None else i


def _indices(column: np.ndarray, classes: ClassTable) -> np.ndarray:
    """The class index of each wnid of an ``S9`` column: NONE where empty, OUTSIDE where it is
    not in ``classes``."""
    uniq, inverse = np.unique(column, return_inverse=True)
    table = [_index(w.decode("ascii"), classes) if w else NONE for w in uniq.tolist()]
    return np.asarray(table, dtype=np.int64)[inverse.reshape(-1)]


def _published(numbers: np.ndarray, classes: ClassTable) -> np.ndarray:
    """The published label of each validation number as an index in ``classes`` (NONE for 0:
    not a published name; OUTSIDE where its class is not in ``classes``)."""
    remap = np.asarray([_index(w, classes) for w in imagenet_classes().wnids], dtype=np.int64)
    out = np.full(len(numbers), NONE, dtype=np.int64)
    hit = numbers > 0
    out[hit] = remap[imagenet_val_labels()[numbers[hit] - 1]]
    return out


def _where(listing: Listing, i: int) -> str:
    return f"{listing.root}/{listing.member_str(i)}"


def _firsts(rows: np.ndarray, show: Callable[[int], str]) -> str:
    return listed([show(int(i)) for i in rows[:SHOW_DIFFERING]], len(rows))


def _refuse_published(listing: Listing, classes: ClassTable, compared: np.ndarray,
                      carried: np.ndarray, numbers: np.ndarray) -> None:
    """Refuse carried labels of published validation names that are not the published ones:
    a constant shift of all of them as such, else how many differ; both name the first."""
    published = _published(numbers, classes)
    differ = compared[carried[compared] != published[compared]]
    if not len(differ):
        return
    table, pub = imagenet_classes(), imagenet_val_labels()

    def show(i: int) -> str:
        want = table.wnids[pub[numbers[i] - 1]]
        got = classes.wnids[carried[i]]
        where = "not in the class table" if published[i] < 0 else str(published[i])
        return f"{listing.member_str(i)} is {got} ({carried[i]}), published {want} ({where})"

    shifts = set((carried[differ] - published[differ]).tolist())
    shift = next(iter(shifts)) if len(shifts) == 1 and (published[differ] >= 0).all() else 0
    if shift and len(differ) == len(compared) >= SHIFT_MIN_NAMES:
        why = " (it counts classes from 1, TensorFlow's 1001-class convention)" \
            if shift == 1 else ""
        raise LabelError(
            f"{listing.root}: every one of its {len(compared)} {VAL_PREFIX}* images is labelled "
            f"{abs(shift)} {'above' if shift > 0 else 'below'} {PUBLISHED}{why}: the labels it "
            f"carries are shifted ({_firsts(differ, show)}); {FIX}")
    raise LabelError(
        f"{listing.root}: {len(differ)} of {len(compared)} {VAL_PREFIX}* images carry labels "
        f"other than {PUBLISHED} ({_firsts(differ, show)}); {FIX}")


def _clashes(listing: Listing, named: np.ndarray) -> tuple[np.ndarray, int]:
    """Images whose name starts with a wnid other than the class carried for them, and how
    many carry a class and have a name that starts with a wnid."""
    both = (named != b"") & (listing.wnid != b"")
    return np.flatnonzero(both & (named != listing.wnid)), int(both.sum())


def _refuse_names(listing: Listing, named: np.ndarray) -> None:
    """Refuse images whose name starts with a wnid other than the class carried for them,
    naming how many and the first."""
    clash, both = _clashes(listing, named)
    if len(clash):
        def show(i: int) -> str:
            return (f"{listing.member_str(i)} is given {listing.wnid_str(i)}, its name says "
                    f"{named[i].decode('ascii')}")

        raise LabelError(
            f"{listing.root}: {len(clash)} of {both} images whose names start with "
            f"a wnid are given another class ({_firsts(clash, show)}); move each into "
            "its own class, or pass --trust-labels to convert them with the class they are "
            "given")


def _refuse_unlabelled(listing: Listing, labels: np.ndarray, numbers: np.ndarray) -> None:
    """Refuse the first image no source labels, or whose only label is outside the table."""
    bad = np.flatnonzero((labels == NONE) | (labels == OUTSIDE))
    if not len(bad):
        return
    i = int(bad[0])
    key = listing.key_str(i)
    if numbers[i]:
        wnid = imagenet_classes().wnids[imagenet_val_labels()[numbers[i] - 1]]
        raise LabelError(f"cannot tell the class of {_where(listing, i)}: its published class "
                         f"{wnid} is not in the class table; pass --classes with a class list "
                         "that has it, or --labels with the ground truth you mean")
    hint = ("pass --labels with the validation ground truth" if key.startswith(VAL_PREFIX)
            else "pass --classes with a class list that has it")
    raise LabelError(f"cannot tell the class of {_where(listing, i)} "
                     f"({key.partition('_')[0]!r} is not a known wnid); {hint}")


def _absent(listing: Listing, truth: GroundTruth) -> LabelCheck:
    """``truth``'s check with how many images it lists are not in ``listing``, and the
    first of them (sorted by name)."""
    names = np.sort(np.asarray([k.encode("utf-8") for k in truth.labels] or [b""]))
    names = names[:len(truth.labels)]
    absent = names[~np.isin(names, listing.key)]
    first = tuple(n.decode("utf-8") for n in absent[:SHOW_DIFFERING].tolist())
    return replace(truth.check, expected=len(names), missing=len(absent), missing_first=first)


def _from_truth(listing: Listing, truth: dict[str, str], classes: ClassTable) -> np.ndarray:
    """The label ``truth`` gives each listed image: one binary search per image into the
    sorted ground-truth names, not a dict lookup per image."""
    names = np.asarray([k.encode("utf-8") for k in truth] or [b""])[:len(truth)]
    labels = np.asarray([_index(w, classes) for w in truth.values()], dtype=np.int64)
    order = np.argsort(names, kind="stable")
    names, labels = names[order], labels[order]
    pos = np.searchsorted(names, listing.key)
    found = pos < len(names)
    found[found] = names[pos[found]] == listing.key[found]
    if not found.all():
        raise LabelError(
            f"{_where(listing, int(np.flatnonzero(~found)[0]))} has no label in the ground "
            "truth; pass the ground truth that covers it, or remove the image")
    return labels[pos]


def label_listing(listing: Listing, classes: ClassTable, truth: GroundTruth | None = None,
                  trust: bool = False) -> Labelled:
    """Label every image of ``listing`` and check the labels (module docstring); raises
    LabelError naming the first image no source labels, or the labels that fail a check."""
    if truth is not None:
        labels = _from_truth(listing, truth.labels, classes)
        return Labelled(labels.astype(np.int16), _absent(listing, truth), "ground-truth")
    carried = _indices(listing.wnid, classes)
    if (outside := np.flatnonzero(carried == OUTSIDE)).size:
        i = int(outside[0])
        raise LabelError(f"cannot tell the class of {_where(listing, i)} "
                         f"({listing.wnid_str(i)!r} is not a known wnid); pass --classes with "
                         "a class list that has it")
    named_wnids = name_wnids(listing.key)
    named, numbers = _indices(named_wnids, classes), val_numbers(listing.key)
    compared = np.flatnonzero((numbers > 0) & (carried >= 0))
    if not trust:
        _refuse_published(listing, classes, compared, carried, numbers)
        _refuse_names(listing, named_wnids)
    labels = np.where(carried != NONE, carried,
                      np.where(named == OUTSIDE, UNKNOWN,
                               np.where(named != NONE, named, _published(numbers, classes))))
    _refuse_unlabelled(listing, labels, numbers)
    from_input = int(((carried >= 0) | (named >= 0)).sum())
    from_table = int(((carried == NONE) & (named == NONE) & (numbers > 0)).sum())
    if trust:
        differing = (carried[compared] != _published(numbers[compared], classes)).sum()
        check = LabelCheck("trusted", 0, from_input,
                           int(differing) + len(_clashes(listing, named_wnids)[0]))
    elif len(compared) or from_table:
        check = LabelCheck("canonical" if len(compared) else "published",
                           len(compared) + from_table, 0)
    else:
        check = LabelCheck()
    source = ("input+published" if from_input else "published") if from_table else "input"
    return Labelled(labels.astype(np.int16), check, source)


def resolve_labels(listing: Listing, classes: ClassTable,
                   truth: dict[str, str] | None) -> np.ndarray:
    """The labels of ``label_listing`` (``truth``: {key: wnid} of a ground truth, or None)."""
    return label_listing(listing, classes, GroundTruth(truth) if truth is not None else None
                         ).labels
