"""webdataset shard sets of ILSVRC2012, as timm publishes them (``timm/imagenet-1k-wds``).

``imagenet1k-train-NNNN.tar`` and ``imagenet1k-validation-NNNN.tar`` (or any word of
``imgprep.inputs.splitnames`` for train or val: ``-val-``, ``-training-`` …), in a folder or
given one by one: plain tars of samples ``<key>.jpg`` + ``<key>.cls`` (the class
index, sorted-wnid order) + an optional ``<key>.json``. A folder holding a train and a
validation set is two splits. Each shard is listed by its headers
(``imgprep.shards.tarfmt.walk``), in parallel over shards, and its images are read in place
by offset, like any tar.

The label is ``.cls``, cross-checked with the ``.json`` where it carries one (``label``,
``wnid``): a sample whose two disagree refuses the set, naming the count and the first. The
key is the webdataset key when it is a canonical ILSVRC2012 stem, else the stem of the
``.json``'s original ``filename`` when it has one, so that one image gets one key in every
form.
"""

from __future__ import annotations

import functools
import json
import multiprocessing as mp
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from imgprep.errors import LabelError, SourceFormatError
from imgprep.inputs.forms.base import Detected, ListContext, SplitInput
from imgprep.inputs.groundtruth import listed
from imgprep.inputs.hfnames import is_canonical, parse_name
from imgprep.inputs.sources import Listing, build_listing
from imgprep.inputs.splitnames import WORD, split_of_word
from imgprep.inputs.synsets import WNID_RE, ClassTable
from imgprep.inputs.tarlist import IMAGE_EXTS, Columns, ListingError
from imgprep.job.cpus import rank_cores, read_limits
from imgprep.procs import die_with_parent
from imgprep.shards import tarfmt

NAME = "wds"
FAKE = "imgprep.inputs.fakes.wds:write"
SHARD_RE = re.compile(rf"^(?P<prefix>.+)-(?P<split>{WORD})-(?P<index>\d+)\.tar$")
READ = ("train", "val")  # the splits of a shard set that are read; test shards are left out
IMAGE_FIELDS = tuple(e.lstrip(".") for e in IMAGE_EXTS)
MAX_SMALL = 1 << 16  # a .cls or .json bigger than this is not one
LABELS = "each sample's .cls (sorted-wnid order), checked against its .json"


def shard_sets(path: Path) -> dict[str, list[Path]]:
    """{split: its shards, sorted} in ``path`` (a shard, or a folder of shard sets);
    two sets of one split in a folder (other prefixes) are refused."""
    shards = [path] if path.is_file() else \
        sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else []
    found: dict[str, list[Path]] = {}
    prefixes: dict[str, str] = {}
    for p in shards:
        m = SHARD_RE.match(p.name)
        split = split_of_word(m.group("split")) if m is not None else None
        if m is None or split is None or split not in READ:
            continue
        if prefixes.setdefault(split, m.group("prefix")) != m.group("prefix"):
            raise SourceFormatError(
                f"{path} holds two {split} shard sets ({prefixes[split]}-… and "
                f"{m.group('prefix')}-…); convert each on its own: put one set in a folder "
                "of its own")
        found.setdefault(split, []).append(p)
    return found


