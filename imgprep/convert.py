"""``imgprep convert``: plan the output, convert in parallel, resume, finalise.

The plan is a pure function of (listing, labels, options): samples are sorted by key, then a
seeded permutation over ALL classes spreads them across shards (label lists keep key order in
fixed-size chunks). Each shard or chunk is a task; a task's output depends on nothing but its
own samples, so the bytes are the same for any worker count. A finished task leaves a small
record under ``<out>/.imgprep/``; a rerun skips tasks whose record and files still verify and
redoes the rest. The manifest is written last.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import math
import multiprocessing as mp
import os
import queue
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from imgprep import __version__
from imgprep.assign import balanced_split, node_shards
from imgprep.errors import ImageError, ImgprepError, OutputError, WaitTimeout
from imgprep.fsutil import (
    ensure_writable_dir,
    fsync_dir,
    sweep_tmp,
    write_bytes_atomic,
    write_json_atomic,
)
from imgprep.groundtruth import load_ground_truth, resolve_labels
from imgprep.index import index_shards, layout_path, save_layout
from imgprep.manifest import (
    SHARD_NAME_RE,
    Manifest,
    ShardEntry,
    manifest_path,
    sha256_file,
    write_manifest,
)
from imgprep.sources import Listing, SourceReader, list_source
from imgprep.synsets import ClassTable, load_class_table
from imgprep.transform import TransformOptions, center_pixels, channel_sums, convert_image
from imgprep.world import World
from imgprep.writers import ShardWriter, write_list_image

OUTPUT_FORMATS = ("shards", "list")
RANK_MODES = ("shared", "partition")
WAIT_POLL_S = 0.5
LIST_CHUNK = 1000
RECORD_VERSION = 1  # bump when a task record's meaning changes: old records are then redone
STATS_EVERY = 4  # per-channel mean/std from every 4th image in key order (1/4 the cost)
STATE_DIR = ".imgprep"
Progress = Callable[[int], None]


@dataclass(frozen=True)
class ConvertOptions:
    """Everything ``imgprep convert`` needs; the output is a pure function of these."""

    input: Path
    out: Path
    format: str = "shards"
    split: str | None = None
    labels: tuple[Path, ...] = ()
    classes: Path | None = None
    transform: TransformOptions = field(default_factory=TransformOptions)
    shard_size: int = 1250
    num_shards: int | None = None
    seed: int = 0
    workers: int = 1
    max_errors: int = 0
    meta: bool = True
    mode: str = "shared"
    wait_timeout: float = 3600.0


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

    @property
    def state_dir(self) -> Path:
        return self.opts.out / STATE_DIR / self.split

    def record_path(self, task: Task) -> Path:
        return self.state_dir / f"{task.name}.json"

    def mean_path(self, task: Task) -> Path:
        return self.state_dir / f"{task.name}.mean.npy"

    @property
    def wants_mean_image(self) -> bool:
        return self.opts.format == "list" and self.split == "train"


@dataclass
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
    errors: list[dict[str, str]] = field(default_factory=list)
    files: list[list[Any]] = field(default_factory=list)
    resumed: bool = False


def infer_split(listing: Listing, has_labels: bool) -> str:
    """``val`` when ground truth is given or every key is a validation name, else ``train``."""
    if has_labels:
        return "val"
    if len(listing) and all(bytes(k).startswith(b"ILSVRC2012_val_") for k in listing.key):
        return "val"
    return "train"


def plan_tasks(n: int, opts: ConvertOptions, split: str) -> tuple[Task, ...]:
    """Shards: a seeded permutation cut into near-equal parts. Lists: key order in chunks."""
    if opts.format == "list":
        return tuple(
            Task(i, f"{split}-chunk-{i:06d}", np.arange(s, min(s + LIST_CHUNK, n)))
            for i, s in enumerate(range(0, n, LIST_CHUNK))
        )
    count = opts.num_shards or max(1, math.ceil(n / opts.shard_size))
    count = min(count, max(n, 1))
    perm = np.random.default_rng(opts.seed).permutation(n)
    return tuple(
        Task(i, f"{split}-{i:06d}.tar", part) for i, part in enumerate(np.array_split(perm, count))
    )


def _fingerprint(opts: ConvertOptions, split: str, listing: Listing, labels: np.ndarray,
                 classes: ClassTable) -> str:
    h = hashlib.sha256()
    h.update(f"imgprep {__version__} records {RECORD_VERSION}".encode())
    h.update(json.dumps(_options_json(opts, split), sort_keys=True).encode())
    h.update(json.dumps(classes.to_json()).encode())
    for arr in (listing.key, listing.size, labels):
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def _options_json(opts: ConvertOptions, split: str) -> dict[str, Any]:
    """The options that decide the output bytes (not paths, worker counts or error policy)."""
    return {
        "format": opts.format, "split": split, "seed": opts.seed, "meta": opts.meta,
        "shard_size": opts.shard_size, "num_shards": opts.num_shards,
        "transform": asdict(opts.transform),
    }


def make_plan(opts: ConvertOptions) -> Plan:
    """List the source, label every image and cut the work into tasks (no image is decoded)."""
    if opts.format not in OUTPUT_FORMATS:
        raise ValueError(f"format must be one of {OUTPUT_FORMATS}")
    classes = load_class_table(opts.classes)
    listing = list_source(opts.input)
    truth = load_ground_truth(opts.labels, classes) if opts.labels else None
    labels = resolve_labels(listing, classes, truth)
    split = opts.split or infer_split(listing, bool(opts.labels))
    tasks = plan_tasks(len(listing), opts, split)
    return Plan(opts, split, listing, labels, classes, tasks,
                _fingerprint(opts, split, listing, labels, classes))


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


def _die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this worker when the parent dies (a kill -9 leaves no orphans).
    A parent killed between fork and this call is caught by the parent-pid check."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _worker_main(plan: Plan, tasks: Any, results: Any, counts: Any, k: int,
                 parent: int) -> None:
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def tick() -> None:  # this worker's own slot: no lock that a killed worker could hold
        counts[k] += 1

    while True:
        index = tasks.get()
        if index is None:
            return
        try:
            results.put(("ok", run_task(plan, plan.tasks[index], tick)))
        except ImgprepError as e:
            results.put(("error", index, e))
        except Exception as e:  # a bug: ship the traceback to the parent, which re-raises
            results.put(("bug", index, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_tasks(plan: Plan, todo: Sequence[Task], workers: int,
              progress: Progress | None = None) -> list[TaskResult]:
    """Run ``todo`` on ``workers`` forked processes (in-process when 1); results unordered."""
    report = progress or (lambda n: None)
    if workers <= 1 or len(todo) <= 1:
        return [run_task(plan, t, lambda: report(1)) for t in todo]
    ctx = mp.get_context("fork")
    counts = ctx.Array("q", max(1, workers), lock=False)
    tasks_q, results_q = ctx.Queue(), ctx.Queue()
    for t in todo:
        tasks_q.put(t.index)
    n_procs = min(workers, len(todo))
    for _ in range(n_procs):
        tasks_q.put(None)
    procs = [ctx.Process(target=_worker_main, name=f"imgprep-convert-{k}", daemon=True,
                         args=(plan, tasks_q, results_q, counts, k, os.getpid()))
             for k in range(n_procs)]
    for p in procs:
        p.start()
    out: list[TaskResult] = []
    seen = 0
    try:
        while len(out) < len(todo):
            try:
                msg = results_q.get(timeout=0.2)
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead or all(p.exitcode is not None for p in procs):
                    code = dead[0].exitcode if dead else 0
                    raise ImgprepError(
                        f"a convert worker died (exit code {code}) with {len(todo) - len(out)} "
                        "tasks unfinished; rerun the same command to resume"
                    ) from None
            else:
                if msg[0] == "ok":
                    out.append(msg[1])
                elif msg[0] == "error":
                    raise msg[2]
                else:
                    raise RuntimeError(f"convert worker failed on task {msg[1]}: {msg[2]}")
            now = sum(counts)
            if now > seen:
                report(now - seen)
                seen = now
    finally:
        for p in procs:
            if p.is_alive() and len(out) < len(todo):
                p.terminate()
        for p in procs:
            p.join(timeout=10)
    now = sum(counts)
    if now > seen:
        report(now - seen)
    return out


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
              node: dict[str, Any] | None = None) -> tuple[Path | None, Path | None, int]:
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
        mean=mean, std=std, options={**_options_json(opts, split), "fingerprint": plan.fingerprint},
        tool_version=__version__, shards=shards, list_file=list_file, list_sha256=list_sha,
        errors=len(errors), error_log=log.name if errors else None,
        stats_images=sum(r.stats_images for r in results), node=node, index=index,
        source={"kind": lst.kind, "name": Path(lst.root).name, "images": len(lst),
                "skipped_non_images": lst.skipped},
    )
    return write_manifest(out, manifest), (log if errors else None), len(errors)


def _drop_stale_manifest(plan: Plan) -> None:
    """A manifest from a run with other inputs or options no longer describes the folder."""
    path = manifest_path(plan.opts.out, plan.split)
    try:
        old = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        old = None
    if isinstance(old, dict) and old.get("options", {}).get("fingerprint") == plan.fingerprint:
        return
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


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


def _node_info(plan: Plan, world: World, held: list[Task]) -> dict[str, Any] | None:
    if plan.opts.mode != "partition" or not world.is_distributed:
        return None
    # The whole set's shards with their planned sample counts: loaders on any node compute
    # every node's share from them (exact unless a node lost images to errors).
    return {"node_rank": world.node_rank, "num_nodes": world.num_nodes, "mode": "partition",
            "seed": plan.opts.seed, "shards": len(plan.tasks),
            "planned_samples": len(plan.listing),
            "all_shards": [[t.name, len(t.items)] for t in plan.tasks]}


def convert(opts: ConvertOptions, world: World | None = None, progress: Progress | None = None,
            on_plan: Callable[[Plan, int], None] | None = None) -> dict[str, Any]:
    """Run a conversion (resuming what a previous run finished); returns the summary.

    With a distributed ``world`` (launched by mpirun, srun or torchrun), every rank computes
    the same plan and converts only its share (``assigned_tasks``); rank 0 (in partition mode,
    each node's local rank 0) waits for the others' task records, then writes the manifest, so
    the output is byte-identical to a single-process run. ``on_plan(plan, remaining_images)``
    is called once the work is known (for a progress bar). The manifest is written only when
    errors <= ``opts.max_errors``; ``summary["complete"]`` says whether this rank's job is done.
    """
    world = world or World()
    if opts.mode not in RANK_MODES:
        raise ValueError(f"mode must be one of {RANK_MODES}")
    if opts.mode == "partition" and opts.format != "shards":
        raise OutputError("--mode partition writes node-local shards; use --format shards")
    t0 = time.perf_counter()
    check_out_not_input(opts)
    ensure_writable_dir(opts.out)
    plan = make_plan(opts)
    check_out_not_input(opts, plan.split)
    mine, held = assigned_tasks(plan, world)
    finaliser = _is_finaliser(opts, world)
    plan.state_dir.mkdir(parents=True, exist_ok=True)
    if finaliser:
        # Other ranks may be writing their tasks' temporary files right now: keep those.
        busy = {t.name for t in plan.tasks} if world.is_distributed else set()
        sweep_tmp(opts.out, busy)
        sweep_tmp(plan.state_dir, {f"{n}.json" for n in busy} | {f"{n}.mean.npy" for n in busy}
                  | {layout_path(plan.state_dir, n).name for n in busy})
        _drop_stale_manifest(plan)
        _drop_stale_outputs(plan, {t.name for t in held})
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
        if opts.mode == "partition" and world.node_rank != 0:
            listing_errors = []  # reported once, by node 0
        manifest, log, n_errors = _finalise(plan, results, listing_errors,
                                            _node_info(plan, world, held))
    seconds = time.perf_counter() - t0
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


