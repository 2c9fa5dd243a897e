"""Converting the tasks of a plan: each task's images in key order into its shard (or its
list images), then its record; on several workers, whole tasks or, with fewer tasks than
workers, parts of tasks put back together in order here.

A task's output depends on nothing but its own samples, so the bytes are the same for any
worker count: a task converted in parts is appended part by part in order, as one worker
would have written it.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from imgprep.convert import image, samples
from imgprep.convert.converted import center_pixels, sums_of_histogram
from imgprep.convert.errorlog import ErrorRecord, WarningRecord
from imgprep.convert.pool import part_cuts, run_pool
from imgprep.convert.records import write_record
from imgprep.convert.tasks import ListedImage, Plan, Task, TaskResult
from imgprep.errors import ImageError
from imgprep.fsutil import write_bytes_atomic
from imgprep.inputs.sources import SourceReader
from imgprep.shards.indexing import layout_path, save_layout
from imgprep.shards.manifest import ShardEntry
from imgprep.shards.writers import ShardWriter, write_list_image

STATS_EVERY = 4  # per-channel mean/std from every 4th image in key order (1/4 the cost)
PART_MIN = 16  # images in a part (fewer tasks than workers); smaller cost more to ship
Progress = Callable[[int], None]
Tick = Callable[[], None]


class Sample(NamedTuple):
    """One converted shard sample: its key and its members (``jpg``, ``cls``, ``json``)."""

    key: str
    fields: dict[str, bytes]


class _Slice(NamedTuple):
    """Items ``[lo, hi)`` of a task: the job one worker converts."""

    task: Task
    lo: int
    hi: int


@dataclass
class _Part:
    """What converting items ``[lo, hi)`` of a task gave: the encoded samples (shards; list
    images are written where they are converted), the files written, errors, statistics."""

    task: int
    lo: int
    samples: list[Sample] = field(default_factory=list)
    files: list[ListedImage] = field(default_factory=list)
    errors: list[ErrorRecord] = field(default_factory=list)
    warnings: list[WarningRecord] = field(default_factory=list)
    hist: np.ndarray = field(default_factory=lambda: np.zeros(768, dtype=np.int64))
    stats_images: int = 0
    mean: np.ndarray | None = None


def _convert_items(plan: Plan, piece: _Slice, tick: Tick,
                   sink: Callable[[Sample], None] | None) -> _Part:
    """Convert the items of ``piece``: each shard sample goes to ``sink`` (the shard, or the
    part's own list), each list image is written."""
    opts = plan.opts
    lst = plan.listing
    part = _Part(piece.task.index, piece.lo)
    size = opts.transform.size
    if plan.wants_mean_image:
        part.mean = np.zeros((size, size, 3), dtype=np.uint64)
    add = sink or part.samples.append
    items = piece.task.items[piece.lo:piece.hi]
    rows = zip(items.tolist(), plan.labels[items].tolist(), strict=True)
    with SourceReader(lst.containers) as reader:
        for i, label in rows:
            try:
                data = reader.read_item(lst, i)
                conv = image.convert_image(data, opts.transform,
                                           histogram=i % STATS_EVERY == 0,
                                           pixels=part.mean is not None)
            except (ImageError, OSError) as e:
                reason = str(e) if isinstance(e, ImageError) else f"cannot read: {e}"
                part.errors.append(ErrorRecord(source=f"{lst.root}/{lst.member_str(i)}",
                                               key=lst.key_str(i), reason=reason))
                tick()
                continue
            if conv.warning:
                part.warnings.append(WarningRecord(source=f"{lst.root}/{lst.member_str(i)}",
                                                   key=lst.key_str(i), warning=conv.warning))
            if conv.histogram is not None:
                part.hist += conv.histogram
                part.stats_images += 1
            if part.mean is not None and conv.pixels is not None:
                np.add(part.mean, center_pixels(conv.pixels, size), out=part.mean)
            if opts.format == "shards":
                add(Sample(lst.key_str(i), samples.shard_members(plan, i, conv)))
            else:
                rel = samples.list_path(plan, i)
                sha = write_list_image(opts.out / rel, conv.jpeg)
                part.files.append(ListedImage(rel, label if plan.labelled else None,
                                              len(conv.jpeg), sha))
            tick()
    return part


def _finish(plan: Plan, task: Task, parts: list[_Part], shard: ShardWriter | None) -> TaskResult:
    """The task's result from its parts (in order) and closed shard; writes its record."""
    if shard is not None:
        save_layout(layout_path(plan.state_dir, task.name), shard.layout(),
                    ShardEntry(task.name, shard.samples, shard.bytes, shard.sha256))
    elif plan.wants_mean_image:
        mean = sum((p.mean for p in parts if p.mean is not None), np.zeros(1, np.uint64))
        write_bytes_atomic(plan.mean_path(task), npy_bytes(mean))
    files = tuple(f for p in parts for f in p.files)  # label lists only
    res = TaskResult(
        index=task.index, name=task.name, fingerprint=plan.fingerprint,
        samples=shard.samples if shard is not None else len(files),
        bytes=shard.bytes if shard is not None else sum(f.bytes for f in files),
        sha256=shard.sha256 if shard is not None else "",
        sums=sums_of_histogram(np.sum([p.hist for p in parts], axis=0)).tolist(),
        stats_images=sum(p.stats_images for p in parts),
        errors=tuple(e for p in parts for e in p.errors), files=files,
        warnings=tuple(w for p in parts for w in p.warnings))
    write_record(plan, res)
    return res


def run_task(plan: Plan, task: Task, tick: Tick) -> TaskResult:
    """Convert one task's samples, streaming them into its shard, then write its record."""
    whole = _Slice(task, 0, len(task.items))
    if plan.opts.format != "shards":
        return _finish(plan, task, [_convert_items(plan, whole, tick, None)], None)
    with ShardWriter(plan.opts.out / task.name) as w:
        part = _convert_items(plan, whole, tick, lambda s: w.add(s.key, s.fields))
    return _finish(plan, task, [part], w)


def npy_bytes(arr: np.ndarray) -> bytes:
    """``arr`` as the bytes of a ``.npy`` file."""
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


class _Assembler:
    """Writes each task converted in parts as its parts arrive (in this process, while the
    workers convert the next ones): a part is appended once every part before it is in."""

    def __init__(self, plan: Plan, bounds: dict[int, list[int]]) -> None:
        self.plan = plan
        self.bounds = bounds
        self.waiting: dict[int, dict[int, _Part]] = {t: {} for t in bounds}
        self.done: dict[int, list[_Part]] = {t: [] for t in bounds}
        self.shards: dict[int, ShardWriter] = {}
        self.results: list[TaskResult] = []

    def take(self, part: _Part) -> None:
        t = part.task
        plan = self.plan
        self.waiting[t][part.lo] = part
        done = self.done[t]
        starts = self.bounds[t]
        while len(done) < len(starts) and starts[len(done)] in self.waiting[t]:
            p = self.waiting[t].pop(starts[len(done)])
            if plan.opts.format == "shards":
                if t not in self.shards:
                    self.shards[t] = ShardWriter(plan.opts.out / plan.tasks[t].name).__enter__()
                for sample in p.samples:
                    self.shards[t].add(sample.key, sample.fields)
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
    jobs: list[_Slice] = []
    bounds: dict[int, list[int]] = {}
    cut = part_cuts([len(t.items) for t in todo], workers, PART_MIN)
    for t, cuts in zip(todo, cut, strict=True):
        bounds[t.index] = cuts[:-1]
        jobs += [_Slice(t, lo, hi) for lo, hi in itertools.pairwise(cuts)]
    asm = _Assembler(plan, bounds)

    def job(k: int, tick: Tick) -> _Part:
        return _convert_items(plan, jobs[k], tick, None)

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
