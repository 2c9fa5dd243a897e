"""``--holdout-per-class N``: a validation split held out of a train split, the same for any
worker count, rank layout or listing order.

Per class with n images, ``min(N, n // 2)`` images go to ``val`` and the rest to ``train``
(a class of one image keeps it for training). Which ones: the images of the class with the
smallest ``holdout_hash(seed, wnid, key)``, ties (which need a 64-bit collision) broken by
key. The hash is FNV-1a (64 bit) over the bytes ``<wnid>/<key>``, started from the seed
mixed into FNV's offset basis, then SplitMix64's finaliser; it is computed over the
listing's columns with numpy, one pass over 13 M keys, and is a contract: the same seed
gives the same held-out images in every imgprep version (a pure-Python copy in the tests
pins it).

Both splits come from one listing and one label pass: the val split is planned and
converted first, the train split last (its manifest removes a gzip form's staging copy,
which both read). Each split's manifest records the holdout (``holdout_per_class``,
``holdout_seed``, ``holdout_images`` and ``holdout_counts_sha256``, the sha256 of every
class's held-out count as little-endian int64 in label order), so a later run with other
holdout settings is refused by the output-folder rules, naming both (``Holdout`` in
``imgprep.sections``).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np

from imgprep.convert.tasks import Plan, plan_fingerprint, plan_tasks
from imgprep.errors import SourceFormatError
from imgprep.inputs.groundtruth import UNKNOWN
from imgprep.inputs.synsets import ClassTable
from imgprep.sections import Holdout

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1


def _splitmix_final(h: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser over uint64 values (wrapping arithmetic)."""
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _seed_basis(seed: int) -> np.uint64:
    """FNV's offset basis with the seed mixed in (the key of the hash)."""
    mixed = _splitmix_final(np.asarray([seed & MASK64], dtype=np.uint64))[0]
    return np.uint64(FNV_OFFSET) ^ mixed


def _fold(h: np.ndarray, column: np.ndarray) -> np.ndarray:
    """FNV-1a steps over each row's bytes of the ``S`` column (not its zero padding)."""
    column = np.ascontiguousarray(column, dtype=column.dtype if column.dtype.kind == "S"
                                  else "S")
    width = column.dtype.itemsize
    chars = column.view(np.uint8).reshape(len(column), width)
    lengths = np.char.str_len(column)
    prime = np.uint64(FNV_PRIME)
    for j in range(width):
        live = lengths > j
        if not live.any():
            break
        h = np.where(live, (h ^ chars[:, j].astype(np.uint64)) * prime, h)
    return h


def holdout_hash(seed: int, wnids: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The uint64 hash of ``<wnid>/<key>`` for each row of two ``S`` columns (module
    docstring)."""
    h = np.full(len(keys), _seed_basis(seed), dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = _fold(h, np.asarray(wnids))
        h = (h ^ np.uint64(ord("/"))) * np.uint64(FNV_PRIME)
        h = _fold(h, np.asarray(keys))
        return _splitmix_final(h)


def held_mask(plan: Plan, per_class: int, seed: int) -> np.ndarray:
    """Which rows of ``plan``'s listing go to the held-out split (only labelled rows)."""
    lst, labels = plan.listing, plan.labels.astype(np.int64)
    wnids = np.asarray(plan.classes.wnids, dtype="S")[np.where(labels >= 0, labels, 0)]
    h = holdout_hash(seed, wnids, lst.key)
    rows = np.flatnonzero(labels != UNKNOWN)
    order = rows[np.lexsort((lst.key[rows], h[rows], labels[rows]))]
    sorted_labels = labels[order]
    counts = np.bincount(sorted_labels, minlength=len(plan.classes))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.arange(len(order)) - starts[sorted_labels]
    take = np.minimum(per_class, counts // 2)
    mask = np.zeros(len(labels), dtype=bool)
    mask[order[rank < take[sorted_labels]]] = True
    return mask


def holdout_record(per_class: int, seed: int, held: np.ndarray, labels: np.ndarray,
                   classes: ClassTable) -> Holdout:
    """What each split's manifest records of the holdout."""
    counts = np.bincount(labels[held].astype(np.int64), minlength=len(classes))
    return Holdout(per_class=per_class, seed=seed, images=int(held.sum()),
                   counts_sha256=hashlib.sha256(counts.astype("<i8").tobytes()).hexdigest())


def split_plan(plan: Plan) -> list[Plan]:
    """``plan`` itself without ``--holdout-per-class``; else its val and train parts, in
    the order they are converted."""
    opts = plan.opts
    if not opts.holdout_per_class:
        return [plan]
    if plan.split != "train":
        raise SourceFormatError(
            f"--holdout-per-class holds out part of a train split, and {opts.input} gives a "
            f"{plan.split} split; pass --split train to convert its train split alone, point "
            "INPUT at the train images, or drop --holdout-per-class")
    held = held_mask(plan, opts.holdout_per_class, opts.holdout_seed)
    record = holdout_record(opts.holdout_per_class, opts.holdout_seed, held, plan.labels,
                            plan.classes)
    kept = (plan.labels != UNKNOWN) & ~held
    parts = []
    for split, rows in (("val", np.flatnonzero(held)), ("train", np.flatnonzero(kept))):
        part = replace(plan, split=split, tasks=plan_tasks(rows, opts, split), holdout=record)
        parts.append(replace(part, fingerprint=plan_fingerprint(part)))
    return parts
