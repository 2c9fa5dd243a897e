"""What one rank's conversion of one split did: ``ConvertSummary``, the value ``convert``
returns and ``imgprep convert --json`` prints (``dataclasses.asdict``: one key a field)."""

from __future__ import annotations

from dataclasses import dataclass

from imgprep.convert.finalise import Finalised
from imgprep.convert.records import Assignment
from imgprep.convert.tasks import Plan, TaskResult, unknown_wnids
from imgprep.job.world import World


@dataclass(frozen=True, kw_only=True)
class ConvertSummary:
    """One rank's run over one split. ``complete``: this rank's job is done (for the
    finaliser: the manifest is written, so the errors were within ``max_errors``)."""

    complete: bool
    role: str  # "finaliser" (writes the manifest) or "part"
    rank: int
    world_size: int
    node_rank: int
    mode: str  # --mode: shared or partition
    split: str
    format: str
    input: str
    input_kind: str  # what the input is, as the listing says ("tar", "folder" …)
    images_listed: int
    samples: int  # converted samples the finaliser's manifest counts (this rank's for a part)
    errors: int
    max_errors: int
    unknown_wnids: dict[str, int]  # {wnid: images} named with a wnid outside the class table
    label_source: str  # where the labels came from (inputs.labels.SOURCES; none: unlabelled)
    label_check: str  # which check the labels passed (inputs.groundtruth.LabelCheck)
    label_check_names: dict[str, int]
    expected_images: int | None  # images the ground truth lists (None: no ground truth)
    missing_images: int  # of those, how many the input does not hold (not converted)
    missing_first: list[str]  # the first of their names, sorted
    skipped_non_images: int
    tasks: int  # tasks the output folder holds
    tasks_mine: int  # tasks this rank converts
    tasks_resumed: int  # of those, finished by an earlier run
    bytes: int
    seconds: float
    images_per_s: float  # images converted by this run (not resumed), per second
    workers: int
    out: str
    manifest: str | None
    error_log: str | None
    warnings: int  # images converted whole with a warning (libjpeg's, trailing bytes)
    warning_log: str | None


def summarise(plan: Plan, world: World, assignment: Assignment, *, fresh: list[TaskResult],
              resumed: list[TaskResult], results: list[TaskResult], final: Finalised | None,
              seconds: float) -> ConvertSummary:
    """The summary of a rank's run: ``fresh`` and ``resumed`` are its own tasks' results,
    ``results`` every result it counts (the finaliser's include the other ranks'), ``final``
    what the finaliser wrote (None for a part)."""
    opts = plan.opts
    converted_now = sum(r.samples for r in fresh)
    errors = final.errors if final is not None else sum(len(r.errors) for r in results)
    noted = final.warnings if final is not None else sum(len(r.warnings) for r in results)
    return ConvertSummary(
        complete=final.manifest is not None if final is not None else True,
        role="finaliser" if final is not None else "part",
        rank=world.rank,
        world_size=world.world_size,
        node_rank=world.node_rank,
        mode=opts.mode,
        split=plan.split,
        format=opts.format,
        input=str(opts.input),
        input_kind=plan.listing.kind,
        images_listed=len(plan.listing),
        samples=sum(r.samples for r in results),
        errors=errors,
        max_errors=opts.max_errors,
        unknown_wnids=unknown_wnids(plan),
        label_source=plan.label_source,
        label_check=plan.label_check.mode,
        label_check_names=plan.label_check.names(),
        expected_images=plan.label_check.expected,
        missing_images=plan.label_check.missing,
        missing_first=list(plan.label_check.missing_first),
        skipped_non_images=plan.listing.skipped,
        tasks=len(assignment.held),
        tasks_mine=len(assignment.mine),
        tasks_resumed=len(resumed),
        bytes=sum(r.bytes for r in results),
        seconds=round(seconds, 3),
        images_per_s=round(converted_now / seconds, 1) if seconds > 0 else 0.0,
        workers=opts.workers,
        out=str(opts.out),
        manifest=str(final.manifest) if final is not None and final.manifest else None,
        error_log=str(final.error_log) if final is not None and final.error_log else None,
        warnings=noted,
        warning_log=str(final.warning_log) if final is not None and final.warning_log else None,
    )
