"""What a convert run may do to its output folder.

A folder holds at most one finished conversion per split (``<split>.json`` names it). A run
for a split that is already there with the same fingerprint (input, labels, options, format)
resumes or reports it complete; one that differs is refused, naming what is there and what
differs, unless ``--overwrite``: then the old split is removed first (manifest first, so the
folder never claims a split it no longer holds) and the caller says so. A split begun by
another transform version (its task records say which) is not resumed either: a folder never
mixes images made two ways. A run touches only files of its own split: ``split_owns`` is the
one place that says which those are.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from imgprep.convert.errorlog import error_log_path, warning_log_path
from imgprep.convert.image import describe_transform
from imgprep.errors import ImgprepError, OutputExistsError
from imgprep.fsutil import TMP_PREFIX, tmp_final
from imgprep.inputs.spool import SPOOL_DIR
from imgprep.sections import SPLITS, ManifestOptions, SourceSection
from imgprep.shards.folder import CONVERT_STATE, split_owns
from imgprep.shards.manifest import Manifest, manifest_path, read_manifest

STATE_DIR = CONVERT_STATE
# Manifest option keys and the command-line option that sets each, for messages.
OPTION_FLAGS = {
    "format": "--format", "seed": "--seed", "meta": "--meta/--no-meta",
    "shard_size": "--shard-size", "num_shards": "--shards", "size": "--size",
    "resize": "--resize", "filter": "--filter", "quality": "--quality",
    "max_pixels": "--max-pixels", "exif_transpose": "--exif-transpose",
    "holdout_per_class": "--holdout-per-class", "holdout_seed": "--holdout-seed",
}


@dataclass(frozen=True, kw_only=True)
class Wanted:
    """What this run would write for a split, in the terms a manifest records."""

    out: Path
    split: str
    format: str
    options: ManifestOptions  # the fingerprint included
    classes: list[list[str]]
    source: SourceSection
    tool_version: str
    transform_version: int


def other_tmp_files(out: Path, split: str) -> set[str]:
    """Final names of temporary files in ``out`` that belong to another split's run (which
    may be writing them now): a sweep for ``split`` must keep them."""
    if not out.is_dir():
        return set()
    names = {tmp_final(p.name) for p in out.iterdir() if p.name.startswith(TMP_PREFIX)}
    return {n for n in names if not split_owns(split, n)}


def _describe(m: Manifest) -> str:
    what = f"{m.format}, {m.total_samples} samples"
    if m.source is not None and m.source.name:
        what += f" from {m.source.name} ({m.source.images} images)"
    return what + f", --size {m.options.transform.size}"


def differences(old: Manifest, new: Wanted) -> list[str]:
    """How the finished conversion ``old`` differs from what this run would write."""
    diffs = []
    if old.format != new.format:
        diffs.append(f"--format: the folder holds {old.format}, this run writes {new.format}")
    was = old.options.flat()
    now = new.options.flat()
    for key in sorted(set(was) | set(now)):
        if key not in ("format", "split") and was.get(key) != now.get(key):
            flag = OPTION_FLAGS.get(key, key)
            diffs.append(f"{flag}: {was.get(key)} there, {now.get(key)} now")
    if old.transform_version != new.transform_version:
        diffs.append(f"images: {describe_transform(old.transform_version)} there, "
                     f"{describe_transform(new.transform_version)} now")
    if old.classes != new.classes:
        diffs.append(f"--classes: {len(old.classes)} classes there, {len(new.classes)} now")
    src = old.source
    there = (src.name, src.images) if src is not None else (None, None)
    if there != (new.source.name, new.source.images):
        diffs.append(f"input: {there[0]} ({there[1]} images) there, "
                     f"{new.source.name} ({new.source.images} images) now")
    if not diffs and old.tool_version != new.tool_version:
        diffs.append(f"imgprep version: {old.tool_version} there, {new.tool_version} now")
    if not diffs:
        diffs.append("the images or their labels (--labels, --label-offset, or the input's "
                     "content) differ")
    return diffs


def check_folder(new: Wanted, overwrite: bool) -> Manifest | None:
    """The finished conversion of ``new.split`` that this run replaces (``overwrite``), or
    None when there is none or it is this very one (resume or complete). Raises
    OutputExistsError naming what is there and what differs, without ``overwrite``."""
    path = manifest_path(new.out, new.split)
    if not path.exists() and not path.is_symlink():
        return None
    try:
        old = read_manifest(path)
    except ImgprepError as e:
        if overwrite:
            return _unreadable(new)
        raise OutputExistsError(
            f"{path} is there but cannot be read ({e}); pass --overwrite to replace the "
            f"{new.split} split, or pick another --out") from e
    if old.options.fingerprint == new.options.fingerprint:
        return None
    if overwrite:
        return old
    raise OutputExistsError(
        f"{new.out} already holds a finished {new.split} split ({path.name}: {_describe(old)}) "
        f"and this run differs: {'; '.join(differences(old, new))}; rerun with the same input "
        "and options to keep it, pass --overwrite to replace it, or pick another --out")


def other_transforms(state_dir: Path, version: int) -> dict[Path, int]:
    """The task records in ``state_dir`` written by another transform version than
    ``version`` (a record without one is from version 1), with theirs."""
    found = {}
    for rec in sorted(state_dir.glob("*.json")) if state_dir.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            theirs = json.loads(rec.read_text("utf-8")).get("transform_version", 1)
            if theirs != version:
                found[rec] = theirs
    return found


def check_unfinished(new: Wanted, state_dir: Path) -> None:
    """Refuse to resume an unfinished split that another transform version began
    (OutputExistsError, naming both)."""
    other = other_transforms(state_dir, new.transform_version)
    if other:
        theirs = sorted(set(other.values()))[0]
        raise OutputExistsError(
            f"{new.out} holds an unfinished {new.split} split ({len(other)} tasks done) made "
            f"by {describe_transform(theirs)}; this imgprep makes "
            f"{describe_transform(new.transform_version)} and a folder never mixes them: "
            f"finish it with the imgprep that began it, pass --overwrite to start over, or "
            "pick another --out")


def _unreadable(new: Wanted) -> Manifest:
    """A stand-in for a manifest that cannot be read, so that removal takes the split's files
    of both formats (what it held is unknown)."""
    return Manifest(split=new.split, format="?", total_samples=0, classes=[], mean=[], std=[],
                    options=new.options, tool_version="?")


def check_shared_classes(new: Wanted) -> None:
    """Label lists in one folder share ``classes.txt``: refuse a list whose class table would
    change the one another split's finished list uses."""
    if new.format != "list":
        return
    for other in SPLITS:
        path = manifest_path(new.out, other)
        if other == new.split or not path.is_file():
            continue
        with contextlib.suppress(ImgprepError):
            m = read_manifest(path)
            if m.format == "list" and m.classes != new.classes:
                raise OutputExistsError(
                    f"{new.out}/classes.txt belongs to the {other} label list ({path.name}), "
                    f"whose class table differs from this run's ({len(m.classes)} vs "
                    f"{len(new.classes)} classes); use the same --classes or another --out")


