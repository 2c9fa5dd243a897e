"""Validation ground truth in every common form, detected by content.

Forms: the devkit's ``ILSVRC2012_validation_ground_truth.txt`` (devkit IDs 1..1000, one per
line in file order; devkit IDs are NOT the sorted-wnid index), read with the devkit's fixed ID
map (``imgprep.inputs.devkit``; a ``map_clsloc.txt`` given with it must agree), alone or inside
the devkit archive ``ILSVRC2012_devkit_t12.tar.gz``; Kaggle's ``LOC_val_solution.csv``, Caffe's
``val.txt`` (``name index``, sorted-wnid index), or one wnid per line in file order. All
resolve to ``{key: wnid}``, where the key is the file stem (``ILSVRC2012_val_00000001``).

Names of the 50,000 published validation images (``ILSVRC2012_val_%08d``) have a known
label (``imgprep.inputs.synsets.imagenet_val_labels``): every such name in every file is compared
with it before anything is converted. A 'name label' file whose labels all differ from the
published ones by one constant is refused naming the ``--label-offset`` that fixes it; any
other difference is refused naming how many and where, unless ``trust`` (``--trust-labels``).
Other names keep the rules that catch a 1-based file by its shape. ``LabelCheck`` says which
check ran. Labels an input carries, and the published ones where it carries none, are
resolved and checked in ``imgprep.inputs.labels``.
"""

from __future__ import annotations

import csv
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from imgprep.errors import InputMissingError, LabelError
from imgprep.inputs.devkit import archive_ground_truth, check_map, devkit_map, is_archive
from imgprep.inputs.reader import TextFile
from imgprep.inputs.synsets import (
    WNID_RE,
    ClassTable,
    imagenet_classes,
    imagenet_val_labels,
    val_number,
)

FORMS = (
    "the devkit ground truth (with map_clsloc.txt or without) or its archive "
    "ILSVRC2012_devkit_t12.tar.gz, Kaggle LOC_val_solution.csv, Caffe val.txt "
    "('name label' or 'name,label'), or one wnid per line"
)
NAME_LABEL_SEP = re.compile(r"\s*,\s*|\s+")  # 'name label', 'name,label', 'name, label'
UNKNOWN = -1  # labels.resolve_labels: named with a wnid outside the class table
ONE_BASED_MIN_PER_CLASS = 10  # a set this large per class without a label 0 is 1-based
ONE_BASED_MIN_RUN = 10  # labels exactly 1..K (K >= this: every class present, none is 0)
SHIFT_MIN_NAMES = 2  # published names, all off by one constant: a shift, not a slip
SHOW_DIFFERING = 20  # differing labels a refusal names (then how many more)
PUBLISHED = "the published ILSVRC2012 validation labels"
Row = tuple[str, str, str]  # (key, wnid, where: file:line) of one ground-truth line


@dataclass(frozen=True)
class LabelCheck:
    """Which check the labels passed (of a ground truth, or carried by the input), for
    convert's summary.

    ``mode``: ``none`` (nothing compared), ``published`` (the labels are the published ones,
    taken from the table: nothing to compare), ``canonical`` (every name is a published
    validation name, and every label is the published one), ``heuristic`` (no name is: only
    the rules that catch a 1-based file by its shape), ``canonical+heuristic`` (some of each),
    or ``trusted`` (``--trust-labels``: no name compared, every name under the shape rules).
    ``canonical``/``other``: names of each kind checked; ``differing``: published names whose
    label differs from the published one (only with ``trusted``; otherwise it was refused).
    ``expected``: images a ground truth lists (None: none was used); ``missing``: how many of
    them the input does not hold, and ``missing_first`` the first (sorted) of their names.
    """

    mode: str = "none"
    canonical: int = 0
    other: int = 0
    differing: int = 0
    expected: int | None = None
    missing: int = 0
    missing_first: tuple[str, ...] = ()

    def names(self) -> dict[str, int]:
        return {"canonical": self.canonical, "other": self.other, "differing": self.differing}


def absent_note(expected: int | None, missing: int, first: Sequence[str]) -> str | None:
    """What a run and its dry run say of images a ground truth lists that the input does not
    hold (None: there are none). They are not refused: a ground truth is often the whole
    validation set's while the input holds part of it on purpose."""
    if not missing or expected is None:
        return None
    return (f"the ground truth lists {expected:,} images and {missing:,} of them are not in "
            f"the input, so not converted ({listed(first, missing)}); if they should be "
            "there, the download or extraction is incomplete: fetch them and rerun")


