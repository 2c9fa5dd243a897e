"""``imgprep convert``: plan the output (``imgprep.convert.tasks``), convert in parallel
(``execute``), resume, finalise (``finalise``); one ``ConvertSummary`` a split.

Each shard or chunk of the plan is a task; a task's output depends on nothing but its
own samples, so the bytes are the same for any worker count. A finished task leaves a small
record under ``<out>/.imgprep/``; a rerun skips tasks whose record and files still verify and
redoes the rest. The manifest is written last.

Notes for people (what ``--overwrite`` removed, entries of a folder that are not converted,
the staging copy a failed run keeps) go to the ``imgprep.convert`` loggers as warnings; the
command line prints them.

A run that fails leaves nothing half-made behind: folders it created and left empty go, and
so do the unfinished files of a staging copy (locks, temporary files). The finished files of
a staging copy stay, since a rerun of the same input reuses them (for the Hub's train split,
hours of reading and ~150 GB), and the failure says where they are, how large, and how to
remove them.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from imgprep.convert import outdir, store
from imgprep.convert.errorlog import ErrorRecord
from imgprep.convert.execute import Progress, run_tasks
from imgprep.convert.finalise import finalise
from imgprep.convert.holdout import split_plan
from imgprep.convert.options import ConvertOptions
from imgprep.convert.records import (
    Assignment,
    assigned_tasks,
    is_finaliser,
    load_done,
    node_info,
    prepare_folder,
    wait_for_records,
)
from imgprep.convert.summary import ConvertSummary, summarise
from imgprep.convert.tasks import (
    STATE_DIR,
    Plan,
    Task,
    TaskResult,
    check_folder,
    check_out_not_input,
    check_trust,
    make_plan,
    split_inputs,
    spool_dir,
    unknown_errors,
)
from imgprep.errors import OutputError, SourceFormatError
from imgprep.fsutil import ensure_writable_dir
from imgprep.inputs.spool import tidy_spool
from imgprep.job.world import World

__all__ = ["convert", "convert_splits"]

OnPlan = Callable[[Plan, int], None]
log = logging.getLogger(__name__)


def convert(opts: ConvertOptions, world: World | None = None, progress: Progress | None = None,
            on_plan: OnPlan | None = None) -> ConvertSummary:
    """Run a conversion of one split (resuming what a previous run finished); returns its
    summary. A folder holding split folders (``train/`` and ``val/``) is refused, naming
    them: ``convert_splits`` converts each into its own manifest.

    With a distributed ``world`` (launched by mpirun, srun or torchrun), every rank computes
    the same plan and converts only its share (``assigned_tasks``); rank 0 (in partition mode,
    each node's local rank 0) waits for the others' task records, then writes the manifest, so
    the output is byte-identical to a single-process run. ``on_plan(plan, remaining_images)``
    is called once the work is known (for a progress bar), ``progress(n)`` as images are
    done. The manifest is written only when errors <= ``opts.max_errors``;
    ``summary.complete`` says whether this rank's job is done.
    """
    parts = split_inputs(opts)
    if opts.holdout_per_class:
        raise SourceFormatError("--holdout-per-class writes two splits (val and train); "
                                "convert them with convert_splits")
    if len(parts) > 1:
        names = " and ".join(p.source.where if p.source else str(p.input) for p in parts)
        raise SourceFormatError(
            f"{opts.input} holds the splits {names}; convert each into its own manifest: "
            f"imgprep convert {opts.input} -o {opts.out} does both, or pass --split")
    return convert_splits(opts, world, progress, on_plan)[0]


def convert_splits(opts: ConvertOptions, world: World | None = None,
                   progress: Progress | None = None,
                   on_plan: OnPlan | None = None) -> list[ConvertSummary]:
    """Convert every split of ``opts.input`` (see ``split_inputs``), each into its own
    manifest, planning and checking all of them before converting any; one summary each.
    A run that fails leaves no output folder it created behind if it wrote nothing.
    ``opts`` (the output is a function of it), ``world`` (default: one process) and the
    callbacks are as in ``convert``, which runs each split."""
    world = world or World()
    if opts.mode == "partition" and opts.format != "shards":
        raise OutputError("--mode partition writes node-local shards; use --format shards")
    check_out_not_input(opts)
    store.check_available(opts.store)
    created = outdir.created_dirs(opts.out / STATE_DIR)  # with --out and its missing parents
    spools: list[Path] = []
    try:
        parts = split_inputs(opts, warn=is_finaliser(opts, world))
        spools = [d for o in parts if o.source is not None
                  and (d := spool_dir(o, o.source)) is not None]
        ensure_writable_dir(opts.out)
        plans = [q for o in parts
                 for q in split_plan(make_plan(o, origin=opts, rank=world.rank))]
        check_trust(opts, [p.label_source for p in plans])
        created[:0] = [p.state_dir for p in plans if not p.state_dir.exists()]
        if len({p.split for p in plans}) < len(plans):
            raise SourceFormatError(f"{opts.input}: two inputs give the same split; "
                                    "convert them one at a time")
        for plan in plans:
            check_out_not_input(plan.opts, plan.split)
            check_folder(plan)
        return [_convert_plan(plan, world, progress, on_plan) for plan in plans]
    except BaseException as e:
        _tidy_spools(spools, world, say=isinstance(e, Exception))
        outdir.remove_if_empty(created)  # nothing new is left behind by a failed run
        raise


def _tidy_spools(folders: list[Path], world: World, say: bool) -> None:
    """After a failed run: the unfinished files of its staging copies removed (in one
    process; under a launcher another rank may be writing them), the finished ones kept and,
    when ``say``, named with their size and the command that removes them (by rank 0)."""
    for folder in folders:
        kept = tidy_spool(folder, unfinished=world.world_size == 1)
        if kept.files and say and world.rank == 0:
            size = f"{kept.bytes / 1e9:.1f} GB" if kept.bytes >= 1e9 else \
                f"{kept.bytes / 1e6:.1f} MB"
            files = f"{kept.files} file{'' if kept.files == 1 else 's'}"
            log.warning(f"the staging copy of the {folder.parent.name} split is kept for a "
                        f"rerun: {files}, {size} in {folder}; a rerun of the same "
                        "input reuses it; if you will not rerun, remove it: rm -r "
                        f"{shlex.quote(str(folder))}")


def _listing_errors(plan: Plan, world: World) -> list[ErrorRecord]:
    """Error-log entries of what listing the input refused, then of unknown wnids (in
    partition mode, node 0 reports them once)."""
    if plan.opts.mode == "partition" and world.node_rank != 0:
        return []
    if plan.holdout is not None and plan.split == "val":
        return []  # one listing gives both splits: its errors are reported once, with train
    root = plan.listing.root
    listed = [ErrorRecord(source=f"{root}/{e.source}" if e.source else root, key=e.key,
                          reason=e.reason) for e in plan.listing.errors]
    return listed + unknown_errors(plan)


def _others(plan: Plan, world: World, assignment: Assignment) -> list[TaskResult]:
    """The finaliser's wait for the results of the tasks other ranks convert."""
    mine = {t.name for t in assignment.mine}
    return wait_for_records(plan, [t for t in assignment.held if t.name not in mine], world)


def _convert_plan(plan: Plan, world: World, progress: Progress | None,
                  on_plan: OnPlan | None) -> ConvertSummary:
    t0 = time.perf_counter()
    assignment = assigned_tasks(plan, world)
    finaliser = is_finaliser(plan.opts, world)
    if finaliser:
        prepare_folder(plan, world, assignment.held)
    plan.state_dir.mkdir(parents=True, exist_ok=True)
    resumed: list[TaskResult] = []
    todo: list[Task] = []
    for t in assignment.mine:
        r = load_done(plan, t)
        if r is None:
            todo.append(t)
        else:
            resumed.append(r)
    if on_plan is not None:
        on_plan(plan, int(sum(len(t.items) for t in todo)))
    fresh = run_tasks(plan, todo, plan.opts.workers, progress, world.cores_per_rank())
    results = resumed + fresh
    final = None
    if finaliser:
        results = results + _others(plan, world, assignment)
        final = finalise(plan, results, _listing_errors(plan, world), node_info(plan, world))
    return summarise(plan, world, assignment, fresh=fresh, resumed=resumed, results=results,
                     final=final, seconds=time.perf_counter() - t0)
