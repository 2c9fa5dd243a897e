"""``imgprep convert``: plan the output (``imgprep.convert.tasks``), convert in parallel, resume,
finalise.

Each shard or chunk of the plan is a task; a task's output depends on nothing but its
own samples, so the bytes are the same for any worker count. A finished task leaves a small
record under ``<out>/.imgprep/``; a rerun skips tasks whose record and files still verify and
redoes the rest. The manifest is written last.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _js
from pathlib import Path
from typing import Any

import numpy as np

from imgprep import __version__
from imgprep.convert import image, outdir
from imgprep.convert.pool import part_cuts, run_pool
from imgprep.convert.records import (
    assigned_tasks,
    is_finaliser,
    load_done,
    node_info,
    prepare_folder,
    wait_for_records,
    write_record,
)
from imgprep.convert.tasks import (
    OUTPUT_FORMATS,
    RANK_MODES,
    STATE_DIR,
    ConvertOptions,
    Notify,
    Plan,
    Task,
    TaskResult,
    check_folder,
    check_out_not_input,
    infer_split,
    make_plan,
    options_json,
    plan_tasks,
    split_inputs,
    unknown_errors,
    unknown_wnids,
)
from imgprep.errors import ImageError, OutputError, SourceFormatError
from imgprep.fsutil import ensure_writable_dir, fsync_dir, write_bytes_atomic
from imgprep.inputs.sources import SourceReader
from imgprep.inputs.spool import remove_spool
from imgprep.job.world import World
from imgprep.shards.index import index_shards, layout_path, save_layout
from imgprep.shards.manifest import Manifest, NodeSection, ShardEntry, write_manifest
from imgprep.shards.writers import ShardWriter, write_list_image

__all__ = ["OUTPUT_FORMATS", "STATE_DIR", "ConvertOptions", "Plan", "Task", "TaskResult",
           "assigned_tasks", "convert", "convert_splits", "infer_split", "load_done",
           "make_plan", "plan_tasks", "run_task", "split_inputs"]

STATS_EVERY = 4  # per-channel mean/std from every 4th image in key order (1/4 the cost)
PART_MIN = 16  # images in a part (fewer tasks than workers); smaller cost more to ship
Progress = Callable[[int], None]


# ---------------------------------------------------------------------------- one task


def _sample_meta(plan: Plan, i: int, conv: image.Converted) -> bytes:
    """The sample's ``.json``: ``json.dumps(..., sort_keys=True)``'s bytes, built directly."""
    label = int(plan.labels[i])
    w, h = conv.original_size
    return (f'{{"label": {label}, "original_format": {_js(conv.original_format)}, '
            f'"original_mode": {_js(conv.original_mode)}, "original_size": [{w}, {h}], '
            f'"source": {_js(plan.listing.member_str(i))}, '
            f'"wnid": {_js(plan.classes.wnids[label])}}}').encode()


@dataclass
class _Part:
    """What converting items ``[lo, hi)`` of a task gave: the encoded samples (shards; list
    images are written where they are converted), the files written, errors, statistics."""

    task: int
    lo: int
    samples: list[tuple[str, dict[str, bytes]]] = field(default_factory=list)
    files: list[list[Any]] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    hist: np.ndarray = field(default_factory=lambda: np.zeros(768, dtype=np.int64))
    stats_images: int = 0
    mean: np.ndarray | None = None


def _convert_items(plan: Plan, task: Task, lo: int, hi: int, tick: Callable[[], None],
                   sink: Callable[[tuple[str, dict[str, bytes]]], None] | None) -> _Part:
    """Convert items ``[lo, hi)`` of ``task``: each shard sample goes to ``sink`` (the
    shard, or the part's own list), each list image is written."""
    opts, lst = plan.opts, plan.listing
    part = _Part(task.index, lo)
    size = opts.transform.size
    if plan.wants_mean_image:
        part.mean = np.zeros((size, size, 3), dtype=np.uint64)
    add = sink or part.samples.append
    items = task.items[lo:hi]
    rows = zip(items.tolist(), plan.labels[items].tolist(), strict=True)
    with SourceReader(lst.containers) as reader:
        for i, label in rows:
            try:
                data = reader.read_item(lst, i)
                conv = image.convert_image(data, opts.transform)
            except (ImageError, OSError) as e:
                reason = str(e) if isinstance(e, ImageError) else f"cannot read: {e}"
                part.errors.append({"source": f"{lst.root}/{lst.member_str(i)}",
                                    "key": lst.key_str(i), "reason": reason})
                tick()
                continue
            if i % STATS_EVERY == 0:
                part.hist += image.channel_histogram(conv.image)
                part.stats_images += 1
            if part.mean is not None:
                np.add(part.mean, image.center_pixels(conv.image, size), out=part.mean)
            if opts.format == "shards":
                fields = {"jpg": conv.jpeg, "cls": b"%d" % label}
                if opts.meta:
                    fields["json"] = _sample_meta(plan, i, conv)
                add((lst.key_str(i), fields))
            else:
                rel = f"{plan.split}/{plan.classes.wnids[label]}/{lst.key_str(i)}.jpg"
                sha = write_list_image(opts.out / rel, conv.jpeg)
                part.files.append([rel, label, len(conv.jpeg), sha])
            tick()
    return part


def _finish(plan: Plan, task: Task, parts: list[_Part], shard: ShardWriter | None) -> TaskResult:
    """The task's result from its parts (in order) and closed shard; writes its record."""
    res = TaskResult(task.index, task.name, plan.fingerprint)
    res.errors = [e for p in parts for e in p.errors]
    res.sums = image.sums_of_histogram(np.sum([p.hist for p in parts], axis=0)).tolist()
    res.stats_images = sum(p.stats_images for p in parts)
    if shard is not None:
        res.samples, res.bytes, res.sha256 = shard.samples, shard.bytes, shard.sha256
        save_layout(layout_path(plan.state_dir, task.name), shard.layout(),
                    ShardEntry(task.name, shard.samples, shard.bytes, shard.sha256))
    else:
        res.files = [f for p in parts for f in p.files]
        res.samples, res.bytes = len(res.files), sum(f[2] for f in res.files)
        if plan.wants_mean_image:
            mean = sum((p.mean for p in parts if p.mean is not None), np.zeros(1, np.uint64))
            write_bytes_atomic(plan.mean_path(task), _npy_bytes(mean))
    write_record(plan, res)
    return res


def run_task(plan: Plan, task: Task, tick: Callable[[], None]) -> TaskResult:
    """Convert one task's samples, streaming them into its shard, then write its record."""
    if plan.opts.format != "shards":
        return _finish(plan, task, [_convert_items(plan, task, 0, len(task.items), tick,
                                                   None)], None)
    with ShardWriter(plan.opts.out / task.name) as w:
        part = _convert_items(plan, task, 0, len(task.items), tick, lambda s: w.add(*s))
    return _finish(plan, task, [part], w)


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


# ---------------------------------------------------------------------------- the pool


class _Assembler:
    """Writes each task converted in parts as its parts arrive (in this process, while the
    workers convert the next ones): a part is appended once every part before it is in."""

    def __init__(self, plan: Plan, bounds: dict[int, list[int]]) -> None:
        self.plan, self.bounds = plan, bounds
        self.waiting: dict[int, dict[int, _Part]] = {t: {} for t in bounds}
        self.done: dict[int, list[_Part]] = {t: [] for t in bounds}
        self.shards: dict[int, ShardWriter] = {}
        self.results: list[TaskResult] = []

    def take(self, part: _Part) -> None:
        t, plan = part.task, self.plan
        self.waiting[t][part.lo] = part
        done, starts = self.done[t], self.bounds[t]
        while len(done) < len(starts) and starts[len(done)] in self.waiting[t]:
            p = self.waiting[t].pop(starts[len(done)])
            if plan.opts.format == "shards":
                if t not in self.shards:
                    self.shards[t] = ShardWriter(plan.opts.out / plan.tasks[t].name).__enter__()
                for sample in p.samples:
                    self.shards[t].add(*sample)
                p.samples = []
            done.append(p)
        if len(done) == len(starts):
            shard = self.shards.pop(t, None)
            if shard is not None:
                shard.__exit__(None, None, None)
            self.results.append(_finish(plan, plan.tasks[t], done, shard))

    def abort(self, e: BaseException) -> None:
        """Remove the temporary files of shards left unfinished."""
        for shard in self.shards.values():
            shard.__exit__(type(e), e, e.__traceback__)


def _run_parts(plan: Plan, todo: Sequence[Task], workers: int,
               progress: Progress | None) -> list[TaskResult]:
    """Fewer tasks than workers: cut each task into parts that workers convert and this
    process assembles in order, so the bytes are those of one worker per task."""
    jobs: list[tuple[Task, int, int]] = []
    bounds: dict[int, list[int]] = {}
    cut = part_cuts([len(t.items) for t in todo], workers, PART_MIN)
    for t, cuts in zip(todo, cut, strict=True):
        bounds[t.index] = cuts[:-1]
        jobs += [(t, lo, hi) for lo, hi in itertools.pairwise(cuts)]
    asm = _Assembler(plan, bounds)

    def job(k: int, tick: Callable[[], None]) -> _Part:
        task, lo, hi = jobs[k]
        return _convert_items(plan, task, lo, hi, tick, None)

    try:
        run_pool(job, range(len(jobs)), workers, progress, asm.take)
    except BaseException as e:
        asm.abort(e)
        raise
    return asm.results


def run_tasks(plan: Plan, todo: Sequence[Task], workers: int,
              progress: Progress | None = None) -> list[TaskResult]:
    """Run ``todo`` on ``workers`` forked processes (in-process when 1); results unordered.
    With fewer tasks than workers, the tasks are converted in parts (``_run_parts``)."""
    if 1 < workers and len(todo) < workers:
        return _run_parts(plan, todo, workers, progress)
    return run_pool(lambda index, tick: run_task(plan, plan.tasks[index], tick),
                    [t.index for t in todo], workers, progress)


# ---------------------------------------------------------------------------- finalising


def _mean_std(sums: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-channel mean and std on the 0..1 scale from exact integer sums."""
    n = sums[2].astype(np.float64)
    if not n.all():
        return [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    mean = sums[0] / n
    var = np.maximum(sums[1] / n - mean * mean, 0.0)
    return ([round(float(x) / 255, 6) for x in mean],
            [round(float(x) / 255, 6) for x in np.sqrt(var)])


def _finalise(plan: Plan, results: list[TaskResult], extra_errors: list[dict[str, str]],
              node: NodeSection | None = None) -> tuple[Path | None, Path | None, int]:
    opts, split, out = plan.opts, plan.split, plan.opts.out
    results = sorted(results, key=lambda r: r.index)
    errors = extra_errors + [e for r in results for e in r.errors]
    log = out / f"{split}-errors.jsonl"
    if errors:
        write_bytes_atomic(log, "".join(
            json.dumps(e, sort_keys=True, ensure_ascii=False) + "\n" for e in errors).encode())
    else:
        with contextlib.suppress(FileNotFoundError):
            log.unlink()
    if len(errors) > opts.max_errors:
        return None, log, len(errors)
    sums = np.sum([np.asarray(r.sums, dtype=np.int64) for r in results], axis=0) if results \
        else np.zeros((3, 3), dtype=np.int64)
    mean, std = _mean_std(sums)
    total = sum(r.samples for r in results)
    list_file = list_sha = None
    if opts.format == "list":
        text = "".join(f"{rel} {label}\n" for r in results for rel, label, _, _ in r.files)
        data = text.encode("utf-8")
        write_bytes_atomic(out / f"{split}.txt", data)
        list_file, list_sha = f"{split}.txt", hashlib.sha256(data).hexdigest()
        write_bytes_atomic(out / "classes.txt", plan.classes.to_text().encode("utf-8"))
        if plan.wants_mean_image and total:
            acc = np.zeros((opts.transform.size,) * 2 + (3,), dtype=np.uint64)
            for t in plan.tasks:
                acc += np.load(plan.mean_path(t))
            mean_img = (acc / total).astype(np.float32).transpose(2, 0, 1).copy()
            write_bytes_atomic(out / "mean.npy", _npy_bytes(mean_img))
    shards = [ShardEntry(r.name, r.samples, r.bytes, r.sha256) for r in results] \
        if opts.format == "shards" else []
    index = index_shards(out, split, shards, plan.state_dir, dali=True) \
        if opts.format == "shards" else None
    lst = plan.listing
    fsync_dir(out)  # every shard's rename is on disk before the manifest names it
    manifest = Manifest(
        split=split, format=opts.format, total_samples=total, classes=plan.classes.to_json(),
        mean=mean, std=std, options={**options_json(opts, split), "fingerprint": plan.fingerprint},
        tool_version=__version__, shards=shards, list_file=list_file, list_sha256=list_sha,
        errors=len(errors), error_log=log.name if errors else None,
        stats_images=sum(r.stats_images for r in results), node=node, index=index,
        source={"kind": lst.kind, "name": Path(lst.root).name, "images": len(lst),
                "skipped_non_images": lst.skipped},
    )
    return write_manifest(out, manifest), (log if errors else None), len(errors)


def convert(opts: ConvertOptions, world: World | None = None, progress: Progress | None = None,
            on_plan: Callable[[Plan, int], None] | None = None,
            notify: Notify | None = None) -> dict[str, Any]:
    """Run a conversion of one split (resuming what a previous run finished); returns the
    summary. A folder holding split folders (``train/`` and ``val/``) is refused, naming
    them: ``convert_splits`` converts each into its own manifest.

    With a distributed ``world`` (launched by mpirun, srun or torchrun), every rank computes
    the same plan and converts only its share (``assigned_tasks``); rank 0 (in partition mode,
    each node's local rank 0) waits for the others' task records, then writes the manifest, so
    the output is byte-identical to a single-process run. ``on_plan(plan, remaining_images)``
    is called once the work is known (for a progress bar); ``notify(line)`` with what was
    removed (``--overwrite``). The manifest is written only when errors <= ``opts.max_errors``;
    ``summary["complete"]`` says whether this rank's job is done.
    """
    parts = split_inputs(opts)
    if len(parts) > 1:
        names = " and ".join(p.source.where if p.source else str(p.input) for p in parts)
        raise SourceFormatError(
            f"{opts.input} holds the splits {names}; convert each into its own manifest: "
            f"imgprep convert {opts.input} -o {opts.out} does both, or pass --split")
    return convert_splits(opts, world, progress, on_plan, notify)[0]


def convert_splits(opts: ConvertOptions, world: World | None = None,
                   progress: Progress | None = None,
                   on_plan: Callable[[Plan, int], None] | None = None,
                   notify: Notify | None = None) -> list[dict[str, Any]]:
    """Convert every split of ``opts.input`` (see ``split_inputs``), each into its own
    manifest, planning and checking all of them before converting any; one summary each.
    A run that fails leaves no output folder it created behind if it wrote nothing.
    ``opts`` (the output is a function of it), ``world`` (default: one process) and the
    callbacks are as in ``convert``, which runs each split."""
    world = world or World()
    say = notify or (lambda line: None)
    if opts.mode not in RANK_MODES:
        raise ValueError(f"mode must be one of {RANK_MODES}")
    if opts.mode == "partition" and opts.format != "shards":
        raise OutputError("--mode partition writes node-local shards; use --format shards")
    check_out_not_input(opts)
    created = outdir.created_dirs(opts.out / STATE_DIR)  # with --out and its missing parents
    try:
        parts = split_inputs(opts, say if is_finaliser(opts, world) else None)
        ensure_writable_dir(opts.out)
        plans = [make_plan(o, origin=opts, rank=world.rank) for o in parts]
        created[:0] = [p.state_dir for p in plans if not p.state_dir.exists()]
        if len({p.split for p in plans}) < len(plans):
            raise SourceFormatError(f"{opts.input}: two inputs give the same split; "
                                    "convert them one at a time")
        for plan in plans:
            check_out_not_input(plan.opts, plan.split)
            check_folder(plan)
        return [_convert_plan(plan, world, progress, on_plan, say) for plan in plans]
    except BaseException:
        outdir.remove_if_empty(created)  # nothing new is left behind by a failed run
        raise


def _convert_plan(plan: Plan, world: World, progress: Progress | None,
                  on_plan: Callable[[Plan, int], None] | None, notify: Notify) -> dict[str, Any]:
    t0 = time.perf_counter()
    opts = plan.opts
    mine, held = assigned_tasks(plan, world)
    finaliser = is_finaliser(opts, world)
    if finaliser:
        prepare_folder(plan, world, held, notify)
    plan.state_dir.mkdir(parents=True, exist_ok=True)
    done: list[TaskResult] = []
    todo: list[Task] = []
    for t in mine:
        r = load_done(plan, t)
        if r is None:
            todo.append(t)
        else:
            done.append(r)
    remaining = int(sum(len(t.items) for t in todo))
    if on_plan is not None:
        on_plan(plan, remaining)
    fresh = run_tasks(plan, todo, opts.workers, progress)
    results = done + fresh
    manifest = log = None
    n_errors = sum(len(r.errors) for r in results)
    if finaliser:
        mine_names = {t.name for t in mine}
        results += wait_for_records(plan, [t for t in held if t.name not in mine_names], world)
        root = plan.listing.root
        listing_errors = [{"source": f"{root}/{e.source}" if e.source else root, "key": "",
                           "reason": e.reason} for e in plan.listing.errors]
        listing_errors += unknown_errors(plan)
        if opts.mode == "partition" and world.node_rank != 0:
            listing_errors = []  # reported once, by node 0
        manifest, log, n_errors = _finalise(plan, results, listing_errors,
                                            node_info(plan, world))
        if manifest is not None:
            remove_spool(plan.spool_dir)  # the staging copy is not needed any more
    return _summary(plan, world, finaliser, results, fresh, done, (mine, held),
                    (manifest, log, n_errors), time.perf_counter() - t0)


def _summary(plan: Plan, world: World, finaliser: bool, results: list[TaskResult],
             fresh: list[TaskResult], done: list[TaskResult],
             tasks: tuple[list[Task], list[Task]], final: tuple[Path | None, Path | None, int],
             seconds: float) -> dict[str, Any]:
    opts, (mine, held), (manifest, log, n_errors) = plan.opts, tasks, final
    converted_now = sum(r.samples for r in fresh)
    return {
        "complete": manifest is not None if finaliser else True,
        "role": "finaliser" if finaliser else "part",
        "rank": world.rank,
        "world_size": world.world_size,
        "node_rank": world.node_rank,
        "mode": opts.mode,
        "split": plan.split,
        "format": opts.format,
        "input": str(opts.input),
        "input_kind": plan.listing.kind,
        "images_listed": len(plan.listing),
        "samples": sum(r.samples for r in results),
        "errors": n_errors,
        "max_errors": opts.max_errors,
        "unknown_wnids": unknown_wnids(plan),
        "label_check": plan.label_check.mode,
        "label_check_names": plan.label_check.names(),
        "skipped_non_images": plan.listing.skipped,
        "tasks": len(held),
        "tasks_mine": len(mine),
        "tasks_resumed": len(done),
        "bytes": sum(r.bytes for r in results),
        "seconds": round(seconds, 3),
        "images_per_s": round(converted_now / seconds, 1) if seconds > 0 else 0.0,
        "workers": opts.workers,
        "out": str(opts.out),
        "manifest": str(manifest) if manifest else None,
        "error_log": str(log) if log else None,
    }
