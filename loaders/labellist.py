"""The label-list loader: Chainer/Caffe ``path label`` files, ours or anyone's.

A label list is a source, as a shard set is: its entries are planned as the shard loader's
samples are (``loaders.epochs``, one pool: every rank shares the whole list), through the
same base (``loaders.base``) and decoder backends (``loaders.backends``): the same tails,
equal batch counts, worker split, exact and elastic resume and error rule. Only the reading
differs: each entry's file is read whole (relative to the list's root, which no entry may
leave).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from imgprep import InputMissingError, ManifestError, World, load_class_table
from loaders.backends import EncodedSample
from loaders.base import PlannedLoader
from loaders.config import LoaderOptions
from loaders.epochs import PAD, EpochPlan
from loaders.errors import LoaderError
from loaders.legacy import takes_loose_options


@dataclass(frozen=True, kw_only=True)
class LabelList:
    """Parsed entries: paths (relative to ``root``) and labels, with their line numbers."""

    list_file: Path
    root: Path
    paths: tuple[str, ...]
    labels: np.ndarray
    lines: np.ndarray

    def __post_init__(self) -> None:
        if not len(self.paths) == len(self.labels) == len(self.lines):
            raise ValueError(f"{self.list_file}: {len(self.paths)} paths, "
                             f"{len(self.labels)} labels, {len(self.lines)} line numbers")


def read_label_list(path: Path, root: Path | None = None, num_classes: int | None = None
                    ) -> LabelList:
    """Parse ``path label`` lines; refuse (naming the line) anything Chainer would misread."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputMissingError(f"cannot read label list {path}: {e.strerror}") from e
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark is not part of the first path
    except UnicodeDecodeError as e:
        n = data.count(b"\n", 0, e.start) + 1
        raise ManifestError(f"{path}:{n}: not UTF-8 text; save the list as UTF-8") from e
    root = (root or path.parent).resolve()
    paths: list[str] = []
    labels: list[int] = []
    lines: list[int] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        tokens = line.split()
        where = f"{path}:{n}"
        if len(tokens) != 2 or not tokens[1].lstrip("-").isdigit():
            raise ManifestError(f"{where}: expected 'path label', got {line.strip()!r}")
        label = int(tokens[1])
        if label < 0 or (num_classes is not None and label >= num_classes):
            raise ManifestError(f"{where}: label {label} is outside 0..{(num_classes or 1) - 1}")
        full = (root / tokens[0]).resolve()
        if root not in full.parents:
            raise ManifestError(f"{where}: {tokens[0]} points outside {root}; refused")
        paths.append(tokens[0])
        labels.append(label)
        lines.append(n)
    if not paths:
        raise ManifestError(f"{path} lists no images")
    return LabelList(list_file=path, root=root, paths=tuple(paths),
                     labels=np.asarray(labels, dtype=np.int64),
                     lines=np.asarray(lines, dtype=np.int64))


def list_classes(entries: LabelList) -> int:
    """The class count of a list: its ``classes.txt`` (written beside it by convert), else
    the largest label + 1."""
    table = entries.root / "classes.txt"
    if table.is_file():
        n = len(load_class_table(table))
        if int(entries.labels.max()) >= n:
            raise ManifestError(f"{entries.list_file}: label {int(entries.labels.max())} is "
                                f"outside the {n} classes of {table}; fix the list")
        return n
    return int(entries.labels.max()) + 1


@dataclass
class _ListSource:
    """A worker's reads: each entry's file, whole."""

    entries: LabelList
    rank: int
    fix: str = "fix the file"

    def where(self, idx: int) -> str:
        e = self.entries
        return f"{e.list_file}:{e.lines[idx]}: {e.paths[idx]}"

    def fetch(self, ids: np.ndarray) -> list[EncodedSample]:
        e, out = self.entries, []
        for idx in ids.tolist():
            try:
                data = (e.root / e.paths[idx]).read_bytes()
            except OSError as err:
                raise LoaderError(f"rank {self.rank}: {self.where(idx)} cannot be read "
                                  f"({err.strerror}); fix the list or restore the file") from err
            out.append(EncodedSample(self.where(idx), data, int(e.labels[idx])))
        return out


class LabelListLoader(PlannedLoader):
    """Iterate ``(images uint8 NCHW, labels int64)`` batches of one rank over a label list.

    Args:
        list_file: ``path label`` lines; paths relative to ``root`` (default: the list's
            folder), which they may not leave.
        world: this rank; every rank computes the same epoch order from it.
        options: how the loader runs (``loaders.config.LoaderOptions``: batch size, workers,
            seed, …).
        train: defaults for training (shuffle, ``tail="drop"``, train transform) or
            validation (in order, ``tail="pad"``, center crop).
        num_classes, mean, std: from the manifest of a converted list; a bare list's class
            count comes from its ``classes.txt``, else its largest label + 1.

    ``len(loader)`` and ``batches_per_epoch`` are stated before the epoch; every rank gets
    the same unless ``tail="uneven"``.

    Iteration: ``iter(loader)`` gives batches of their own (copied out of the workers' shared
    memory; pinned with ``pin_memory``); ``loader.in_place()`` gives the same batches without
    that copy, each a view of the memory its worker decoded it into and valid only until the
    next batch is asked for from that iterator (or another pass starts): use it, or
    ``.clone()`` it, before ``next()`` (``PlannedLoader.in_place``; ``DeviceLoader`` on the
    CPU takes batches so).
    """

    @takes_loose_options
    def __init__(self, list_file: Path, world: World, options: LoaderOptions, *,
                 root: Path | None = None, train: bool = True,
                 num_classes: int | None = None, mean: tuple[float, ...] = (),
                 std: tuple[float, ...] = ()) -> None:
        self.entries = read_label_list(Path(list_file), root, num_classes)
        self.num_classes = num_classes or list_classes(self.entries)
        self.mean, self.std = mean, std
        self._source = _ListSource(self.entries, world.rank)
        cfg = options.config(train=train, samples=(len(self.entries.paths),), world=world,
                             mode="replicate", layout_seed=options.seed,
                             num_classes=self.num_classes)
        super().__init__(cfg, self._source)

    def describe(self, plan: EpochPlan, b: int) -> str:
        first = [int(i) for i in plan.table[b] if i != PAD][:1]
        return f": {self._source.where(first[0])}, …" if first else ""
