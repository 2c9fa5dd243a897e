"""What ``imgprep convert`` will do: its options, the split, the tasks and their fingerprint.

The plan is a pure function of (listing, labels, options): samples are sorted by key, then a
seeded permutation over ALL classes spreads them across shards (label lists keep key order in
fixed-size chunks). Which split an input is, and which inputs a folder of splits holds, is
decided here too: splits are never merged, and validation images never enter an inferred
train split.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shlex
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

from imgprep import __version__
from imgprep.convert import outdir
from imgprep.convert.errorlog import ErrorRecord, WarningRecord
from imgprep.convert.image import transform_version
from imgprep.convert.options import ConvertOptions
from imgprep.convert.outdir import STATE_DIR
from imgprep.errors import LabelError, OutputError, SourceFormatError
from imgprep.inputs.forms import ListContext, SplitInput, TextFile, detect, list_split
from imgprep.inputs.groundtruth import UNKNOWN, LabelCheck, read_ground_truth, unknown_wnid_reason
from imgprep.inputs.labels import label_listing
from imgprep.inputs.sources import (
    IMAGE_EXTS,
    TEST_PREFIX,
    VAL_PREFIX,
    Listing,
    cap_sizes,
    split_folders,
)
from imgprep.inputs.splitnames import split_of_name
from imgprep.inputs.spool import SPOOL_DIR
from imgprep.inputs.synsets import ClassTable, load_class_table, present_classes
from imgprep.sections import Holdout, ManifestOptions, SourceSection
from imgprep.shards.manifest import Manifest

LIST_CHUNK = 1000
RECORD_VERSION = 1  # bump when a task record's meaning changes: old records are then redone
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Task:
    """One shard (or one chunk of a label list) and the listing rows it holds, in order."""

    index: int
    name: str
    items: np.ndarray


@dataclass(frozen=True)
class Plan:
    opts: ConvertOptions
    split: str
    listing: Listing
    labels: np.ndarray
    classes: ClassTable
    tasks: tuple[Task, ...]
    fingerprint: str
    label_check: LabelCheck = field(default_factory=LabelCheck)
    label_source: str = "input"  # imgprep.inputs.labels.SOURCES; "none": an unlabelled split
    holdout: Holdout | None = None  # --holdout-per-class: imgprep.convert.holdout
    transform_version: int = field(default_factory=transform_version)  # convert.image

    @property
    def labelled(self) -> bool:
        """False for a split converted without labels (the test split): no ``.cls``."""
        return self.label_source != "none"

    @property
    def state_dir(self) -> Path:
        return self.opts.out / STATE_DIR / self.split

    @property
    def spool_dir(self) -> Path:
        """Where a form without random access keeps its staging copy until the manifest."""
        return self.state_dir / SPOOL_DIR

    def record_path(self, task: Task) -> Path:
        return self.state_dir / f"{task.name}.json"

    def mean_path(self, task: Task) -> Path:
        return self.state_dir / f"{task.name}.mean.npy"

    @property
    def wants_mean_image(self) -> bool:
        return self.opts.format == "list" and self.split == "train"


class ListedImage(NamedTuple):
    """One image a label-list task wrote (a list in its task record's JSON)."""

    path: str  # relative to the output folder: <split>/<wnid>/<key>.jpg (<split>/<key>.jpg)
    label: int | None  # None in an unlabelled split
    bytes: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class TaskResult:
    """What a finished task produced; stored as its record so a rerun can skip it."""

    index: int
    name: str
    fingerprint: str
    samples: int = 0
    bytes: int = 0
    sha256: str = ""
    sums: list[list[int]] = field(default_factory=lambda: [[0, 0, 0]] * 3)
    stats_images: int = 0
    errors: tuple[ErrorRecord, ...] = ()
    files: tuple[ListedImage, ...] = ()  # label lists only
    warnings: tuple[WarningRecord, ...] = ()  # images converted whole, with a warning
    resumed: bool = False


def _prefixed_rows(listing: Listing, prefix: str = VAL_PREFIX) -> np.ndarray:
    return np.flatnonzero(np.char.startswith(listing.key, prefix.encode()))


def infer_split(listing: Listing, has_labels: bool, source: Path | None = None) -> str:
    """``val`` when ground truth is given, the input is named as a split (``val/``,
    ``Validation/``, ``train/``, ``test/`` …, any case), or every key is a validation name;
    ``test`` when every key is a test name (``ILSVRC2012_test_*``); else train."""
    if has_labels:
        return "val"
    named = split_of_name(source.name) if source is not None else None
    if named is not None:
        return named
    for split, prefix in (("val", VAL_PREFIX), ("test", TEST_PREFIX)):
        if len(listing) and len(_prefixed_rows(listing, prefix)) == len(listing):
            return split
    return "train"


def _command(inp: Path, out: Path, *extra: object) -> str:
    return " ".join(["imgprep convert", shlex.quote(str(inp)), "-o", shlex.quote(str(out)),
                     *(shlex.quote(str(a)) for a in extra)])


def _label_args(opts: ConvertOptions) -> list[object]:
    """The ground-truth options of ``opts``, as command-line arguments."""
    args: list[object] = [a for p in opts.labels for a in ("--labels", p)]
    if opts.label_offset is not None:
        args += ["--label-offset", opts.label_offset]
    return args + (["--trust-labels"] if opts.trust_labels else [])


def check_no_val_in_train(listing: Listing, opts: ConvertOptions,
                          origin: ConvertOptions | None = None) -> None:
    """Validation images (``ILSVRC2012_val_*``) never go into an inferred train split: refused,
    saying which and how many, with the commands that separate them, in order. ``origin``:
    the options given, when ``opts.input`` is one split folder of ``origin.input``."""
    rows = _prefixed_rows(listing)
    if not len(rows):
        return
    src = Path(listing.root)
    what = (f"{src} would be the train split but holds {len(rows)} validation images "
            f"(ILSVRC2012_val_*, first: {src}/{listing.member_str(int(rows[0]))}): train and "
            "val look merged")
    on_purpose = "pass --split train to put them into the train split on purpose"
    if (listing.offset[rows] >= 0).any():
        tars = sorted({listing.containers[int(c)] for c in listing.container[rows]})
        raise SourceFormatError(
            f"{what}; they are inside {', '.join(tars[:3])}{' …' if len(tars) > 3 else ''}: "
            f"rebuild it without them and convert again, or {on_purpose}")
    in_folders = all("/" in listing.member_str(int(r)) for r in rows)
    raise SourceFormatError(f"{what}. {_separate(src, len(rows), in_folders, opts, origin)}. "
                            f"Else {on_purpose}")


def _separate(src: Path, count: int, in_folders: bool, opts: ConvertOptions,
              origin: ConvertOptions | None) -> str:
    """The commands that move ``count`` validation images out of the train folder ``src``
    (keeping their class folders) and convert both sets."""
    root = origin.input if origin is not None and origin.input != opts.input else None
    base = root or src
    dest = base.absolute().parent / f"{base.name}-val-images"
    names = " -o ".join(f"-iname 'ILSVRC2012_val_*{ext}'" for ext in IMAGE_EXTS)
    move = (f"(cd {shlex.quote(str(src))} && find . -type f \\( {names} \\) -exec sh "
            """-c 'mkdir -p "$0/${1%/*}" && mv -n "$1" "$0/$1"' """
            f"{shlex.quote(str(dest))} {{}} \\;)")  # images only: never annotation files
    given = _label_args(origin or opts)
    labels = [] if in_folders else given  # ILSVRC2012_val_* need none: the published labels
    if root is None:
        again = f"{_command(src, opts.out)} converts the train images"
        moved = f"{_command(dest, opts.out, '--split', 'val', *labels)} converts the moved ones"
    else:
        val = split_folders(root)[0].get("val", root / "val")
        again = (f"{_command(root, opts.out, *given)} converts {src.name}/ and {val.name}"
                 f"{'/' if val.is_dir() else ''}, each into its own manifest")
        other = Path(f"{opts.out}-val-images")
        moved = (f"if {val.name} lacks the moved images, convert them into a folder of their "
                 f"own: {_command(dest, other, '--split', 'val', *labels)}")
    kept = " (class folders kept)" if in_folders else ""
    return (f"1) move these {count} files out of {src}{kept}: {move} "
            f"2) {again}; 3) {moved}")


def plan_tasks(rows: int | np.ndarray, opts: ConvertOptions, split: str) -> tuple[Task, ...]:
    """Shards: a seeded permutation cut into near-equal parts. Lists: key order in chunks.
    ``rows``: the listing rows to convert (an int n: all of 0..n-1)."""
    rows = np.arange(rows) if isinstance(rows, int) else np.asarray(rows)
    n = len(rows)
    if opts.format == "list":
        return tuple(
            Task(i, f"{split}-chunk-{i:06d}", rows[s:s + LIST_CHUNK])
            for i, s in enumerate(range(0, n, LIST_CHUNK))
        )
    count = opts.num_shards or max(1, math.ceil(n / opts.shard_size))
    count = min(count, max(n, 1))
    perm = rows[np.random.default_rng(opts.seed).permutation(n)]
    return tuple(
        Task(i, f"{split}-{i:06d}.tar", part) for i, part in enumerate(np.array_split(perm, count))
    )


def _fingerprint(opts: ConvertOptions, split: str, listing: Listing, labels: np.ndarray,
                 classes: ClassTable, holdout: Holdout | None = None) -> str:
    h = hashlib.sha256()
    h.update(f"imgprep {__version__} records {RECORD_VERSION} transform {transform_version()}"
             .encode())
    h.update(json.dumps(output_options(opts, split, holdout).to_json(), sort_keys=True).encode())
    h.update(json.dumps(classes.to_json()).encode())
    for arr in (listing.key, listing.size, labels):
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def plan_fingerprint(plan: Plan) -> str:
    """What identifies ``plan``'s output: options, class table, listing, labels, holdout."""
    return _fingerprint(plan.opts, plan.split, plan.listing, plan.labels, plan.classes,
                        plan.holdout)


def manifest_options(plan: Plan) -> ManifestOptions:
    """The manifest's ``options`` of ``plan``, its fingerprint included."""
    return output_options(plan.opts, plan.split, plan.holdout, plan.fingerprint)


def output_options(opts: ConvertOptions, split: str, holdout: Holdout | None = None,
                   fingerprint: str | None = None) -> ManifestOptions:
    """The options that decide the output bytes (not paths, worker counts or error policy),
    with ``--holdout-per-class``'s record; without ``fingerprint``: what it is computed from."""
    return ManifestOptions(format=opts.format, split=split, seed=opts.seed, meta=opts.meta,
                           shard_size=opts.shard_size, num_shards=opts.num_shards,
                           transform=opts.transform, holdout=holdout, store=opts.store,
                           fingerprint=fingerprint)


def source_section(listing: Listing) -> SourceSection:
    """The manifest's ``source`` of a split listed as ``listing``."""
    return SourceSection(kind=listing.kind, name=Path(listing.root).name, images=len(listing),
                         skipped_non_images=listing.skipped)


def _check_test_options(opts: ConvertOptions) -> None:
    """Refuse label options with ``--split test``: the test split has no labels."""
    given = [o for o, on in (("--labels", opts.labels), ("--trust-labels", opts.trust_labels),
                             ("--label-offset", opts.label_offset is not None)) if on]
    if opts.split == "test" and given:
        raise LabelError(f"--split test converts the test split without labels (it has none); "
                         f"drop {', '.join(given)}")


def _unlabelled_plan(opts: ConvertOptions, listing: Listing, classes: ClassTable,
                     named: bool) -> Plan:
    """The plan of the test split: every image, no labels (``Plan.labelled`` is False);
    refused unless ``--split test`` asked for it. ``named``: the input says it is the test
    split (else every image is named ``ILSVRC2012_test_*``)."""
    if opts.split != "test":
        why = "named as the test split" if named else f"its images are {TEST_PREFIX}*"
        raise SourceFormatError(
            f"{opts.input} is the ILSVRC2012 test split ({why}), which has no labels: pass "
            "--split test to convert it as an unlabelled split (its manifest says so; the "
            "loaders and the trainer refuse to train on it)")
    labels = np.zeros(len(listing), dtype=np.int16)  # never written: no .cls, no list label
    return Plan(opts, "test", listing, labels, classes, plan_tasks(len(listing), opts, "test"),
                _fingerprint(opts, "test", listing, labels, classes), LabelCheck(), "none")


def one_split(opts: ConvertOptions) -> SplitInput:
    """The one split of ``opts.input`` (for options not made by ``split_inputs``)."""
    found = detect(opts.input, opts.form)
    if len(found.splits) != 1:
        raise SourceFormatError(
            f"{opts.input} holds the splits {', '.join(str(s.split) for s in found.splits)}; "
            "convert each into its own manifest: pass --split, or convert the whole input")
    return found.splits[0]


def spool_dir(opts: ConvertOptions, source: SplitInput) -> Path | None:
    """Where the staging copy of ``source``, the split ``opts`` converts, goes (None: its
    split is known only once listed, and such inputs are read in place)."""
    split = opts.split or source.split  # the split the run writes, which --split may set
    return opts.out / STATE_DIR / split / SPOOL_DIR if split is not None else None


def _list_context(opts: ConvertOptions, source: SplitInput, classes: ClassTable,
                  spool: bool, rank: int) -> ListContext:
    return ListContext(workers=opts.workers, classes=classes,
                       spool_dir=spool_dir(opts, source) if spool else None,
                       spool_start=rank, max_image_bytes=opts.max_image_bytes,
                       trust_labels=opts.trust_labels)


def make_plan(opts: ConvertOptions, origin: ConvertOptions | None = None, *,
              spool: bool = True, rank: int = 0) -> Plan:
    """Check the ground truth, list the source (class tars on ``opts.workers`` processes),
    label every image and cut the work into tasks (no image is decoded). ``origin``: the
    options given, when ``opts`` is one split of them (``split_inputs``), for the advice of
    errors. ``spool``: a form without random access may write its staging copy (not in a
    dry run), beginning at its ``rank``-th source file so that ranks share the work."""
    if opts.label_offset is not None and not opts.labels:
        raise LabelError(f"--label-offset {opts.label_offset} shifts the labels of --labels, "
                         "and none was given; pass the ground truth or drop --label-offset")
    _check_test_options(opts)
    classes = load_class_table(opts.classes)
    source = opts.source or one_split(opts)
    given: tuple[TextFile, ...] = opts.labels or source.truth
    gt = read_ground_truth(given, classes, opts.label_offset, opts.trust_labels) \
        if given else None  # checked before the (longer) listing
    listing = cap_sizes(list_split(source, _list_context(opts, source, classes, spool, rank)),
                        opts.max_image_bytes)
    if source.own_classes and opts.classes is None:
        classes = present_classes(listing.wnid, listing.key)
    split = opts.split or source.split or infer_split(listing, bool(given), opts.input)
    if split == "test":
        named = source.split == "test" or split_of_name(opts.input.name) == "test"
        return _unlabelled_plan(opts, listing, classes, named=named)
    if opts.split is None and split == "train":  # before labels: loose val images have none
        check_no_val_in_train(listing, opts, origin)
    got = label_listing(listing, classes, gt, opts.trust_labels)
    tasks = plan_tasks(np.flatnonzero(got.labels != UNKNOWN), opts, split)
    return Plan(opts, split, listing, got.labels, classes, tasks,
                _fingerprint(opts, split, listing, got.labels, classes), got.check, got.source)


def check_trust(opts: ConvertOptions, sources: list[str]) -> None:
    """Refuse ``--trust-labels`` when no split of the run has labels it could take as given
    (given by ``--labels`` or carried by the input): ``sources``, each split's label source
    (``Plan.label_source``), are all published labels or none."""
    if opts.trust_labels and all(s in ("published", "none") for s in sources):
        raise LabelError("--trust-labels takes the labels of --labels, or those the input "
                         f"carries, as given; {opts.input} has none (its labels are the "
                         "published ones): drop --trust-labels")


def split_inputs(opts: ConvertOptions, warn: bool = False) -> list[ConvertOptions]:
    """One ConvertOptions per split of ``opts.input``, as its form was detected
    (``imgprep.inputs.forms``): the input itself, each split folder of a folder that holds
    them (``train/``, ``val/``, ``validation/``, ``ILSVRC2012_img_val.tar`` …, any case), or
    each split of a download that holds several (Kaggle's). ``--split`` picks one (the test
    split, which has no labels, is converted only that way); ``--labels`` go to the val split;
    ``warn``: log a warning for each thing not converted (one rank does)."""
    found = detect(opts.input, opts.form)
    if len(found.splits) == 1 and found.splits[0].split is None:
        return [replace(opts, source=found.splits[0])]
    picks = [s for s in found.splits if s.by_default]
    if opts.split is None and not picks:
        raise SourceFormatError(
            f"{opts.input} holds only the test split ({found.splits[0].where}), which has no "
            "labels: pass --split test to convert it as an unlabelled split")
    if opts.split is not None:
        pick = found.split(opts.split)
        if pick is None:
            raise SourceFormatError(
                f"{opts.input} holds {', '.join(s.where for s in found.splits)} but no "
                f"{opts.split} split; point INPUT at the {opts.split} images")
        picks = [pick]
    if opts.labels and not any(s.split == "val" for s in picks):
        raise LabelError(f"--labels is validation ground truth, but {opts.input} holds no val "
                         "folder; drop --labels or point INPUT at the val images")
    if warn:
        for skip in found.not_converted(s.split for s in picks):
            log.warning(f"not converted: {skip}")
    # The split stays as the user gave it: a folder's name is not --split train, so
    # validation images in a train/ folder are still refused.
    return [replace(opts, input=s.path, source=s, labels=opts.labels if s.split == "val" else (),
                    label_offset=opts.label_offset if s.split == "val" else None)
            for s in picks]


def _wanted(plan: Plan) -> outdir.Wanted:
    return outdir.Wanted(
        out=plan.opts.out, split=plan.split, format=plan.opts.format,
        options=manifest_options(plan), classes=plan.classes.to_json(),
        source=source_section(plan.listing), tool_version=__version__,
        transform_version=plan.transform_version)


def check_folder(plan: Plan) -> Manifest | None:
    """Refuse to replace another finished conversion of the split, or to resume one begun by
    another transform version (OutputExistsError), unless ``--overwrite``; returns the
    manifest that ``--overwrite`` replaces, or None."""
    want = _wanted(plan)
    outdir.check_shared_classes(want)
    replaced = outdir.check_folder(want, plan.opts.overwrite)
    if not plan.opts.overwrite:
        outdir.check_unfinished(want, plan.state_dir)
    return replaced


def unknown_errors(plan: Plan) -> list[ErrorRecord]:
    """Error-log entries of images named with a wnid outside the class table."""
    lst = plan.listing
    return [ErrorRecord(source=f"{lst.root}/{lst.member_str(i)}", key=lst.key_str(i),
                        reason=unknown_wnid_reason(lst.key_str(i).partition("_")[0]))
            for i in np.flatnonzero(plan.labels == UNKNOWN).tolist()]


def unknown_wnids(plan: Plan) -> dict[str, int]:
    """{wnid: images} of images named with a wnid outside the class table (logged errors)."""
    rows = np.flatnonzero(plan.labels == UNKNOWN).tolist()
    counts = Counter(plan.listing.key_str(i).partition("_")[0] for i in rows)
    return dict(sorted(counts.items()))


def check_out_not_input(opts: ConvertOptions, split: str | None = None) -> None:
    """Refuse outputs that overlap the input: they could replace originals, and a rerun would
    list its own outputs. Shards beside an input tar (or folder) are fine; a label list's
    ``<out>/<split>/`` tree must not touch an input folder."""
    inp, out = opts.input.resolve(), opts.out.resolve()
    if inp == out or (inp.is_dir() and inp in out.parents):
        raise OutputError(f"--out {opts.out} is inside the input {opts.input}; pick another folder")
    if split is not None and opts.format == "list" and inp.is_dir():
        tree = out / split
        if tree == inp or inp in tree.parents or tree in inp.parents:
            raise OutputError(
                f"--format list would write {tree}, which overlaps the input {opts.input}; "
                "pick another --out"
            )