@dataclass(frozen=True)
class GroundTruth:
    """{key: wnid} of every ground-truth line, and how it was checked."""

    labels: dict[str, str]
    check: LabelCheck = field(default_factory=LabelCheck)


def _val_key(i: int) -> str:
    return f"ILSVRC2012_val_{i:08d}"


def _stem(name: str) -> str:
    return posixpath.splitext(posixpath.basename(name.strip()))[0]


def _csv_fields(line: str) -> list[str]:
    """The fields of one CSV line as the csv module reads them (quoted fields unquoted)."""
    try:
        return next(csv.reader([line]), [])
    except csv.Error:
        return line.split(",")


def detect_form(lines: list[str]) -> str:
    """Name the form of a ground-truth file from its non-empty lines, or ``unknown``."""
    body = [ln.split() for ln in lines if ln.strip()]
    if not body:
        return "unknown"
    if [f.replace(" ", "").lower() for f in _csv_fields(lines[0])[:2]] == \
            ["imageid", "predictionstring"]:
        return "kaggle"
    if all(len(t) == 1 and t[0].isdigit() for t in body):
        return "devkit"
    if all(len(t) == 1 and WNID_RE.match(t[0]) for t in body):
        return "wnids"
    if all(len(t) >= 3 and WNID_RE.match(t[0]) and t[1].isdigit() for t in body):
        return "map_clsloc"
    pairs = [NAME_LABEL_SEP.split(ln.strip()) for ln in lines if ln.strip()]
    if all(len(t) == 2 and t[0] and t[1].lstrip("-").isdigit() for t in pairs):
        return "caffe"
    return "unknown"


