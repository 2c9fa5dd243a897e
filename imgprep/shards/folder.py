"""What an output folder holds, finished or not: which file names belong to which split, the
state folders that convert and stage-to-node keep, and how to tell a finished split from one a
run began and did not finish, and both from a folder imgprep never wrote into.

One home for these names, read by the commands that write a folder (convert, stage-to-node)
and by those that read one (verify, info, preview).
"""

from __future__ import annotations

import contextlib
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from imgprep.errors import ManifestError
from imgprep.fsutil import TMP_PREFIX
from imgprep.shards.dali import IDX_NAME_RE
from imgprep.shards.manifest import (
    SHARD_NAME_RE,
    SPLITS,
    find_manifests,
    index_name,
    manifest_path,
)

CONVERT_STATE = ".imgprep"  # convert's task records: <out>/.imgprep/<split>/
STAGE_STATE = ".imgprep-stage"  # stage-to-node's lock, liveness and copier records
INPUT_SUFFIXES = {".tar", ".jpeg", ".jpg", ".png"}
WNID_OR_SPLIT = re.compile(r"^(n\d{8}|train|val|validation)$", re.IGNORECASE)


def split_owns(split: str, name: str, fmt: str | None = None) -> bool:
    """Whether a file name in the output folder belongs to ``split`` (in format ``fmt``, or
    either). ``classes.txt`` is shared by a folder's label lists and belongs to none."""
    logs = {f"{split}-errors.jsonl", f"{split}-warnings.jsonl"}
    shards = {*logs, f"{split}.json", index_name(split)}
    lists = {*logs, f"{split}.json", f"{split}.txt"}
    if split == "train":
        lists.add("mean.npy")
    numbered = SHARD_NAME_RE.match(name) or IDX_NAME_RE.match(name)  # a shard or its DALI index
    if fmt != "list" and (name in shards or (numbered and name.startswith(f"{split}-"))):
        return True
    return fmt != "shards" and name in lists


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
    state = folder / CONVERT_STATE / split
    staged = (folder / STAGE_STATE).is_dir()
    temps = [n for n in names
             if n.startswith(TMP_PREFIX) and split_owns(split, n[len(TMP_PREFIX):])]
    shards = [n for n in names if SHARD_NAME_RE.match(n) and split_owns(split, n)]
    log = f"{split}-errors.jsonl"
    if not (state.is_dir() or temps or log in names or (staged and shards)):
        return None
    seen = []
    if state.is_dir():
        records = len(list(state.glob("*.json")))
        seen.append(f"{_counted(records, 'task record')} in {CONVERT_STATE}/{split}/"
                    if records else f"{CONVERT_STATE}/{split}/ with no task finished")
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
    if (folder / STAGE_STATE).is_dir():
        return ManifestError(
            f"no manifest in {folder}: stage-to-node began there and did not finish "
            f"({STAGE_STATE}/ is there, no shard yet); rerun imgprep stage-to-node (it "
            "resumes where it stopped)")
    if (folder / CONVERT_STATE).is_dir():
        return ManifestError(
            f"no manifest in {folder}: a conversion began there and did not finish "
            f"({CONVERT_STATE}/ is there, no split in it); rerun the imgprep convert "
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


