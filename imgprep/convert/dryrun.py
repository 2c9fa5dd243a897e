"""``imgprep convert --dry-run``: what a conversion would read, skip and write, writing nothing.

The input is detected and every split planned exactly as a run plans it (listing, ground
truth and its check, labels, tasks, the output folder's rules), so a dry run refuses what
the run would refuse; nothing is created, not even the output folder. A split whose form
needs a staging copy is listed without making it where its form can (``dry_listed``): the
Hub's parquet files from their ``image.path`` and ``label`` columns (labels, their range and
their agreement with the names checked; the image bytes are not read), its tar.gz archives
by reading each gzip stream once to its end (its CRC and length checked; a progress bar on
stderr). What a dry run does not check is what the run logs image by image: an image's
decode, and for parquet its size against ``--max-image-bytes``. The copy's disk cost comes
from the form's probe, and so do the image count and the labels of a split listed only
through its copy (ImageNet-21k as a .tar.gz: its class tars are listed once spooled),
checked by the run.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from imgprep.convert.holdout import split_plan
from imgprep.convert.tasks import (
    LIST_CHUNK,
    ConvertOptions,
    Plan,
    check_folder,
    check_out_not_input,
    check_trust,
    make_plan,
    one_split,
    split_inputs,
    unknown_wnids,
)
from imgprep.inputs.forms import SplitInput, detect
from imgprep.inputs.groundtruth import PUBLISHED
from imgprep.inputs.sources import VAL_PREFIX


@dataclass(frozen=True, kw_only=True)
class SplitReport:
    """One split a run would convert: where from, how many images, labelled how, what it
    would write, and the disk its staging copy takes (0: read in place)."""

    split: str
    where: str
    images: int | None  # None: not known before the stream is read (a gzip stream)
    labels: str
    label_source: str  # as a run's summary says it (inputs.labels.SOURCES), or "at conversion"
    label_check: str
    tasks: int | None  # None with images
    writes: str
    output: str
    spool_bytes: int
    listing_errors: int
    unknown_wnids: int
    expected_images: int | None = None  # images the ground truth lists (None: no ground truth)
    missing_images: int = 0  # of those, how many the input does not hold
    missing_first: tuple[str, ...] = ()

    @property
    def logged_errors(self) -> int:
        """Images the run would log as errors before converting any: members the listing
        refuses and images named with a wnid outside the class table."""
        return self.listing_errors + self.unknown_wnids


@dataclass(frozen=True, kw_only=True)
class DryRunReport:
    """What ``imgprep convert`` would do with these options."""

    input: str
    out: str
    form: str
    description: str
    splits: tuple[SplitReport, ...]
    skipped: tuple[str, ...]
    max_errors: int = 0

    def error_note(self, s: SplitReport) -> str | None:
        """What the run would log as errors in split ``s`` and the ``--max-errors`` it needs
        to write the manifest (None: nothing)."""
        if not s.logged_errors:
            return None
        what = [f"{n} {w}" for n, w in (
            (s.unknown_wnids, "images named with wnids outside the class table"),
            (s.listing_errors, "members refused")) if n]
        head = f"  errors: {' and '.join(what)}, each logged as an error; "
        if s.logged_errors > self.max_errors:
            classes = ", or --classes with a table that has them" if s.unknown_wnids else ""
            return (head + f"the run would fail: it needs --max-errors {s.logged_errors} "
                    f"(now {self.max_errors}){classes}")
        return head + f"within --max-errors {self.max_errors}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "dry_run": True,
                "splits": [{**asdict(s), "missing_first": list(s.missing_first)}
                           for s in self.splits],
                "skipped": list(self.skipped)}


def _writes(opts: ConvertOptions, split: str, images: int | None, tasks: int | None) -> str:
    if images is None or tasks is None:
        kind = "chunks" if opts.format == "list" else "shards"
        return f"{split} {kind} (as many as the images need), {split}.json"
    if opts.format == "list":
        mean = ", mean.npy" if split == "train" else ""
        folder = "" if split == "test" else "<wnid>/"  # the test split has no labels
        return (f"{split}.txt, {split}/{folder}<key>.jpg ({images} images in {tasks} chunks), "
                f"classes.txt{mean}, {split}.json")
    last = f" … {split}-{tasks - 1:06d}.tar" if tasks > 1 else ""
    return (f"{tasks} shard{'s' if tasks != 1 else ''} {split}-000000.tar{last}, "
            f"{split}-index.bin, {split}.json")


def _output(opts: ConvertOptions, split: str, replaced: bool) -> str:
    if replaced:
        return f"replaces the finished {split} split in {opts.out} (--overwrite)"
    if (opts.out / f"{split}.json").exists():
        return f"{opts.out} holds this {split} conversion already: reported complete"
    if (opts.out / ".imgprep" / split).exists():
        return f"resumes the unfinished {split} run in {opts.out}"
    return "new"


def _labels(part: ConvertOptions, src: SplitInput, source: str = "") -> str:
    if part.labels:
        return "--labels " + ", ".join(str(p) for p in part.labels)
    if source == "published":
        return PUBLISHED
    if source == "input+published":
        return f"{src.labels}; {PUBLISHED} for the {VAL_PREFIX}* images it does not label"
    if source == "none":
        return "none: the split is converted unlabelled (no .cls)"
    return src.labels


def _spooled(part: ConvertOptions, src: SplitInput) -> tuple[SplitReport, ...]:
    """The split of a form listed only through its staging copy (an ImageNet-21k .tar.gz),
    as its probe tells it; with ``--holdout-per-class`` its val and train parts, whose sizes
    the staging copy tells."""
    images = None if part.holdout_per_class else src.images
    tasks: int | None = None
    if images is not None:
        tasks = math.ceil(images / LIST_CHUNK) if part.format == "list" else \
            min(part.num_shards or max(1, math.ceil(images / part.shard_size)), max(images, 1))
    splits = ("val", "train") if part.holdout_per_class else (src.split or "train",)
    return tuple(SplitReport(split=split, where=src.where, images=images,
                             labels=_labels(part, src), label_source="at conversion",
                             label_check="at conversion", tasks=tasks,
                             writes=_writes(part, split, images, tasks),
                             output=_output(part, split, False),
                             spool_bytes=src.spool_bytes if split == splits[-1] else 0,
                             listing_errors=0, unknown_wnids=0) for split in splits)



def _planned(part: ConvertOptions, src: SplitInput,
             origin: ConvertOptions) -> tuple[SplitReport, ...]:
    """The report of each split planned from ``part`` (two with ``--holdout-per-class``)."""
    plans = split_plan(make_plan(part, origin=origin, spool=False))
    return tuple(_report(plan, part, src, plan is plans[-1]) for plan in plans)


def _report(plan: Plan, part: ConvertOptions, src: SplitInput, last: bool) -> SplitReport:
    """``last``: the last split planned from ``src``, which carries its staging copy's cost."""
    # A parquet split listed without its staging copy has no image sizes, so no fingerprint
    # to compare with a finished split's: the folder's rules are then checked by the run.
    sized = not src.spool_bytes or bool(plan.listing.size.any())
    replaced = check_folder(plan) is not None if sized else \
        part.overwrite and (part.out / f"{plan.split}.json").exists()
    check_out_not_input(plan.opts, plan.split)
    images = sum(len(t.items) for t in plan.tasks) if plan.holdout else len(plan.listing)
    return SplitReport(
        split=plan.split, where=src.where, images=images,
        labels=_labels(part, src, plan.label_source), label_source=plan.label_source,
        label_check=plan.label_check.mode, tasks=len(plan.tasks),
        writes=_writes(part, plan.split, images, len(plan.tasks)),
        output=_output(part, plan.split, replaced),
        spool_bytes=src.spool_bytes if last else 0,
        listing_errors=len(plan.listing.errors),
        unknown_wnids=sum(unknown_wnids(plan).values()),
        expected_images=plan.label_check.expected, missing_images=plan.label_check.missing,
        missing_first=plan.label_check.missing_first)


def dry_run(opts: ConvertOptions) -> DryRunReport:
    """Plan the conversion ``opts`` describes and say what it would do; writes nothing."""
    check_out_not_input(opts)
    found = detect(opts.input, opts.form)
    parts = [(p, p.source or one_split(p)) for p in split_inputs(replace(opts, form=found.form))]
    reports = tuple(r for p, src in parts
                    for r in (_planned(p, src, opts) if src.dry_listed else _spooled(p, src)))
    if all(src.dry_listed for _, src in parts):  # else some labels are known only in the run
        check_trust(opts, [r.label_source for r in reports])
    return DryRunReport(input=str(opts.input), out=str(opts.out), form=found.form,
                        description=found.description, splits=reports,
                        skipped=tuple(str(s) for s in found.not_converted(
                            src.split for _, src in parts)), max_errors=opts.max_errors)
