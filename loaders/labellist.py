"""The label-list loader: Chainer/Caffe ``path label`` files, ours or anyone's.

A map-style source with a rank-aware batch sampler that lives in the main process: epoch e's
order is a seeded permutation of all entries, dealt to ranks by stride (as PyTorch's
DistributedSampler does), cut into batches. Each batch travels to a worker as one item
``(epoch, batch number, indices)`` and is decoded there into one uint8 NCHW array, with an
augmentation generator seeded by (seed, epoch, rank, batch): any worker count gives the same
batches, and resuming at batch k just starts the sampler there.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from imgprep.errors import InputMissingError, ManifestError
from imgprep.synsets import load_class_table
from imgprep.world import World
from loaders.common import PAD_LABEL, LoaderError, check_policies
from loaders.transforms import SampleError, TrainTransform, Transform, ValTransform, apply

BatchItem = tuple[int, int, tuple[int, ...]]  # epoch, batch number, entry indices (-1 = pad)


@dataclass(frozen=True)
class LabelList:
    """Parsed entries: paths (relative to ``root``) and labels, with their line numbers."""

    source: Path
    root: Path
    paths: tuple[str, ...]
    labels: np.ndarray
    lines: np.ndarray


def read_label_list(path: Path, root: Path | None = None, num_classes: int | None = None
                    ) -> LabelList:
    """Parse ``path label`` lines; refuse (naming the line) anything Chainer would misread."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputMissingError(f"cannot read label list {path}: {e.strerror}") from e
    try:
        text = data.decode("utf-8")
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
    return LabelList(path, root, tuple(paths), np.asarray(labels, dtype=np.int64),
                     np.asarray(lines, dtype=np.int64))


def list_classes(entries: LabelList) -> int:
    """The class count of a list: its ``classes.txt`` (written beside it by convert), else
    the largest label + 1."""
    table = entries.root / "classes.txt"
    if table.is_file():
        n = len(load_class_table(table))
        if int(entries.labels.max()) >= n:
            raise ManifestError(f"{entries.source}: label {int(entries.labels.max())} is "
                                f"outside the {n} classes of {table}; fix the list")
        return n
    return int(entries.labels.max()) + 1


