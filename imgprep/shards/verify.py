"""``imgprep verify``: re-check a conversion against its manifest, or any Chainer label list.

Shards: size and sha256 against the manifest, sample count, every sample has one image
(``.jpg``, or stored pixels: ``.yuv420``, ``.rgb24``) and ``.cls``, labels in range, every
JPEG decodes to RGB at the converted size and every stored-pixel record is whole (its length
its header's) and of that size, no key twice; the
sample index the loaders read by is named by the manifest, matches it, and gives every
member where the shard's tar headers put it; where the manifest says so, each shard's DALI
index (``imgprep.shards.dali``) is the one the sample index and the shard's keys give.
Label lists: two tokens a line, path inside the root, label in range, file present and
decodable.

A folder is checked split by split, each against its manifest (``<split>.json``, written
last). A split that a run began there and did not finish (``imgprep.shards.folder``) is a
problem, reported first; when no split is finished there is nothing to check and the folder
is refused, as is one imgprep never wrote into, before any work starts.

The work is spread over ``workers`` processes: shards (or, when there are fewer shards than
workers, interleaved parts of each shard) and chunks of list lines. Every problem carries its
position, and the parent merges the results in input order, so the report is the same, line
for line, whatever the worker count.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

import numpy as np

from imgprep import imagefile
from imgprep.errors import (
    ImageError,
    ImgprepError,
    ManifestError,
    ShardError,
    UnsafeArchiveError,
)
from imgprep.fsutil import sha256_file
from imgprep.job.world import World
from imgprep.rawformat import image_member, record_problem
from imgprep.sections import TransformOptions
from imgprep.shards.dali import has_dali, idx_problem
from imgprep.shards.folder import Unfinished, folder_manifests
from imgprep.shards.index import fix_hint, read_index
from imgprep.shards.layout import Layout, LayoutBuilder
from imgprep.shards.manifest import (
    Manifest,
    ShardEntry,
    read_manifest,
)
from imgprep.shards.tario import iter_samples

Tick = Callable[[int], None]
J = TypeVar("J")
R = TypeVar("R")
END = 1 << 62  # position of a shard's closing problems (unreadable tail, wrong count)
LIST_CHUNK = 2000  # label-list lines per task
# What convert reads, for telling an input folder from an output one in messages.


class VerifyError(ImgprepError, RuntimeError):
    """A verify worker died (killed, out of memory): the check is incomplete."""


@dataclass
class VerifyReport:
    """What was checked and every problem found (empty ``problems`` means all is well)."""

    target: str
    checked: int = 0
    samples: int = 0
    problems: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)  # splits begun but not finished

    @property
    def ok(self) -> bool:
        return not self.problems


def _check_image(data: bytes, size: int, resize: str) -> str | None:
    """Why a converted image is not what convert writes, or None: its format, mode and size
    read from its header first, so a forged header is never decoded at the size it claims;
    then decoded whole (opened as ``imgprep.imagefile`` opens every image)."""
    try:
        img = imagefile.identify(data)
        w, h, mode, fmt = img.width, img.height, img.mode, img.format
        if fmt != "JPEG" or mode != "RGB":
            return f"is {fmt} {mode}, expected an RGB JPEG"
        if (resize == "center-crop" and (w, h) != (size, size)) or \
                (resize == "short-side" and min(w, h) != size):
            return f"is {w}x{h}, expected {resize} {size}"
        with imagefile.decoding(img):
            img.load()
    except ImageError as e:
        return f"does not decode ({e})"
    return None


def _parallel(fn: Callable[[J], R], jobs: Sequence[J], workers: int) -> Iterator[R]:
    """``fn`` over ``jobs`` in forked processes, results in job order; inline for one worker."""
    if workers <= 1 or len(jobs) <= 1:
        yield from map(fn, jobs)
        return
    ex = ProcessPoolExecutor(min(workers, len(jobs)), mp_context=mp.get_context("fork"))
    try:
        futures: list[Future[R]] = [ex.submit(fn, j) for j in jobs]
        for f in futures:
            try:
                yield f.result()
            except BrokenProcessPool as e:
                raise VerifyError(
                    "a verify worker died (killed or out of memory): the check is incomplete; "
                    "rerun imgprep verify, with fewer --workers if memory is short") from e
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------------------------------ shards


@dataclass(frozen=True)
class _ShardJob:
    folder: Path
    entry: ShardEntry
    part: int  # this job checks samples i with i % parts == part; part 0 also the whole file
    parts: int
    size: int
    resize: str
    n_classes: int
    decode: bool
    layout: Layout | None = None  # part 0: the shard's layout as the sample index gives it
    dali: bool = False  # part 0: check the shard's DALI index
    labelled: bool = True  # False: an unlabelled split, whose samples have no .cls


@dataclass
class _ShardResult:
    problems: list[tuple[int, int, str]] = field(default_factory=list)  # (sample, seq, message)
    keys: list[str] = field(default_factory=list)  # part 0: every key, in order
    count: int = 0
    checked: int = 0  # samples this part looked at
    void: bool = False  # part 0: the file itself is wrong, so sample checks do not count


def _file_problem(job: _ShardJob) -> str | None:
    s, path = job.entry, job.folder / job.entry.name
    if not path.is_file():
        return f"{s.name}: missing; restore it or reconvert"
    if (nbytes := path.stat().st_size) != s.bytes:
        return f"{s.name}: {nbytes} bytes, manifest says {s.bytes}"
    if job.part == 0 and sha256_file(path) != s.sha256:
        return f"{s.name}: sha256 differs from the manifest (corrupt copy)"
    return None


def _sample_problems(job: _ShardJob, key: str, fields: dict[str, bytes]) -> list[str]:
    where = f"{job.entry.name}:{key}"
    image = image_member(fields)
    if image is None or ("cls" in fields) != job.labelled:
        need = "jpg and cls" if job.labelled else "jpg and no cls (the split is unlabelled)"
        return [f"{where}: has {sorted(fields)}, needs {need} (or one of yuv420, rgb24: "
                "stored pixels, in place of jpg)"]
    out = []
    try:
        label = int(fields["cls"]) if job.labelled else 0
    except ValueError:
        label = -1
    if not 0 <= label < job.n_classes:
        out.append(f"{where}: label {fields['cls']!r} outside 0..{job.n_classes - 1}")
    check = _check_image if image == "jpg" else record_problem
    if job.decode and (why := check(fields[image], job.size, job.resize)):
        out.append(f"{where}.{image} {why}")
    return out


def _check_shard(job: _ShardJob) -> _ShardResult:
    res = _ShardResult()
    if why := _file_problem(job):
        res.void = True
        if job.part == 0:
            res.problems.append((-1, 0, why))
        return res
    seq = 0
    built = LayoutBuilder() if job.part == 0 and (job.layout is not None or job.dali) else None
    try:
        for i, (key, fields) in enumerate(iter_samples(job.folder / job.entry.name,
                                                       built.add if built else None)):
            res.count += 1
            if job.part == 0:
                res.keys.append(key)
            if i % job.parts != job.part:
                continue
            res.checked += image_member(fields) is not None and ("cls" in fields) == job.labelled
            for p in _sample_problems(job, key, fields):
                seq += 1
                res.problems.append((i, seq, p))
    except (ShardError, UnsafeArchiveError) as e:
        if job.part == 0:
            res.problems.append((END, 0, f"{job.entry.name}: unreadable ({e})"))
    else:
        if built is not None and job.layout is not None and (why := _layout_problem(
                job.entry.name, built.layout(), job.layout, job.folder)):
            res.problems.append((END, 2, why))
        if built is not None and job.dali and (why := idx_problem(
                job.folder, job.entry.name, built.layout(), job.layout)):
            res.problems.append((END, 3, why))
    if job.part == 0 and res.count != job.entry.samples:
        res.problems.append((END, 1, f"{job.entry.name}: {res.count} samples, manifest says "
                                     f"{job.entry.samples}"))
    return res


def _layout_problem(name: str, got: Layout, want: Layout, folder: Path) -> str | None:
    """Where the sample index and the shard's tar headers first disagree, if they do."""
    if got.samples != want.samples or not np.array_equal(got.counts, want.counts):
        n = min(got.samples, want.samples)
        differ = np.flatnonzero(got.counts[:n] != want.counts[:n])
        at = int(differ[0]) if len(differ) else n
        return (f"{name}: the sample index gives {want.samples} samples, the tar groups its "
                f"members into {got.samples} (first difference at sample {at}); "
                f"{fix_hint(folder)}")
    got_ext, want_ext = np.asarray(got.exts)[got.ext], np.asarray(want.exts)[want.ext]
    bad = np.flatnonzero((got.offset != want.offset) | (got.size != want.size)
                         | (got_ext != want_ext))
    if not len(bad):
        return None
    k = int(bad[0])
    sample = int(np.searchsorted(np.cumsum(got.counts), k, side="right"))
    return (f"{name}: sample {sample}: the sample index puts its .{want_ext[k]} at byte "
            f"{int(want.offset[k])} ({int(want.size[k])} bytes), the tar at byte "
            f"{int(got.offset[k])} ({int(got.size[k])} bytes, .{got_ext[k]}); loaders would "
            f"read the wrong bytes; {fix_hint(folder)}")