def _read_lines(path: TextFile) -> list[str]:
    if isinstance(path, Path) and is_archive(path):  # the devkit archive, read as a stream
        return archive_ground_truth(path)
    try:  # utf-8-sig: a byte-order mark (Excel's CSVs) is not part of the first line
        return path.read_text("utf-8-sig").splitlines()
    except OSError as e:
        raise InputMissingError(f"cannot read ground truth {path}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise LabelError(f"{path} is not a text file; expected {FORMS}") from e


def _put(out: dict[str, str], key: str, wnid: str, where: str, classes: ClassTable,
         rows: list[Row] | None = None) -> None:
    if classes.index(wnid) is None:
        raise LabelError(f"{where}: {key} is labelled {wnid}, which is not in the class table; "
                         "pass the matching --classes file")
    old = out.get(key)
    if old is not None and old != wnid:
        raise LabelError(f"{where}: {key} labelled both {old} and {wnid}; fix the file")
    out[key] = wnid
    if rows is not None:
        rows.append((key, wnid, where))


def _published(key: str, classes: ClassTable) -> int | None:
    """The published label of ``key`` as an index in ``classes`` (None: not a published
    validation name, or its class is not in ``classes``)."""
    n = val_number(key)
    if n is None:
        return None
    return classes.index(imagenet_classes().wnids[imagenet_val_labels()[n - 1]])


def _refuse_shift(path: TextFile, rows: list[tuple[str, int, int]], classes: ClassTable,
                  offset: int | None) -> None:
    """Refuse a 'name label' file whose published names all differ from their published
    label by one constant, naming the ``--label-offset`` that makes them agree."""
    found = [(key, label, _published(key, classes), n) for key, label, n in
             ((_stem(name), label, n) for name, label, n in rows) if val_number(key) is not None]
    shifts = {label - want for _, label, want, _ in found if want is not None}
    if len(found) < SHIFT_MIN_NAMES or len(shifts) != 1 or shifts == {0} \
            or any(want is None for _, _, want, _ in found):
        return  # agreeing, scattered, too few to tell, or classes outside the table
    (shift,), (key, label, want, n) = shifts, found[0]
    given = offset or 0
    fix = given + shift
    why = " (it counts classes from 1, TensorFlow's 1001-class convention)" if fix == 1 else ""
    instead = f" instead of --label-offset {offset}" if offset is not None else ""
    after = f", {label} after --label-offset {offset}" if offset else ""
    raise LabelError(
        f"{path}: every ILSVRC2012_val_* name in it is labelled {abs(shift)} "
        f"{'above' if shift > 0 else 'below'} {PUBLISHED}"
        f"{f' after --label-offset {offset}' if offset else ''} (line {n}: {key} is "
        f"{label + given} in the file{after}; published {want}){why}; pass --label-offset "
        f"{fix}{instead}")


def _name_labels(path: TextFile, numbered: list[tuple[int, str]], classes: ClassTable,
                 offset: int | None, compared: bool) -> list[tuple[str, int, int]]:
    """(name, label - offset, line) of a 'name label' file. Refuses published names shifted
    by a constant (``compared``: published names are compared), a label outside [0, classes)
    naming file:line and, among the names not compared, unless ``offset`` was given (0
    included), a set that looks 1-based, saying how to shift it."""
    rows = []
    for n, ln in numbered:
        name, value = NAME_LABEL_SEP.split(ln.strip())
        rows.append((name, int(value) - (offset or 0), n))
    if compared:
        _refuse_shift(path, rows, classes, offset)
    labels = {i for _, i, _ in rows}
    one_based = (f"; the file looks 1-based (labels 1..{len(classes)}, TensorFlow's 1001-class "
                 f"convention) but labels are 0..{len(classes) - 1} (the sorted-wnid index): "
                 "pass --label-offset 1 to shift every label down by one, or --label-offset 0 "
                 "if they are 0-based and class 0 is just absent") \
        if 0 not in labels and offset is None else ""
    for _, i, n in rows:
        if not 0 <= i < len(classes):
            shifted = f" ({i + offset} in the file, --label-offset {offset})" if offset else ""
            hint = one_based if i == len(classes) else ""
            raise LabelError(
                f"{path}:{n}: class index {i}{shifted} is outside 0..{len(classes) - 1}"
                + (hint or "; Caffe val.txt uses the sorted-wnid index (0-based): fix the line"))
    rest = [i for name, i, _ in rows if not compared or val_number(_stem(name)) is None]
    shape = set(rest)
    contiguous = len(shape) >= ONE_BASED_MIN_RUN and shape == set(range(1, len(shape) + 1))
    large = bool(rest) and min(rest) == 1 and len(rest) >= ONE_BASED_MIN_PER_CLASS * len(classes)
    if one_based and (contiguous or large):
        why = (f"its labels are exactly 1..{len(shape)}" if contiguous else
               f"no image has label 0 among {len(rest)} lines")
        raise LabelError(f"{path}: {why}{one_based}")
    return rows


def _parse(path: TextFile, lines: list[str], form: str, classes: ClassTable,
           label_offset: int | None, compared: bool) -> list[Row]:
    """Every line of one ground-truth file as (key, wnid, file:line), in file order."""
    out: dict[str, str] = {}
    rows: list[Row] = []
    numbered = [(n, ln) for n, ln in enumerate(lines, 1) if ln.strip()]
    if form == "kaggle":
        for n, ln in numbered[1:]:
            image_id, pred = (_csv_fields(ln) + ["", ""])[:2]
            tokens = pred.split()
            if not tokens or not WNID_RE.match(tokens[0]):
                raise LabelError(f"{path}:{n}: no wnid in {ln.strip()!r}")
            _put(out, _stem(image_id), tokens[0], f"{path}:{n}", classes, rows)
    elif form == "caffe":
        for name, i, n in _name_labels(path, numbered, classes, label_offset, compared):
            _put(out, _stem(name), classes.wnids[i], f"{path}:{n}", classes, rows)
    elif form == "wnids":
        for i, (n, ln) in enumerate(numbered, 1):
            _put(out, _val_key(i), ln.strip(), f"{path}:{n}", classes, rows)
    elif form == "devkit":
        ids = devkit_map()
        for i, (n, ln) in enumerate(numbered, 1):
            dev_id = int(ln)
            wnid = ids.get(dev_id)
            if wnid is None:
                raise LabelError(f"{path}:{n}: devkit ID {dev_id} is outside the ILSVRC2012 "
                                 f"devkit's 1..{len(ids)}; this is not the devkit's ground truth")
            _put(out, _val_key(i), wnid, f"{path}:{n}", classes, rows)
    return rows


def _compare(rows: list[Row], classes: ClassTable, trust: bool) -> LabelCheck:
    """Compare every published name with its published label: refuse a difference unless
    ``trust``; say which check ran."""
    table, published = imagenet_classes(), imagenet_val_labels()
    canonical: set[str] = set()
    other: set[str] = set()
    differing: dict[str, tuple[str, str, str]] = {}
    for key, wnid, where in rows:
        n = val_number(key)
        if n is None:
            other.add(key)
            continue
        canonical.add(key)
        want = table.wnids[published[n - 1]]
        if wnid != want and key not in differing:
            differing[key] = (where, wnid, want)
    if trust:
        return LabelCheck("trusted", 0, len(canonical) + len(other), len(differing))
    if differing:
        def show(where: str, key: str, got: str, want: str) -> str:
            return (f"{where}: {key} is {got} ({classes.index(got)}), published {want} "
                    f"({_index_text(classes, want)})")
        firsts = [show(w, k, g, p) for k, (w, g, p) in list(differing.items())[:SHOW_DIFFERING]]
        files = sorted({w.rpartition(":")[0] for w, _, _ in differing.values()})
        raise LabelError(
            f"{', '.join(files)}: {len(differing)} of {len(canonical)} ILSVRC2012_val_* names "
            f"are labelled otherwise than in {PUBLISHED} ({listed(firsts, len(differing))}); "
            "fix the file, or pass --trust-labels to convert with these labels on purpose")
    mode = "canonical+heuristic" if canonical and other else \
        "canonical" if canonical else "heuristic"
    return LabelCheck(mode, len(canonical), len(other))


def listed(entries: Sequence[str], total: int | None = None) -> str:
    """Differing labels for a refusal: every one of ``entries`` when there are at most
    ``SHOW_DIFFERING`` (``total``: how many there are, when ``entries`` holds the first ones
    only), else the first ``SHOW_DIFFERING`` and how many more, so that one refusal is
    enough to fix a file of a few wrong lines."""
    total = len(entries) if total is None else total
    shown = list(entries[:SHOW_DIFFERING])
    more = total - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _index_text(classes: ClassTable, wnid: str) -> str:
    i = classes.index(wnid)
    return "not in the class table" if i is None else str(i)


def load_ground_truth(paths: Sequence[TextFile], classes: ClassTable,
                      label_offset: int | None = None, trust: bool = False) -> dict[str, str]:
    """{key: wnid} of ``read_ground_truth``."""
    return read_ground_truth(paths, classes, label_offset, trust).labels


def read_ground_truth(paths: Sequence[TextFile], classes: ClassTable,
                      label_offset: int | None = None, trust: bool = False) -> GroundTruth:
    """Parse one ground-truth file (a ``map_clsloc.txt`` beside the devkit form is checked
    against the devkit's map) to {key: wnid} and check it (module docstring); raises
    LabelError naming the file and the fix.

    ``label_offset`` is subtracted from every label of a 'name label' file (1 for a 1-based
    one); None (not given) also refuses a file that looks 1-based. Other forms carry wnids or
    devkit IDs, so an offset for them is refused. ``trust``: labels of published validation
    names that differ from the published ones are taken as given (and counted).
    """
    parsed = [(p, _read_lines(p)) for p in paths]
    forms = [(p, lines, detect_form(lines)) for p, lines in parsed]
    for p, _, form in forms:
        if form == "unknown":
            raise LabelError(f"cannot tell the ground-truth format of {p}; expected {FORMS}")
    if label_offset is not None and not any(f == "caffe" for _, _, f in forms):
        raise LabelError(
            f"--label-offset {label_offset} shifts the labels of a 'name label' file, but "
            f"{', '.join(f'{p} is {f}' for p, _, f in forms)}; drop --label-offset")
    maps = [(p, lines) for p, lines, f in forms if f == "map_clsloc"]
    for p, lines in maps:
        check_map(p, lines)
    label_forms = [(p, lines, f) for p, lines, f in forms if f != "map_clsloc"]
    if not label_forms:
        raise LabelError(f"only a class map was given ({maps[0][0]}); pass the ground truth too")
    rows = [r for p, lines, form in label_forms
            for r in _parse(p, lines, form, classes, label_offset, not trust)]
    check = _compare(rows, classes, trust)
    result: dict[str, str] = {}
    for key, wnid, where in rows:
        _put(result, key, wnid, where, classes)
    return GroundTruth(result, check)


def unknown_wnid_reason(wnid: str) -> str:
    """The error-log reason of an image named with a wnid outside the class table."""
    return (f"its name carries wnid {wnid}, which is not in the class table; pass --classes "
            "with a class list that has it, or remove the image")
