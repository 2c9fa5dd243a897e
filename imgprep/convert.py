"""``imgprep convert``: plan the output (``imgprep.plan``), convert in parallel, resume,
finalise.

Each shard or chunk of the plan is a task; a task's output depends on nothing but its
own samples, so the bytes are the same for any worker count. A finished task leaves a small
record under ``<out>/.imgprep/``; a rerun skips tasks whose record and files still verify and
redoes the rest. The manifest is written last.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from imgprep import __version__, outdir
from imgprep.assign import balanced_split, node_shards
from imgprep.errors import ImageError, OutputError, SourceFormatError, WaitTimeout
from imgprep.fsutil import (
    ensure_writable_dir,
    fsync_dir,
    sweep_tmp,
    write_bytes_atomic,
    write_json_atomic,
)
from imgprep.index import index_shards, layout_path, save_layout
from imgprep.manifest import (
    SHARD_NAME_RE,
    Manifest,
    NodeSection,
    ShardEntry,
    sha256_file,
    write_manifest,
)
from imgprep.plan import (
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
from imgprep.pool import run_pool
from imgprep.sources import SourceReader
from imgprep.transform import center_pixels, channel_sums, convert_image
from imgprep.world import World
from imgprep.writers import ShardWriter, write_list_image

__all__ = ["OUTPUT_FORMATS", "STATE_DIR", "ConvertOptions", "Plan", "Task", "TaskResult",
           "assigned_tasks", "convert", "convert_splits", "infer_split", "make_plan",
           "plan_tasks", "split_inputs"]

WAIT_POLL_S = 0.5
STATS_EVERY = 4  # per-channel mean/std from every 4th image in key order (1/4 the cost)
Progress = Callable[[int], None]


# ---------------------------------------------------------------------------- one task


def _sample_meta(plan: Plan, i: int, conv: Any) -> bytes:
    label = int(plan.labels[i])
    return json.dumps({
        "wnid": plan.classes.wnids[label], "label": label,
        "source": plan.listing.member_str(i),
        "original_size": list(conv.original_size), "original_mode": conv.original_mode,
        "original_format": conv.original_format,
    }, sort_keys=True).encode()


def run_task(plan: Plan, task: Task, tick: Callable[[], None]) -> TaskResult:
    """Convert one task's samples, write its output atomically, then its record."""
    opts, lst = plan.opts, plan.listing
    res = TaskResult(task.index, task.name, plan.fingerprint)
    sums = np.zeros((3, 3), dtype=np.int64)
    size = opts.transform.size
    mean_acc = np.zeros((size, size, 3), dtype=np.uint64) if plan.wants_mean_image else None

    def samples() -> Any:
        with SourceReader(lst.containers) as reader:
            for i in task.items.tolist():
                member = lst.member_str(i)
                try:
                    data = reader.read(int(lst.container[i]), int(lst.offset[i]),
                                       int(lst.size[i]), member)
                    conv = convert_image(data, opts.transform)
                except (ImageError, OSError) as e:
                    reason = str(e) if isinstance(e, ImageError) else f"cannot read: {e}"
                    res.errors.append({"source": f"{lst.root}/{member}",
                                       "key": lst.key_str(i), "reason": reason})
                    tick()
                    continue
                if i % STATS_EVERY == 0:
                    sums[:] += channel_sums(conv.image)
                    res.stats_images += 1
                if mean_acc is not None:
                    np.add(mean_acc, center_pixels(conv.image, size), out=mean_acc)
                yield i, conv
                tick()

    if opts.format == "shards":
        with ShardWriter(opts.out / task.name) as w:
            for i, conv in samples():
                fields = {"jpg": conv.jpeg, "cls": str(int(plan.labels[i])).encode()}
                if opts.meta:
                    fields["json"] = _sample_meta(plan, i, conv)
                w.add(lst.key_str(i), fields)
        res.samples, res.bytes, res.sha256 = w.samples, w.bytes, w.sha256
        save_layout(layout_path(plan.state_dir, task.name), w.layout(),
                    ShardEntry(task.name, w.samples, w.bytes, w.sha256))
    else:
        for i, conv in samples():
            label = int(plan.labels[i])
            rel = f"{plan.split}/{plan.classes.wnids[label]}/{lst.key_str(i)}.jpg"
            sha = write_list_image(opts.out / rel, conv.jpeg)
            res.files.append([rel, label, len(conv.jpeg), sha])
            res.samples += 1
            res.bytes += len(conv.jpeg)
        if mean_acc is not None:
            write_bytes_atomic(plan.mean_path(task), _npy_bytes(mean_acc))
    res.sums = sums.tolist()
    record = asdict(res)
    del record["resumed"]
    # Records are verified against the files before any reuse, so they need no fsync.
    write_json_atomic(plan.record_path(task), record, durable=False)
    return res