def rank_indices(n: int, world: World, seed: int, epoch: int, shuffle: bool, tail: str
                 ) -> np.ndarray:
    """This rank's entries for ``epoch``: a seeded permutation dealt by stride; ``pad`` and
    ``drop`` make every rank's share the same length (-1 marks padding)."""
    order = np.random.default_rng([seed, epoch, 0x11]).permutation(n) if shuffle \
        else np.arange(n)
    size = world.world_size
    if tail == "drop":
        order = order[: n // size * size]
    elif tail == "pad":
        order = np.concatenate([order, np.full(-n % size, -1, dtype=order.dtype)])
    return order[world.rank::size]


class _Batches(Dataset):
    """Decodes one whole batch per item, in whichever worker gets it."""

    def __init__(self, entries: LabelList, transform: Transform, world: World, seed: int,
                 on_error: str) -> None:
        self.entries, self.transform, self.world = entries, transform, world
        self.seed, self.on_error = seed, on_error

    def __len__(self) -> int:  # not used for sampling; DataLoader asks only with no sampler
        return len(self.entries.paths)

    def __getitem__(self, item: BatchItem) -> tuple[torch.Tensor, torch.Tensor, int]:
        epoch, number, indices = item
        e = self.entries
        size = self.transform.size
        images = np.zeros((len(indices), 3, size, size), dtype=np.uint8)
        labels = np.full(len(indices), PAD_LABEL, dtype=np.int64)
        rng = np.random.default_rng([self.seed, epoch, self.world.rank, number])
        skipped = 0
        for i, idx in enumerate(indices):
            if idx < 0:
                continue
            where = f"{e.source}:{e.lines[idx]}: {e.paths[idx]}"
            try:
                data = (e.root / e.paths[idx]).read_bytes()
                apply(data, self.transform, rng, images[i], where=where)
                labels[i] = e.labels[idx]
            except OSError as err:
                raise LoaderError(f"rank {self.world.rank}: {where} cannot be read "
                                  f"({err.strerror}); fix the list or restore the file") from err
            except SampleError as err:
                if self.on_error == "raise":
                    raise LoaderError(f"rank {self.world.rank}: {err}; fix the file, or load "
                                      "with on_error='skip'") from err
                skipped += 1  # stays padding: label PAD_LABEL, zero pixels
        return torch.from_numpy(images), torch.from_numpy(labels), skipped


class _EpochSampler(Sampler[BatchItem]):
    def __init__(self, loader: LabelListLoader) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[BatchItem]:
        L = self.loader
        idx = L.indices()
        for number in range(L._start, L.batches()):
            chunk = [int(i) for i in idx[number * L.batch_size:(number + 1) * L.batch_size]]
            if L.tail == "pad":
                chunk += [-1] * (L.batch_size - len(chunk))  # full batches, padding masked
            yield L.epoch, number, tuple(chunk)


class LabelListLoader:
    """Iterate ``(images uint8 NCHW, labels int64)`` batches of one rank over a label list.

    Same promises as the shard loader: equal batch counts (``tail`` drop/pad; ``uneven`` for
    exact validation), epoch order a pure function of (seed, epoch, World), mid-epoch resume.
    With ``on_error='skip'`` an undecodable image becomes a padding slot (label PAD_LABEL),
    counted in ``skipped``.
    """

    def __init__(self, list_file: Path, world: World, batch_size: int, workers: int = 4,
                 seed: int = 0, root: Path | None = None, train: bool = True,
                 transform: Transform | None = None, tail: str | None = None,
                 shuffle: bool | None = None, on_error: str = "raise",
                 num_classes: int | None = None, mean: tuple[float, ...] = (),
                 std: tuple[float, ...] = (), pin_memory: bool | None = None) -> None:
        self.tail = tail or ("drop" if train else "pad")
        check_policies(batch_size, workers, self.tail, on_error)
        self.entries = read_label_list(Path(list_file), root, num_classes)
        self.world, self.batch_size, self.seed = world, batch_size, seed
        self.num_classes = num_classes or list_classes(self.entries)
        self.shuffle = train if shuffle is None else shuffle
        self.mean, self.std = mean, std
        self.epoch, self._start, self._position, self.skipped = 0, 0, 0, 0
        t = transform or (TrainTransform() if train else ValTransform())
        self._loader = DataLoader(
            _Batches(self.entries, t, world, seed, on_error), batch_size=None,
            sampler=_EpochSampler(self), num_workers=workers, persistent_workers=workers > 0,
            pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory)

    def indices(self) -> np.ndarray:
        return rank_indices(len(self.entries.paths), self.world, self.seed, self.epoch,
                            self.shuffle, self.tail)

    def batches(self) -> int:
        """Batches of this rank in the current epoch (the same on every rank unless uneven)."""
        n = len(self.indices())
        return n // self.batch_size if self.tail == "drop" else -(-n // self.batch_size)

    @property
    def batches_per_epoch(self) -> int:
        """A whole epoch's batches (unchanged by ``load_state_dict``)."""
        return self.batches()

    def set_epoch(self, epoch: int) -> None:
        """Iterate ``epoch`` next, from its first batch."""
        self.epoch, self._start, self._position = epoch, 0, 0

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands: the epoch and the batches of it already yielded."""
        return {"epoch": self.epoch, "batch": self._position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iteration yields batch ``state["batch"]`` of ``state["epoch"]`` on."""
        old = self.epoch
        self.epoch = int(state["epoch"])
        start = int(state["batch"])
        if not 0 <= start <= self.batches():
            self.epoch = old
            raise ValueError(f"batch {start} is outside epoch {state['epoch']}")
        self._start = self._position = start

    def __len__(self) -> int:
        return self.batches() - self._start

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._position, self.skipped = self._start, 0
        for images, labels, skipped in self._loader:
            self.skipped += int(skipped)
            self._position += 1
            yield images, labels
        self._start = 0
