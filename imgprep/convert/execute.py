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
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

from imgprep.convert import image, samples, store
from imgprep.convert.converted import Converted, center_pixels, sums_of_histogram
from imgprep.convert.errorlog import ErrorRecord, WarningRecord
from imgprep.convert.pool import part_cuts, run_pool
from imgprep.convert.records import write_record
from imgprep.convert.tasks import ListedImage, Plan, Task, TaskResult
from imgprep.errors import ImageError, ImgprepError
from imgprep.fsutil import piece_name, tmp_name, write_bytes_atomic
from imgprep.inputs.sources import SourceReader
from imgprep.shards.indexing import layout_path, save_layout
from imgprep.shards.layout import Layout
from imgprep.shards.manifest import ShardEntry
from imgprep.shards.writers import ShardWriter, write_list_image

STATS_EVERY = 4  # per-channel mean/std from every 4th image in key order (1/4 the cost)
CHUNK = 16  # items read together, on a thread, while the chunk before converts
READ_AHEAD = 2  # chunks read ahead
PART_MIN = 16  # images in a part (fewer tasks than workers); smaller cost more to ship
Progress = Callable[[int], None]
Outcome = Converted | ImgprepError | OSError  # an item converted, or why not
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
    """What converting items ``[lo, hi)`` of a task gave: the shard piece written (or, in one
    process, the encoded samples; list images are written where they are converted), the
    files written, errors, statistics."""

    task: int
    lo: int
    samples: list[Sample] = field(default_factory=list)
    piece: tuple[Path, Layout] | None = None  # the shard piece a worker wrote, its layout
    files: list[ListedImage] = field(default_factory=list)
    errors: list[ErrorRecord] = field(default_factory=list)
    warnings: list[WarningRecord] = field(default_factory=list)
    hist: np.ndarray = field(default_factory=lambda: np.zeros(768, dtype=np.int64))
    stats_images: int = 0
    mean: np.ndarray | None = None


def _convert_items(plan: Plan, piece: _Slice, tick: Tick,
                   sink: Callable[[Sample], None] | None, read_ahead: bool) -> _Part:
    """Convert the items of ``piece``: each shard sample goes to ``sink`` (the shard, or the
    part's own list), each list image is written. Items are read ``CHUNK`` at a time; with
    ``read_ahead`` (a core to spare) a thread reads the next chunks while this one converts,
    so that a file server's latency and the copy are off the conversion's path."""
    part = _Part(piece.task.index, piece.lo)
    if plan.wants_mean_image:
        size = plan.opts.transform.size
        part.mean = np.zeros((size, size, 3), dtype=np.uint64)
    add = sink or part.samples.append
    items = piece.task.items[piece.lo:piece.hi].tolist()
    chunks = [items[at:at + CHUNK] for at in range(0, len(items), CHUNK)]
    with SourceReader(plan.listing.containers) as reader, \
            ThreadPoolExecutor(1, thread_name_prefix="imgprep-read") as pool:
        ahead = READ_AHEAD if read_ahead else 0
        reads = deque(pool.submit(_read_chunk, reader, plan, c) for c in chunks[:ahead])
        for k, chunk in enumerate(chunks):
            read = reads.popleft().result() if ahead else _read_chunk(reader, plan, chunk)
            if ahead and k + ahead < len(chunks):
                reads.append(pool.submit(_read_chunk, reader, plan, chunks[k + ahead]))
            for i, data in zip(chunk, read, strict=True):
                _emit(plan, part, i, _convert(plan, i, data), add)
                tick()
    return part


def _read_chunk(reader: SourceReader, plan: Plan, chunk: list[int]) -> list[bytes | Outcome]:
    """The bytes of each item of ``chunk``, or why they cannot be read."""
    out: list[bytes | Outcome] = []
    for i in chunk:
        try:
            out.append(reader.read_item(plan.listing, i))
        except (ImageError, OSError) as e:
            out.append(e)
    return out


def _convert(plan: Plan, i: int, data: bytes | Outcome) -> Outcome:
    if not isinstance(data, bytes):
        return data
    opts = plan.opts
    try:
        conv = image.convert_image(data, opts.transform, histogram=i % STATS_EVERY == 0,
                                   pixels=plan.wants_mean_image)
        if opts.store.stored:  # the JPEG's pixels kept instead (imgprep.convert.store)
            conv = replace(conv, image=store.image_member(
                opts.store, plan.listing.key_str(i), conv.jpeg, opts.transform.max_pixels))
        return conv
    except (ImageError, OSError) as e:
        return e


