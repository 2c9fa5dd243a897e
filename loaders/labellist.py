"""The label-list loader: Chainer/Caffe ``path label`` files, ours or anyone's.

Epoch e's order is a seeded permutation of all entries, dealt to ranks by stride (as
PyTorch's DistributedSampler does) and cut into batches; batch b goes to worker
``b % workers``. Each worker computes the order itself from the epoch and start the loader
puts in shared memory (``loaders.ring``), so workers stay alive across epochs, and decodes
its batches straight into its ring slots, as the shard loader does: only
``(generation, worker, slot, rows)`` and the labels cross the process boundary. Augmentation
draws come from a generator seeded by (seed, epoch, rank, batch): any worker count gives the
same batches, and resuming at batch k starts there without reading the batches before it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from imgprep.errors import ImgprepError, InputMissingError, ManifestError
from imgprep.synsets import load_class_table
from imgprep.world import World
from loaders.common import PAD_LABEL, LoaderError, check_policies
from loaders.ring import Ring, is_dead
from loaders.transforms import SampleError, TrainTransform, Transform, ValTransform, apply


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


@dataclass(frozen=True, eq=False)
class _Config:
    """What the loader and its workers both need to compute a rank's batches."""

    entries: LabelList
    transform: Transform
    world: World
    batch_size: int
    workers: int
    tail: str
    shuffle: bool
    on_error: str
    seed: int

    def indices(self, epoch: int) -> np.ndarray:
        return rank_indices(len(self.entries.paths), self.world, self.seed, epoch,
                            self.shuffle, self.tail)

    def batches(self, indices: np.ndarray) -> int:
        n, b = len(indices), self.batch_size
        return n // b if self.tail == "drop" else -(-n // b)

    def chunk(self, indices: np.ndarray, number: int) -> np.ndarray:
        """Batch ``number``'s entries (-1: padding; ``pad`` fills the last batch)."""
        b = self.batch_size
        part = indices[number * b:(number + 1) * b]
        if self.tail == "pad" and len(part) < b:
            part = np.concatenate([part, np.full(b - len(part), -1, dtype=part.dtype)])
        return part

    def where(self, idx: int) -> str:
        e = self.entries
        return f"{e.source}:{e.lines[idx]}: {e.paths[idx]}"


class _Stream(IterableDataset):
    """What each DataLoader worker runs: batches ``w, w + workers, …`` of the rank's epoch
    from the start in shared memory, decoded into its ring slots (yielded whole when running
    in the main process)."""

    def __init__(self, cfg: _Config, ring: Ring) -> None:
        self.cfg, self.ring = cfg, ring
        self._order: tuple[int, np.ndarray] | None = None

    def _indices(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, self.cfg.indices(epoch))
        return self._order[1]

    def __iter__(self) -> Iterator[tuple[int, Any, Any]]:
        cfg, ring = self.cfg, self.ring
        info = get_worker_info()
        w = info.id if info is not None else 0
        if ring.data is not None:
            ring.begin(w)
        generation = ring.generation
        epoch, start = ring.epoch()
        indices = self._indices(epoch)
        made = 0
        for number in range(start + w, cfg.batches(indices), max(1, cfg.workers)):
            ring.note(w, number)
            chunk = cfg.chunk(indices, number)
            if ring.data is None:
                images = np.empty((len(chunk), 3, cfg.transform.size, cfg.transform.size),
                                  np.uint8)
                labels = self._decode(epoch, number, chunk, images, w)
                yield number, torch.from_numpy(images), torch.from_numpy(labels)
                continue
            if not ring.acquire(w, generation):
                return  # the main process started over: this iteration is abandoned
            slot = made % ring.slots
            labels = self._decode(epoch, number, chunk,
                                  ring.slot_array(w, slot, len(chunk)), w)
            made += 1
            yield number, (generation, w, slot, len(chunk)), labels.tobytes()

    def _decode(self, epoch: int, number: int, chunk: np.ndarray, images: np.ndarray,
                w: int) -> np.ndarray:
        """Decode batch ``number`` into ``images``; padding and skipped images stay zero
        with label PAD_LABEL. Returns the labels."""
        cfg, e = self.cfg, self.cfg.entries
        labels = np.full(len(chunk), PAD_LABEL, dtype=np.int64)
        rng = np.random.default_rng([cfg.seed, epoch, cfg.world.rank, number])
        skipped = 0
        for i, idx in enumerate(chunk.tolist()):
            if idx < 0:
                images[i] = 0
                continue
            try:
                data = (e.root / e.paths[idx]).read_bytes()
                apply(data, cfg.transform, rng, images[i], where=cfg.where(idx))
                labels[i] = e.labels[idx]
            except OSError as err:
                raise LoaderError(f"rank {cfg.world.rank}: {cfg.where(idx)} cannot be read "
                                  f"({err.strerror}); fix the list or restore the file") from err
            except SampleError as err:
                if cfg.on_error == "raise":
                    raise LoaderError(f"rank {cfg.world.rank}: {err}; fix the file, or load "
                                      "with on_error='skip'") from err
                images[i] = 0  # stays padding: label PAD_LABEL, zero pixels
                skipped += 1
        if skipped:
            self.ring.add_skipped(w, skipped)
        return labels