def _npy_bytes(arr: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def load_done(plan: Plan, task: Task, checksum: bool = True) -> TaskResult | None:
    """The record of ``task`` if it finished under the same plan and its files still verify.

    ``checksum=False`` checks sizes only: for collecting other ranks' fresh work, where
    re-reading every shard over the file server would double the I/O.
    """
    try:
        rec = json.loads(plan.record_path(task).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("fingerprint") != plan.fingerprint:
        return None
    if rec.get("index") != task.index or rec.get("name") != task.name:
        return None
    res = TaskResult(**rec, resumed=True)
    out = plan.opts.out
    try:
        if plan.opts.format == "shards":
            p = out / task.name
            if p.stat().st_size != res.bytes or (checksum and sha256_file(p) != res.sha256):
                return None
        else:
            for rel, _label, nbytes, sha in res.files:
                if not checksum:
                    if (out / rel).stat().st_size != nbytes:
                        return None
                    continue
                data = (out / rel).read_bytes()
                if len(data) != nbytes or hashlib.sha256(data).hexdigest() != sha:
                    return None
            if plan.wants_mean_image and not plan.mean_path(task).is_file():
                return None
    except OSError:
        return None
    return res


# ---------------------------------------------------------------------------- the pool


def run_tasks(plan: Plan, todo: Sequence[Task], workers: int,
              progress: Progress | None = None) -> list[TaskResult]:
    """Run ``todo`` on ``workers`` forked processes (in-process when 1); results unordered."""
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
    index = index_shards(out, split, shards, plan.state_dir) if opts.format == "shards" else None
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


def assigned_tasks(plan: Plan, world: World) -> tuple[list[Task], list[Task]]:
    """(the tasks ``world.rank`` converts, the tasks its output folder must end up holding).

    shared: all ranks split all tasks, balanced by samples, into one shared folder.
    partition: node k converts exactly the shards ``assign.node_shards`` gives it (the ones
    its ranks will read), split over its local ranks, into its node-local folder.
    """
    tasks = list(plan.tasks)
    if not world.is_distributed:
        return tasks, tasks
    weights = [len(t.items) for t in tasks]
    if plan.opts.mode == "partition":
        node = node_shards(weights, world.num_nodes, "partition", plan.opts.seed)[world.node_rank]
        mine = balanced_split(weights, world.local_world_size, node)[world.local_rank]
        return [tasks[i] for i in mine], [tasks[i] for i in node]
    mine = balanced_split(weights, world.world_size, range(len(tasks)))[world.rank]
    return [tasks[i] for i in mine], tasks


def _is_finaliser(opts: ConvertOptions, world: World) -> bool:
    """Rank 0 writes the manifest (local rank 0 of each node in partition mode)."""
    return world.local_rank == 0 if opts.mode == "partition" else world.rank == 0


def _wait_for_records(plan: Plan, tasks: list[Task], world: World) -> list[TaskResult]:
    """Collect other ranks' finished tasks, polling their records until ``wait_timeout``."""
    deadline = time.monotonic() + plan.opts.wait_timeout
    found: dict[int, TaskResult] = {}
    while True:
        for t in tasks:
            if t.index not in found and (r := load_done(plan, t, checksum=False)) is not None:
                found[t.index] = r
        missing = [t.name for t in tasks if t.index not in found]
        if not missing:
            return list(found.values())
        if time.monotonic() > deadline:
            raise WaitTimeout(
                f"rank {world.rank}: waited {plan.opts.wait_timeout:.0f} s for {len(missing)} "
                f"shards from the other ranks (first: {', '.join(missing[:3])}) in "
                f"{plan.opts.out}; check that every rank is running, then rerun the whole job "
                "to resume"
            )
        time.sleep(WAIT_POLL_S)


def _node_info(plan: Plan, world: World) -> NodeSection | None:
    if plan.opts.mode != "partition" or not world.is_distributed:
        return None
    # The whole set's shards with their planned sample counts: loaders on any node compute
    # every node's share from them (exact unless a node lost images to errors).
    return NodeSection(world.node_rank, world.num_nodes, "partition", plan.opts.seed,
                       sum(len(t.items) for t in plan.tasks), len(plan.tasks),
                       tuple((t.name, len(t.items)) for t in plan.tasks))


def _prepare_folder(plan: Plan, world: World, held: list[Task], notify: Notify) -> None:
    """The finaliser's clean-up before converting: a split that ``--overwrite`` replaces,
    leftovers of this split (temporary files, shards no longer planned, another format's
    files); other splits' files are never touched."""
    opts = plan.opts
    replaced = check_folder(plan)
    if replaced is not None:
        notify(outdir.remove_split(opts.out, replaced, plan.split))
    # Other ranks may be writing their tasks' temporary files right now: keep those.
    busy = {t.name for t in plan.tasks} if world.is_distributed else set()
    sweep_tmp(opts.out, busy | outdir.other_tmp_files(opts.out, plan.split))
    sweep_tmp(plan.state_dir, {f"{n}.json" for n in busy} | {f"{n}.mean.npy" for n in busy}
              | {layout_path(plan.state_dir, n).name for n in busy})
    other = "list" if opts.format == "shards" else "shards"
    keep = {f"{plan.split}-errors.jsonl", f"{plan.split}.json"}
    outdir.remove_format(opts.out, plan.split, other, keep)
    _drop_stale_outputs(plan, {t.name for t in held})


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
        names = " and ".join(str(p.input) for p in parts)
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
    A run that fails leaves no output folder it created behind if it wrote nothing."""
    world = world or World()
    say = notify or (lambda line: None)
    if opts.mode not in RANK_MODES:
        raise ValueError(f"mode must be one of {RANK_MODES}")
    if opts.mode == "partition" and opts.format != "shards":
        raise OutputError("--mode partition writes node-local shards; use --format shards")
    check_out_not_input(opts)
    created = outdir.created_dirs(opts.out / STATE_DIR)  # with --out and its missing parents
    try:
        parts = split_inputs(opts, say if _is_finaliser(opts, world) else None)
        ensure_writable_dir(opts.out)
        plans = [make_plan(o) for o in parts]
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
    finaliser = _is_finaliser(opts, world)
    if finaliser:
        _prepare_folder(plan, world, held, notify)
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
        results += _wait_for_records(plan, [t for t in held if t.name not in mine_names], world)
        root = plan.listing.root
        listing_errors = [{"source": f"{root}/{e.source}" if e.source else root, "key": "",
                           "reason": e.reason} for e in plan.listing.errors]
        listing_errors += unknown_errors(plan)
        if opts.mode == "partition" and world.node_rank != 0:
            listing_errors = []  # reported once, by node 0
        manifest, log, n_errors = _finalise(plan, results, listing_errors,
                                            _node_info(plan, world))
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


def _drop_stale_outputs(plan: Plan, keep: set[str]) -> int:
    """Remove shards and records of this split that the folder must not hold (a rerun with
    fewer shards; another node's shards): nothing outside the manifest may look like data."""
    stale = [p for p in plan.opts.out.glob(f"{plan.split}-*.tar")
             if SHARD_NAME_RE.match(p.name) and p.name not in keep]
    stale += [p for p in plan.state_dir.glob("*.json") if p.stem not in keep]
    stale += [p for p in plan.state_dir.glob("*.mean.npy")
              if p.name.removesuffix(".mean.npy") not in keep]
    for p in stale:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    return len(stale)