def sample_key(name: str) -> tuple[str, str]:
    """(webdataset key, field) of a member: the key ends at the first dot of the base name."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower() if dot else ""


@dataclass
class _Sample:
    image: tuple[int, int] | None = None  # offset, size
    image_name: str = ""
    cls: tuple[int, int] | None = None
    json: tuple[int, int] | None = None


@dataclass
class ShardListing:
    """One shard's samples (``cols``: container ``cid``), and the samples whose ``.cls`` and
    ``.json`` disagree."""

    cols: Columns
    disagree: list[str] = field(default_factory=list)


def _samples(path: Path, fd: int, out: Columns) -> dict[str, _Sample]:
    samples: dict[str, _Sample] = {}
    read_at = functools.partial(os.pread, fd)
    try:
        for name, kind, _, offset, size, _, _ in tarfmt.walk(read_at, os.fstat(fd).st_size):
            if kind not in tarfmt.FILE_KINDS:
                continue
            why = tarfmt.refusal(kind, name)
            if why is not None:
                out.errors.append(ListingError(f"{path.name}/{name}", f"{why}; refused"))
                continue
            key, ext = sample_key(name)
            s = samples.setdefault(key, _Sample())
            if ext in IMAGE_FIELDS and s.image is None:
                s.image, s.image_name = (offset, size), name
            elif ext == "cls":
                s.cls = (offset, size)
            elif ext == "json":
                s.json = (offset, size)
            else:
                out.skipped += 1
    except tarfmt.HeaderError as e:
        raise SourceFormatError(f"{path}: {e}; re-download it") from None
    return samples


def _small(fd: int, span: tuple[int, int] | None) -> bytes | None:
    if span is None or span[1] > MAX_SMALL:
        return None
    return os.pread(fd, span[1], span[0])


def _meta(raw: bytes | None) -> dict[str, object]:
    try:
        meta = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


def list_shard(path: Path, cid: int, classes: ClassTable) -> ShardListing:
    """Every sample of the shard ``path`` (container ``cid``): key, image and class."""
    out = ShardListing(Columns())
    cols = out.cols
    fd = os.open(path, os.O_RDONLY)
    try:
        for key, s in _samples(path, fd, cols).items():
            where = f"{path.name}/{key}"
            if s.image is None:
                cols.errors.append(ListingError(where, "sample without an image; skipped"))
                continue
            label, final = _label(where, key, _small(fd, s.cls), _meta(_small(fd, s.json)),
                                  classes, out)
            if label is not None:  # no label carried: the class the key names, if any
                wnid = classes.wnids[label] if label >= 0 else parse_name(final).wnid
                cols.add(cid, s.image[0], s.image[1], f"{path.name}/{s.image_name}", wnid,
                         stem=final)
    finally:
        os.close(fd)
    out.cols.freeze()
    return out


def _label(where: str, key: str, cls: bytes | None, meta: dict[str, object],
           classes: ClassTable, out: ShardListing) -> tuple[int | None, str]:
    """(label, key) of one sample; None when it is refused (recorded in ``out``)."""
    filename = meta.get("filename") or meta.get("file_name") or meta.get("fname")
    hub = parse_name(filename if isinstance(filename, str) and not is_canonical(key)
                     else key)
    label = -1
    if cls is not None:
        text = cls.decode("ascii", "replace").strip()
        if not text.lstrip("-").isdigit():
            out.cols.errors.append(ListingError(where, f".cls holds {text[:20]!r}, not a "
                                                       "class index; skipped"))
            return None, hub.key
        label = int(text)
    given = meta.get("label", meta.get("cls"))
    if isinstance(given, int) and label == -1:
        label = given
    if not (label == -1 or 0 <= label < len(classes)):
        out.cols.errors.append(ListingError(where, f"class index {label} is outside "
                                                   f"0..{len(classes) - 1}; skipped"))
        return None, hub.key
    wnid = classes.wnids[label] if label >= 0 else ""
    named = meta.get("wnid") or meta.get("synset") or hub.wnid
    if isinstance(given, int) and given != label:
        out.disagree.append(f"{where}: .cls {label}, .json label {given}")
    elif isinstance(named, str) and WNID_RE.match(named) and wnid and named != wnid:
        out.disagree.append(f"{where}: .cls {label} = {wnid}, the sample names {named}")
    return label, hub.key


def _list_one(args: tuple[Path, int, ClassTable]) -> ShardListing:
    return list_shard(*args)


def list_shards(shards: list[Path], classes: ClassTable, workers: int | None) -> Columns:
    """The samples of every shard (shard i is container i), listed on forked processes
    when there are several; a disagreement between ``.cls`` and ``.json`` anywhere refuses
    the set."""
    n = min(len(shards), workers or rank_cores(read_limits(), 1))
    jobs = [(p, i, classes) for i, p in enumerate(shards)]
    if n <= 1 or mp.current_process().daemon:
        parts = [_list_one(j) for j in jobs]
    else:
        with mp.get_context("fork").Pool(n, die_with_parent, (os.getpid(),)) as pool:
            parts = pool.map(_list_one, jobs, chunksize=max(1, min(16, len(jobs) // (4 * n))))
    disagree = [d for p in parts for d in p.disagree]
    if disagree:
        raise LabelError(
            f"{len(disagree)} samples whose .cls and .json name other classes "
            f"({listed(disagree)}); the shard set is damaged or was written with "
            "another class order: fix or re-download it")
    cols = Columns(containers=[str(p) for p in shards])
    for part in parts:
        cols.merge(part.cols, len(cols.errors), 0)
    return cols


def probe(path: Path) -> Detected | None:
    """webdataset shard sets in ``path`` (a shard, or a folder): one split per set."""
    found = shard_sets(path)
    if not found:
        return None
    splits = tuple(
        SplitInput(form=NAME, split=name, path=path, labels=LABELS, images=None,
                   where=(f"{len(files)} {name} shards in {files[0].parent}" if len(files) > 1
                          else f"{files[0]} (webdataset shard)"))
        for name, files in sorted(found.items(), key=lambda kv: kv[0] != "train"))
    return Detected(form=NAME, root=path, splits=splits,
                    description="a webdataset shard set of ImageNet (.jpg + .cls samples, "
                                "as timm's imagenet-1k-wds)")


def list_split(split: SplitInput, ctx: ListContext) -> Listing:
    """Every sample of ``split``, read in place from its shards by offset."""
    shards = shard_sets(split.path).get(split.split or "train", [])
    cols = list_shards(shards, ctx.classes, ctx.workers)
    return build_listing(str(split.path), NAME, tuple(cols.containers), cols.arrays(),
                         cols.errors, cols.skipped)
