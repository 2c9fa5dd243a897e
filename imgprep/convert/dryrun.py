"""``imgprep convert --dry-run``: what a conversion would read, skip and write, writing nothing.

The input is detected and every split planned exactly as a run plans it (listing, ground
truth and its check, labels, tasks, the output folder's rules), so a dry run refuses what
the run would refuse; nothing is created, not even the output folder. A split whose form
needs a staging copy is not listed (listing it is the copy): its image count and the copy's
disk cost come from the form's probe.
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


@dataclass(frozen=True, kw_only=True)
class DryRunReport:
    """What ``imgprep convert`` would do with these options."""

    input: str
    out: str
    form: str
    description: str
    splits: tuple[SplitReport, ...]
    skipped: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "dry_run": True, "splits": [asdict(s) for s in self.splits],
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
    """The split of a staged form, as its probe tells it; with ``--holdout-per-class`` its
    val and train parts, whose sizes the staging copy tells."""
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
    return tuple(_report(plan, part, src)
                 for plan in split_plan(make_plan(part, origin=origin, spool=False)))


def _report(plan: Plan, part: ConvertOptions, src: SplitInput) -> SplitReport:
    replaced = check_folder(plan) is not None
    check_out_not_input(plan.opts, plan.split)
    images = sum(len(t.items) for t in plan.tasks) if plan.holdout else len(plan.listing)
    return SplitReport(
        split=plan.split, where=src.where, images=images,
        labels=_labels(part, src, plan.label_source), label_source=plan.label_source,
        label_check=plan.label_check.mode, tasks=len(plan.tasks),
        writes=_writes(part, plan.split, images, len(plan.tasks)),
        output=_output(part, plan.split, replaced), spool_bytes=0,
        listing_errors=len(plan.listing.errors),
        unknown_wnids=sum(unknown_wnids(plan).values()))


def dry_run(opts: ConvertOptions) -> DryRunReport:
    """Plan the conversion ``opts`` describes and say what it would do; writes nothing."""
    check_out_not_input(opts)
    found = detect(opts.input, opts.form)
    parts = [(p, p.source or one_split(p)) for p in split_inputs(replace(opts, form=found.form))]
    reports = tuple(r for p, src in parts
                    for r in (_spooled(p, src) if src.spool_bytes else _planned(p, src, opts)))
    if not any(src.spool_bytes for _, src in parts):  # a spooled split's labels are unknown
        check_trust(opts, [r.label_source for r in reports])
    return DryRunReport(input=str(opts.input), out=str(opts.out), form=found.form,
                        description=found.description, splits=reports,
                        skipped=tuple(str(s) for s in found.skipped))