class LabelListLoader:
    """Iterate ``(images uint8 NCHW, labels int64)`` batches of one rank over a label list.

    Args:
        list_file: ``path label`` lines; paths relative to ``root`` (default: the list's
            folder), which they may not leave.
        world: this rank; every rank computes the same epoch order from it.
        batch_size, workers: per rank; ``workers=0`` decodes in the calling process.
        seed: the epoch orders' and augmentations' seed.
        train: defaults for training (shuffle, ``tail="drop"``, train transform) or
            validation (in order, ``tail="pad"``, center crop).
        tail: ``drop``, ``pad`` (padding slots: label PAD_LABEL, zero pixels) or ``uneven``.
        on_error: ``raise`` on an undecodable image, or ``skip`` (it becomes a padding slot,
            counted in ``skipped``).
        num_classes, mean, std: from the manifest of a converted list; a bare list's class
            count comes from its ``classes.txt``, else its largest label + 1.

    Same promises as the shard loader: equal batch counts (``tail`` drop/pad; ``uneven`` for
    exact validation), epoch order a pure function of (seed, epoch, World), mid-epoch resume.
    """

    def __init__(self, list_file: Path, world: World, batch_size: int, workers: int = 4,
                 seed: int = 0, root: Path | None = None, train: bool = True,
                 transform: Transform | None = None, tail: str | None = None,
                 shuffle: bool | None = None, on_error: str = "raise",
                 num_classes: int | None = None, mean: tuple[float, ...] = (),
                 std: tuple[float, ...] = (), pin_memory: bool | None = None,
                 prefetch_factor: int = 2) -> None:
        self.tail = tail or ("drop" if train else "pad")
        check_policies(batch_size, workers, self.tail, on_error)
        self.entries = read_label_list(Path(list_file), root, num_classes)
        self.world, self.batch_size, self.seed, self.workers = world, batch_size, seed, workers
        self.num_classes = num_classes or list_classes(self.entries)
        self.shuffle = train if shuffle is None else shuffle
        self.mean, self.std = mean, std
        self.epoch, self._start, self._position = 0, 0, 0
        self._order: tuple[int, np.ndarray] | None = None
        self.cfg = _Config(self.entries, transform or (TrainTransform() if train
                                                       else ValTransform()),
                           world, batch_size, workers, self.tail, self.shuffle, on_error, seed)
        self._pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        # prefetch_factor batches in flight per worker, one being decoded, one spare
        self._ring = Ring(workers, prefetch_factor + 2, batch_size, self.cfg.transform.size)
        self._loader = DataLoader(
            _Stream(self.cfg, self._ring), batch_size=None, num_workers=workers,
            persistent_workers=workers > 0, pin_memory=self._pin and workers == 0,
            prefetch_factor=prefetch_factor if workers > 0 else None)

    def indices(self) -> np.ndarray:
        """This rank's entries of the current epoch, in order (-1: padding)."""
        if self._order is None or self._order[0] != self.epoch:
            self._order = (self.epoch, self.cfg.indices(self.epoch))
        return self._order[1]

    def batches(self) -> int:
        """Batches of this rank in the current epoch (the same on every rank unless uneven)."""
        return self.cfg.batches(self.indices())

    @property
    def batches_per_epoch(self) -> int:
        """A whole epoch's batches (unchanged by ``load_state_dict``)."""
        return self.batches()

    @property
    def skipped(self) -> int:
        """Images left as padding because they could not be decoded, this pass."""
        return self._ring.skipped()

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """The worker processes' pids, as each recorded itself (0: not started)."""
        return tuple(self._ring.pid(w) for w in range(self.workers))

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

    def _dead_workers(self) -> str:
        """'worker 1 (pid 123, making batch 4: train.txt:9: train/x.jpg, …)' for the workers
        whose recorded pids have exited."""
        indices, dead = self.indices(), []
        for w in range(self.workers):
            pid = self._ring.pid(w)
            if is_dead(pid):
                b = self._ring.making(w)
                first = [int(i) for i in self.cfg.chunk(indices, b) if i >= 0][:1]
                what = f": {self.cfg.where(first[0])}, …" if first else ""
                dead.append(f"worker {w} (pid {pid}, making batch {b}{what})")
        return "; ".join(dead)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        total = self.batches()
        self._ring.set_epoch(self.epoch, self._start)
        generation = self._ring.new_iteration()  # workers of an abandoned iteration stop
        self._position = self._start
        try:
            for batch in self._ring.in_order(self._loader, generation, self._pin, self._start):
                self._position += 1
                yield batch
        except (RuntimeError, ConnectionError, EOFError) as e:
            dead = self._dead_workers() if not isinstance(e, ImgprepError) else ""
            if not dead:
                raise
            raise LoaderError(f"rank {self.world.rank}: loader {dead} died in epoch "
                              f"{self.epoch} at batch {self._position} ({e}); rerun to "
                              "resume from the last checkpoint") from e
        if self._position != total:
            raise LoaderError(f"rank {self.world.rank}: epoch {self.epoch} gave "
                              f"{self._position - self._start} of {total - self._start} "
                              "batches; the list changed under the loader")
        self._start = 0