def _emit(plan: Plan, part: _Part, i: int, conv: Outcome,
          add: Callable[[Sample], None]) -> None:
    """Item ``i``'s outcome into ``part``: its sample to ``add`` (or its list image written),
    its statistics, or its error."""
    lst = plan.listing
    if not isinstance(conv, Converted):
        reason = str(conv) if isinstance(conv, ImageError) else f"cannot read: {conv}"
        part.errors.append(ErrorRecord(source=f"{lst.root}/{lst.member_str(i)}",
                                       key=lst.key_str(i), reason=reason))
        return
    if conv.warning:
        part.warnings.append(WarningRecord(source=f"{lst.root}/{lst.member_str(i)}",
                                           key=lst.key_str(i), warning=conv.warning))
    if conv.histogram is not None:
        part.hist += conv.histogram
        part.stats_images += 1
    if part.mean is not None and conv.pixels is not None:
        np.add(part.mean, center_pixels(conv.pixels, plan.opts.transform.size), out=part.mean)
    if plan.opts.format == "shards":
        add(Sample(lst.key_str(i), samples.shard_members(plan, i, conv)))
    else:
        rel = samples.list_path(plan, i)
        sha = write_list_image(plan.opts.out / rel, conv.jpeg)
        label = int(plan.labels[i]) if plan.labelled else None
        part.files.append(ListedImage(rel, label, len(conv.jpeg), sha))


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


def run_task(plan: Plan, task: Task, tick: Tick, read_ahead: bool = False) -> TaskResult:
    """Convert one task's samples, streaming them into its shard, then write its record."""
    whole = _Slice(task, 0, len(task.items))
    if plan.opts.format != "shards":
        return _finish(plan, task, [_convert_items(plan, whole, tick, None, read_ahead)], None)
    with ShardWriter(plan.opts.out / task.name) as w:
        part = _convert_items(plan, whole, tick, lambda s: w.add(s.key, s.fields), read_ahead)
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
                if p.piece is not None:
                    self.shards[t].append_piece(*p.piece)
                for sample in p.samples:
                    self.shards[t].add(sample.key, sample.fields)
                p.samples, p.piece = [], None
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


def _run_parts(plan: Plan, todo: Sequence[Task], workers: int, progress: Progress | None,
               read_ahead: bool) -> list[TaskResult]:
    """Fewer tasks than workers: cut each task into parts that workers convert, each into a
    piece of its shard, and that this process joins in order, so the bytes are those of one
    worker per task."""
    jobs: list[_Slice] = []
    bounds: dict[int, list[int]] = {}
    cut = part_cuts([len(t.items) for t in todo], workers, PART_MIN)
    for t, cuts in zip(todo, cut, strict=True):
        bounds[t.index] = cuts[:-1]
        jobs += [_Slice(t, lo, hi) for lo, hi in itertools.pairwise(cuts)]
    asm = _Assembler(plan, bounds)

    def job(k: int, tick: Tick) -> _Part:
        piece = jobs[k]
        if plan.opts.format != "shards":
            return _convert_items(plan, piece, tick, None, read_ahead)
        path = piece_name(plan.opts.out / piece.task.name, piece.lo)
        with ShardWriter(path, piece=True) as w:
            part = _convert_items(plan, piece, tick, lambda s: w.add(s.key, s.fields),
                                  read_ahead)
        part.piece = (path, w.layout())
        return part

    try:
        run_pool(job, range(len(jobs)), workers, progress, asm.take)
    except BaseException as e:  # the workers are stopped: remove what they left
        asm.abort(e)
        for piece in jobs:
            path = piece_name(plan.opts.out / piece.task.name, piece.lo)
            path.unlink(missing_ok=True)
            tmp_name(path).unlink(missing_ok=True)
        raise
    return asm.results


def run_tasks(plan: Plan, todo: Sequence[Task], workers: int,
              progress: Progress | None = None, cores: int = 1) -> list[TaskResult]:
    """Run ``todo`` on ``workers`` forked processes (in-process when 1); results unordered.
    With fewer tasks than workers, the tasks are converted in parts (``_run_parts``). With
    more ``cores`` than workers, each worker reads ahead on a thread."""
    read_ahead = workers < cores
    if 1 < workers and len(todo) < workers:
        return _run_parts(plan, todo, workers, progress, read_ahead)
    return run_pool(lambda index, tick: run_task(plan, plan.tasks[index], tick, read_ahead),
                    [t.index for t in todo], workers, progress)
