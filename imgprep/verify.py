"""``imgprep verify``: re-check a conversion against its manifest, or any Chainer label list.

Shards: size and sha256 against the manifest, sample count, every sample has ``.jpg`` and
``.cls``, labels in range, every JPEG decodes to RGB at the converted size, no key twice; the
sample index the loaders read by is named by the manifest, matches it, and gives every
member where the shard's tar headers put it.
Label lists: two tokens a line, path inside the root, label in range, file present and
decodable.

A folder is checked split by split, each against its manifest (``<split>.json``, written
last). A split that a run began there and did not finish (``unfinished_split``: its state
folder ``.imgprep/<split>/``, temporary files, error log or staged shards, and no manifest) is
a problem, reported first; when no split is finished there is nothing to check and the folder
is refused, as is one imgprep never wrote into (``folder_manifests``), before any work starts.

The work is spread over ``workers`` processes: shards (or, when there are fewer shards than
workers, interleaved parts of each shard) and chunks of list lines. Every problem carries its
position, and the parent merges the results in input order, so the report is the same, line
for line, whatever the worker count.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import multiprocessing as mp
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from PIL import Image, UnidentifiedImageError

from imgprep import nodelock, outdir
from imgprep.errors import ImgprepError, ManifestError, ShardError, UnsafeArchiveError
from imgprep.fsutil import TMP_PREFIX
from imgprep.index import Layout, LayoutBuilder, fix_hint, read_index
from imgprep.manifest import (
    SHARD_NAME_RE,
    SPLITS,
    Manifest,
    ShardEntry,
    find_manifests,
    manifest_path,
    read_manifest,
    sha256_file,
)
from imgprep.shardio import iter_samples
from imgprep.world import World

Tick = Callable[[int], None]
J = TypeVar("J")
R = TypeVar("R")
END = 1 << 62  # position of a shard's closing problems (unreadable tail, wrong count)
LIST_CHUNK = 2000  # label-list lines per task
# What convert reads, for telling an input folder from an output one in messages.
INPUT_SUFFIXES = {".tar", ".jpeg", ".jpg", ".png"}
WNID_OR_SPLIT = re.compile(r"^(n\d{8}|train|val|validation)$", re.IGNORECASE)


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
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            w, h, mode, fmt = img.width, img.height, img.mode, img.format
    except UnidentifiedImageError:
        return "does not decode (not an image file)"
    except (OSError, SyntaxError, ValueError) as e:
        return f"does not decode ({e})"
    if fmt != "JPEG" or mode != "RGB":
        return f"is {fmt} {mode}, expected an RGB JPEG"
    if (resize == "center-crop" and (w, h) != (size, size)) or \
            (resize == "short-side" and min(w, h) != size):
        return f"is {w}x{h}, expected {resize} {size}"
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
    if "jpg" not in fields or "cls" not in fields:
        return [f"{where}: has {sorted(fields)}, needs jpg and cls"]
    out = []
    try:
        label = int(fields["cls"])
    except ValueError:
        label = -1
    if not 0 <= label < job.n_classes:
        out.append(f"{where}: label {fields['cls']!r} outside 0..{job.n_classes - 1}")
    if job.decode and (why := _check_image(fields["jpg"], job.size, job.resize)):
        out.append(f"{where}.jpg {why}")
    return out


def _check_shard(job: _ShardJob) -> _ShardResult:
    res = _ShardResult()
    if why := _file_problem(job):
        res.void = True
        if job.part == 0:
            res.problems.append((-1, 0, why))
        return res
    seq = 0
    built = LayoutBuilder() if job.part == 0 and job.layout is not None else None
    try:
        for i, (key, fields) in enumerate(iter_samples(job.folder / job.entry.name,
                                                       built.add if built else None)):
            res.count += 1
            if job.part == 0:
                res.keys.append(key)
            if i % job.parts != job.part:
                continue
            res.checked += "jpg" in fields and "cls" in fields
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
    t = m.options.get("transform", {})
    size, resize = int(t.get("size", 256)), str(t.get("resize", "center-crop"))
    parts = max(1, -(-workers // max(len(m.shards), 1))) if decode else 1
    layouts, index_problem = _index_layouts(folder, m)
    jobs = [_ShardJob(folder, s, k, parts, size, resize, len(m.classes), decode,
                      layouts.get(s.name) if k == 0 else None)
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


def _check_lines(job: _ListJob) -> tuple[list[str], int]:
    """(problems, readable entries) of one chunk of a label list."""
    problems: list[str] = []
    readable = 0
    root_r = job.root.resolve()
    for n, line in enumerate(job.lines, job.first_line):
        where = f"{job.list_name}:{n}"
        tokens = line.split()
        if len(tokens) != 2:
            problems.append(f"{where}: {len(tokens)} tokens, expected 'path label'")
            continue
        rel, lab = tokens
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
                size: int = 256, resize: str = "center-crop",
                expected_sha256: str | None = None, workers: int = 1) -> VerifyReport:
    """Check a Chainer/Caffe ``path label`` file as LabeledImageDataset would read it."""
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
    jobs = [_ListJob(list_file.name, root, k + 1, tuple(lines[k:k + chunk]), n_classes, size,
                     resize, decode) for k in range(0, len(lines), chunk)]
    for job, (problems, readable) in zip(jobs, _parallel(_check_lines, jobs, workers),
                                         strict=True):
        rep.checked += len(job.lines)
        rep.samples += readable
        rep.problems.extend(problems)
        tick(readable)
    return rep


# ------------------------------------------------------------------------- what to check


@dataclass(frozen=True)
class Unfinished:
    """A split that a convert (or stage-to-node) run began in ``folder`` and did not finish:
    no ``<split>.json``, but ``seen`` (its state folder, temporary files, error log or
    shards); ``todo`` says what to do."""

    split: str
    folder: Path
    seen: str
    todo: str

    @property
    def problem(self) -> str:
        return f"the {self.split} split in {self.folder} is unfinished ({self.seen}): {self.todo}"


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


def _counted(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def unfinished_split(folder: Path, split: str) -> Unfinished | None:
    """``split`` in ``folder`` when a run began it there and wrote no ``<split>.json``.

    A convert run makes the state folder ``.imgprep/<split>/`` before converting anything and
    leaves a task record there for each shard or list chunk it finishes; every file goes
    through a ``.tmp-`` name; a run stopped by too many bad images leaves
    ``<split>-errors.jsonl`` and no manifest. stage-to-node keeps its state in
    ``.imgprep-stage/`` and writes the manifest after the shards.
    """
    mpath = manifest_path(folder, split)
    if mpath.exists() or mpath.is_symlink():
        return None
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return None
    state = folder / outdir.STATE_DIR / split
    staged = nodelock.state_dir(folder).is_dir()
    temps = [n for n in names
             if n.startswith(TMP_PREFIX) and outdir.split_owns(split, n[len(TMP_PREFIX):])]
    shards = [n for n in names if SHARD_NAME_RE.match(n) and outdir.split_owns(split, n)]
    log = f"{split}-errors.jsonl"
    if not (state.is_dir() or temps or log in names or (staged and shards)):
        return None
    seen = []
    if state.is_dir():
        records = len(list(state.glob("*.json")))
        seen.append(f"{_counted(records, 'task record')} in {outdir.STATE_DIR}/{split}/"
                    if records else f"{outdir.STATE_DIR}/{split}/ with no task finished")
    if shards:
        seen.append(_counted(len(shards), "shard"))
    if temps:
        seen.append(_counted(len(temps), "temporary file"))
    if log in names:
        seen.append(f"the error log {log}")
    if log in names and state.is_dir():
        todo = (f"the last run stopped with more bad images than --max-errors allows (listed in "
                f"{log}); rerun the imgprep convert command that wrote it with a larger "
                "--max-errors, or fix those images first")
    elif state.is_dir():
        todo = "rerun the imgprep convert command that wrote it (it resumes where it stopped)"
    elif staged:
        todo = "rerun imgprep stage-to-node (it resumes where it stopped)"
    else:
        todo = "rerun the imgprep command that wrote it (it resumes where it stopped)"
    return Unfinished(split, folder, f"{', '.join(seen)}; no {mpath.name}", todo)


def _nested(folder: Path, limit: int = 3) -> list[Path]:
    """Folders just below ``folder`` that hold a manifest (where the user may have meant)."""
    found: list[Path] = []
    try:
        subdirs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return found
    for d in subdirs:
        if any(manifest_path(d, s).is_file() for s in SPLITS):
            found.append(d)
            if len(found) == limit:
                break
    return found


def _looks_like_input(folder: Path) -> bool:
    """Whether ``folder`` holds what convert reads: tars, images, class or split folders."""
    try:
        entries = list(itertools.islice(folder.iterdir(), 10_000))
    except OSError:
        return False
    return any(p.suffix.lower() in INPUT_SUFFIXES or (WNID_OR_SPLIT.match(p.name) and p.is_dir())
               for p in entries)


def _label_lists(folder: Path) -> list[Path]:
    """``*.txt`` files in ``folder`` that read as Chainer lists: 'path label' lines whose
    first path is there."""
    found = []
    for p in sorted(folder.glob("*.txt")):
        with contextlib.suppress(OSError, UnicodeDecodeError), open(p, encoding="utf-8") as f:
            tokens = f.readline().split()
            if len(tokens) == 2 and tokens[1].isdigit() and (folder / tokens[0]).is_file():
                found.append(p)
    return found


def not_converted(folder: Path, command: str) -> ManifestError:
    """The error for a folder that holds no imgprep output at all, finished or not: what it
    is, what imgprep looked for, and what to do (``command``: the one that was run)."""
    if nodelock.state_dir(folder).is_dir():
        return ManifestError(
            f"no manifest in {folder}: stage-to-node began there and did not finish "
            f"({nodelock.STATE_DIR}/ is there, no shard yet); rerun imgprep stage-to-node (it "
            "resumes where it stopped)")
    if (folder / outdir.STATE_DIR).is_dir():
        return ManifestError(
            f"no manifest in {folder}: a conversion began there and did not finish "
            f"({outdir.STATE_DIR}/ is there, no split in it); rerun the imgprep convert "
            "command that wrote it")
    todo = [f"imgprep convert {folder} -o OUT converts it, then imgprep {command} OUT"
            if _looks_like_input(folder) else f"imgprep convert INPUT -o {folder} converts into it"]
    nested = _nested(folder)
    todo.append(f"give the folder that holds <split>.json ({', '.join(map(str, nested))})"
                if nested else "give the folder that holds <split>.json")
    if command == "verify" and (lists := _label_lists(folder)):
        todo.append(f"name a label list to check it: imgprep verify {lists[0]}")
    names = " or ".join(f"{s}.json" for s in SPLITS)
    return ManifestError(f"{folder} is not an imgprep folder: no manifest ({names}) and no "
                         f"trace of a conversion in it; {'; or '.join(todo)}")


def folder_manifests(folder: Path, split: str | None = None,
                     command: str = "verify") -> tuple[list[Path], list[Unfinished]]:
    """The manifests in ``folder`` to read (``split``'s, or all), and its unfinished splits
    (all of them, or ``split`` when it is one). Raises ManifestError, saying what the folder
    is and what to do, when there is no manifest to read: a folder imgprep never wrote into,
    a split that is not there, or only unfinished splits."""
    found: list[Path] = []
    unfinished: list[Unfinished] = []
    if split is not None:
        if manifest_path(folder, split).exists() or manifest_path(folder, split).is_symlink():
            return [manifest_path(folder, split)], []
        unfinished = [u for u in [unfinished_split(folder, split)] if u]
        others = [p.name for p in find_manifests(folder)]
        if not unfinished and others:
            raise ManifestError(
                f"no manifest {manifest_path(folder, split)}: {folder} holds no {split} split, "
                f"only {', '.join(others)}; pick one of those with --split, or convert the "
                f"{split} split into {folder}")
    else:
        found = find_manifests(folder)
        unfinished = [u for s in SPLITS if (u := unfinished_split(folder, s))]
    if found:
        return found, unfinished
    if unfinished:
        raise ManifestError(f"no manifest in {folder}: " + "; ".join(
            f"the {u.split} split is unfinished ({u.seen}): {u.todo}" for u in unfinished))
    raise not_converted(folder, command)


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
    w = workers or World(0, 1, 0, 1, 0, 1).cores_per_rank()
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
    t: dict[str, Any] = m.options.get("transform", {})
    rep = verify_list(folder / (m.list_file or f"{m.split}.txt"), folder, len(m.classes), decode,
                      tick, int(t.get("size", 256)), str(t.get("resize", "center-crop")),
                      m.list_sha256, workers)
    if rep.samples != m.total_samples:
        rep.problems.append(f"{rep.samples} readable entries, manifest says {m.total_samples}")
    return rep