def _index_layouts(folder: Path, m: Manifest) -> tuple[dict[str, Layout], str | None]:
    """Each shard's layout as the sample index gives it, or why the index cannot be used."""
    try:
        idx = read_index(folder, m)
    except ManifestError as e:
        return {}, str(e)
    return {s.name: idx.layout_of(s.name) for s in m.shards}, None


def verify_shards(folder: Path, m: Manifest, decode: bool, tick: Tick,
                  workers: int = 1) -> VerifyReport:
    """Check every shard of ``m`` in ``folder`` with ``workers`` processes, and the sample
    index against the manifest and each shard's tar headers."""
    rep = VerifyReport(str(folder / f"{m.split}.json"))
    size, resize = m.options.transform.size, m.options.transform.resize
    parts = max(1, -(-workers // max(len(m.shards), 1))) if decode else 1
    layouts, index_problem = _index_layouts(folder, m)
    jobs = [_ShardJob(folder, s, k, parts, size, resize, len(m.classes), decode,
                      layouts.get(s.name) if k == 0 else None, k == 0 and has_dali(m), m.labelled)
            for s in m.shards for k in range(parts)]
    seen: set[str] = set()
    shard_parts: list[_ShardResult] = []
    for job, res in zip(jobs, _parallel(_check_shard, jobs, workers), strict=True):
        tick(res.checked)
        shard_parts.append(res)
        if job.part == job.parts - 1:
            _merge_shard(rep, job.entry, shard_parts, seen)
            shard_parts = []
    if rep.samples != m.total_samples and not rep.problems:
        rep.problems.append(f"{rep.samples} samples in all, manifest says {m.total_samples}")
    if index_problem is not None:
        rep.problems.append(index_problem)
    return rep


def _merge_shard(rep: VerifyReport, s: ShardEntry, parts: list[_ShardResult],
                 seen: set[str]) -> None:
    rep.checked += 1
    head = parts[0]
    if head.void:
        rep.problems.extend(p for _, _, p in head.problems)
        return
    found = [p for r in parts for p in r.problems]
    for i, key in enumerate(head.keys):
        if key in seen:
            found.append((i, -1, f"{s.name}:{key}: key appears in more than one place"))
        seen.add(key)
    rep.problems.extend(p for _, _, p in sorted(found))
    rep.samples += head.count


# ------------------------------------------------------------------------------- label lists


@dataclass(frozen=True)
class _ListJob:
    list_name: str
    root: Path
    first_line: int
    lines: tuple[str, ...]
    n_classes: int
    size: int
    resize: str
    decode: bool
    labelled: bool = True  # False: 'path' lines of an unlabelled split


def _check_lines(job: _ListJob) -> tuple[list[str], int]:
    """(problems, readable entries) of one chunk of a label list."""
    problems: list[str] = []
    readable = 0
    root_r = job.root.resolve()
    for n, line in enumerate(job.lines, job.first_line):
        where = f"{job.list_name}:{n}"
        tokens = line.split()
        if len(tokens) != 1 + job.labelled:
            want = "'path label'" if job.labelled else "'path' (the split is unlabelled)"
            problems.append(f"{where}: {len(tokens)} tokens, expected {want}")
            continue
        rel, lab = tokens[0], tokens[1] if job.labelled else "0"
        if not lab.lstrip("-").isdigit() or not 0 <= int(lab) < job.n_classes:
            problems.append(f"{where}: label {lab!r} outside 0..{job.n_classes - 1}")
        path = (job.root / rel).resolve()
        if root_r not in path.parents:
            problems.append(f"{where}: {rel} points outside {job.root}")
            continue
        try:
            img = path.read_bytes()
        except OSError as e:
            problems.append(f"{where}: {rel} cannot be read ({e.strerror})")
            continue
        if job.decode and (why := _check_image(img, job.size, job.resize)):
            problems.append(f"{where}: {rel} {why}")
        readable += 1
    return problems, readable


def verify_list(list_file: Path, root: Path, n_classes: int, decode: bool, tick: Tick,
                transform: TransformOptions | None = None,
                expected_sha256: str | None = None, workers: int = 1,
                labelled: bool = True) -> VerifyReport:
    """Check a Chainer/Caffe ``path label`` file as LabeledImageDataset would read it (not
    ``labelled``: a ``path`` file, as ImageDataset would), its images as ``transform`` makes
    them (default: convert's default transform, for a list without a manifest)."""
    t = transform or TransformOptions()
    rep = VerifyReport(str(list_file))
    try:
        data = list_file.read_bytes()
    except OSError as e:
        rep.problems.append(f"{list_file}: cannot read ({e.strerror})")
        return rep
    if expected_sha256 and hashlib.sha256(data).hexdigest() != expected_sha256:
        rep.problems.append(f"{list_file.name}: sha256 differs from the manifest")
    lines = data.decode("utf-8", errors="replace").splitlines()
    chunk = max(1, min(LIST_CHUNK, -(-len(lines) // max(1, 4 * workers))))
    jobs = [_ListJob(list_file.name, root, k + 1, tuple(lines[k:k + chunk]), n_classes, t.size,
                     t.resize, decode, labelled) for k in range(0, len(lines), chunk)]
    for job, (problems, readable) in zip(jobs, _parallel(_check_lines, jobs, workers),
                                         strict=True):
        rep.checked += len(job.lines)
        rep.samples += readable
        rep.problems.extend(problems)
        tick(readable)
    return rep


# ------------------------------------------------------------------------- what to check


@dataclass(frozen=True)
class Target:
    """One thing to check: a split's manifest file, read, or a bare label list
    (``manifest`` None)."""

    path: Path
    manifest: Manifest | None = None


@dataclass(frozen=True)
class VerifyPlan:
    """What ``verify`` will check and the unfinished splits it will report; made before any
    work (or progress bar) starts, so that a folder with nothing to check fails at once."""

    targets: tuple[Target, ...]
    unfinished: tuple[Unfinished, ...] = ()

    @property
    def total(self) -> int | None:
        """Samples the check will tick through (None when a bare list's is unknown)."""
        if any(t.manifest is None for t in self.targets):
            return None
        return sum(t.manifest.total_samples for t in self.targets if t.manifest is not None)


def plan_verify(path: Path, split: str | None = None) -> VerifyPlan:
    """What ``verify`` checks in ``path`` (a folder, a manifest file or a label list), read
    and validated up front. Raises ManifestError when there is nothing finished to check."""
    if path.is_file() and path.suffix == ".txt":
        return VerifyPlan((Target(path),))
    if not path.is_dir():
        manifest = path if split is None else path / f"{split}.json"
        return VerifyPlan((Target(manifest, read_manifest(manifest)),))
    paths, unfinished = folder_manifests(path, split)
    targets = tuple(Target(p, read_manifest(p)) for p in paths)
    finished = " or ".join(f"--split {t.manifest.split}" for t in targets if t.manifest)
    return VerifyPlan(targets, tuple(
        replace(u, todo=f"{u.todo}; or check only the finished splits with {finished}")
        for u in unfinished))


# ------------------------------------------------------------------------------- entry point


def run_verify(plan: VerifyPlan, decode: bool = True, tick: Tick = lambda n: None,
               workers: int | None = None) -> VerifyReport:
    """Check every target of ``plan`` with ``workers`` processes (default: every core this
    process may use); its unfinished splits come first among the problems. The report does
    not depend on the worker count."""
    w = workers or World.single().cores_per_rank()
    reports = [_verify_target(t, decode, tick, w) for t in plan.targets]
    rep = reports[0] if len(reports) == 1 else VerifyReport(
        ", ".join(r.target for r in reports), sum(r.checked for r in reports),
        sum(r.samples for r in reports), [p for r in reports for p in r.problems])
    rep.problems[:0] = [u.problem for u in plan.unfinished]
    rep.unfinished = [u.split for u in plan.unfinished]
    return rep


def verify(path: Path, split: str | None = None, decode: bool = True,
           tick: Tick = lambda n: None, workers: int | None = None) -> VerifyReport:
    """Verify a converted folder (every split's manifest, or ``split``'s) or a label-list file;
    a split left unfinished in the folder is a problem. Raises ManifestError when nothing
    finished is there to check (see ``folder_manifests``)."""
    return run_verify(plan_verify(path, split), decode, tick, workers)


def _verify_target(target: Target, decode: bool, tick: Tick, workers: int) -> VerifyReport:
    path, m = target.path, target.manifest
    if m is None:
        return verify_list(path, path.parent, 1000, decode, tick, workers=workers)
    folder = path.parent
    if m.format == "shards":
        return verify_shards(folder, m, decode, tick, workers)
    rep = verify_list(folder / (m.list_file or f"{m.split}.txt"), folder, len(m.classes), decode,
                      tick, m.options.transform, m.list_sha256, workers, m.labelled)
    if rep.samples != m.total_samples:
        rep.problems.append(f"{rep.samples} readable entries, manifest says {m.total_samples}")
    return rep