def _list_files(out: Path, split: str) -> Iterator[Path]:
    """Label-list images of ``split`` that imgprep wrote: those its task records and its list
    file name (never a whole tree: an input folder may sit beside the output)."""
    state = out / STATE_DIR / split
    for rec in sorted(state.glob("*.json")) if state.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError, IndexError):
            for row in json.loads(rec.read_text("utf-8"))["files"]:
                yield out / str(row[0])
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in (out / f"{split}.txt").read_text("utf-8").splitlines():
            if line.split():
                yield out / line.split()[0]


def _other_list(out: Path, split: str) -> bool:
    """Whether another split's label list (finished or not) is in ``out``."""
    others = [o for o in SPLITS if o != split]
    return any((out / f"{o}.txt").exists() or any((out / STATE_DIR / o).glob("*-chunk-*.json"))
               for o in others)


def remove_format(out: Path, split: str, fmt: str, keep: set[str]) -> int:
    """Remove the files of ``split`` in format ``fmt`` (``?``: both) but ``keep``; returns how
    many. Only names that ``split_owns`` and images its records or list name are touched."""
    victims: list[Path] = []
    tree = (out / split).resolve()
    if fmt in ("list", "?"):
        victims += [p for p in _list_files(out, split)
                    if p.suffix == ".jpg" and tree in p.resolve().parents]
    victims += [p for p in out.iterdir() if p.name not in keep and p.is_file()
                and split_owns(split, p.name, None if fmt == "?" else fmt)
                and not p.name.endswith(("-errors.jsonl", "-warnings.jsonl", ".json"))]
    if fmt in ("list", "?") and victims and not _other_list(out, split):
        victims.append(out / "classes.txt")  # no other split's label list shares it
    n = 0
    for p in victims:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            n += 1
    for d in sorted({p.parent for p in victims if p.suffix == ".jpg"}, reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        (out / split).rmdir()
    return n


def remove_split(out: Path, old: Manifest, split: str) -> str:
    """Remove a finished split that ``--overwrite`` replaces, manifest first; returns the
    line that says so."""
    manifest_path(out, split).unlink(missing_ok=True)
    error_log_path(out, split).unlink(missing_ok=True)
    warning_log_path(out, split).unlink(missing_ok=True)
    n = remove_format(out, split, old.format, set())
    state = out / STATE_DIR / split
    for p in state.glob("*") if state.is_dir() else []:
        if p.name != SPOOL_DIR:  # the staging copy this run planned from (by its stamps)
            p.unlink(missing_ok=True)
    what = _describe(old) if old.format != "?" else "an unreadable manifest"
    files = f"{n} file" + ("" if n == 1 else "s")
    return (f"--overwrite: removed the finished {split} split in {out} ({what}; {files}) "
            f"before converting; {out} holds no {split} split until this run finishes")


def created_dirs(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            break
        missing.append(p)
    return missing


def remove_if_empty(dirs: list[Path]) -> None:
    """Remove each folder of ``dirs`` (deepest first) that is empty: what a failed run
    created and left nothing in."""
    for d in dirs:
        with contextlib.suppress(OSError):
            d.rmdir()
