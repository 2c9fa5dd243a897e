"""The ILSVRC2012 class table (index = position of the wnid in the sorted list of wnids) and
the published labels of the 50,000 ILSVRC2012 validation images, both shipped with the package.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from imgprep.errors import InputMissingError, LabelError, SourceFormatError

WNID_RE = re.compile(r"^n\d{8}$")
VAL_PREFIX = "ILSVRC2012_val_"  # + %08d: the names of the published validation images
VAL_NAME_RE = re.compile(rf"^{VAL_PREFIX}(\d{{8}})$")
VAL_IMAGES = 50_000
# Item n-1: the sorted-wnid class index of ILSVRC2012_val_%08d n, as little-endian uint16.
# Made by scripts/make_val_labels.py from Caffe's val.txt (caffe_ilsvrc12.tar.gz), checked
# there against the devkit's ILSVRC2012_validation_ground_truth.txt + map_clsloc.txt and
# Kaggle's LOC_val_solution.csv, which all agree.
VAL_LABELS_FILE = "data/ilsvrc2012_val_labels.bin"
VAL_LABELS_SHA256 = "f5350687a5a78da7e645040d352767bc06c1c99d9dfb34f1623b2d1a1d046b76"


@dataclass(frozen=True)
class ClassTable:
    """Sorted wnids and their human-readable names; ``index(wnid)`` is the label."""

    wnids: tuple[str, ...]
    names: tuple[str, ...]
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {w: i for i, w in enumerate(self.wnids)})

    def __len__(self) -> int:
        return len(self.wnids)

    def index(self, wnid: str) -> int | None:
        """The label of ``wnid``, or None when it is not in the table."""
        return self._index.get(wnid)

    def to_json(self) -> list[list[str]]:
        """``[[wnid, name], …]`` in label order, as stored in manifests."""
        return [[w, n] for w, n in zip(self.wnids, self.names, strict=True)]

    def to_text(self) -> str:
        """Caffe's ``synset_words.txt`` form: ``wnid name`` per line, line number = label."""
        return "".join(f"{w} {n}\n" for w, n in zip(self.wnids, self.names, strict=True))


def parse_class_table(text: str, origin: str) -> ClassTable:
    """Parse ``wnid [name…]`` lines; the result is sorted by wnid whatever the file order."""
    rows: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        wnid, _, name = line.partition(" ")
        if not WNID_RE.match(wnid):
            raise SourceFormatError(
                f"{origin}:{lineno}: {wnid!r} is not a wnid (nXXXXXXXX); "
                "a class file holds 'wnid name' per line"
            )
        if wnid in rows:
            raise SourceFormatError(f"{origin}:{lineno}: wnid {wnid} listed twice")
        rows[wnid] = name.strip() or wnid
    if not rows:
        raise SourceFormatError(f"{origin}: no classes found")
    wnids = tuple(sorted(rows))
    return ClassTable(wnids, tuple(rows[w] for w in wnids))


@functools.cache
def imagenet_classes() -> ClassTable:
    """The 1000 ILSVRC2012 classes shipped with the package (one frozen table, made once)."""
    data = resources.files("imgprep.inputs").joinpath("data/synset_words.txt")
    return parse_class_table(data.read_text("utf-8-sig"), "imgprep/inputs/data/synset_words.txt")


def val_number(key: str) -> int | None:
    """n for ``ILSVRC2012_val_%08d`` n, one of the 50,000 published validation images, else
    None (another name, or a number past the set)."""
    m = VAL_NAME_RE.match(key)
    n = int(m.group(1)) if m else 0
    return n if 1 <= n <= VAL_IMAGES else None


def _chars(keys: np.ndarray) -> np.ndarray:
    """The bytes of a column of keys (a numpy ``S`` array) as a (keys, width) uint8 array;
    the zero padding of shorter keys included."""
    keys = np.ascontiguousarray(keys, dtype=keys.dtype if keys.dtype.kind == "S" else "S")
    return keys.view(np.uint8).reshape(len(keys), keys.dtype.itemsize)


def _digits(chars: np.ndarray) -> np.ndarray:
    return (chars >= ord("0")) & (chars <= ord("9"))


def val_numbers(keys: np.ndarray) -> np.ndarray:
    """``val_number`` of every key of a column (numpy ``S`` array), 0 where it is None: one
    pass over the bytes, for 1.28 M keys."""
    chars, width = _chars(keys), len(VAL_PREFIX) + 8
    if chars.shape[1] < width:
        return np.zeros(len(keys), dtype=np.int64)
    prefix = np.frombuffer(VAL_PREFIX.encode("ascii"), dtype=np.uint8)
    digits = chars[:, len(VAL_PREFIX):width]
    ok = (chars[:, :len(VAL_PREFIX)] == prefix).all(axis=1) & _digits(digits).all(axis=1)
    if chars.shape[1] > width:
        ok &= chars[:, width] == 0  # nothing after the 8 digits
    number = (digits.astype(np.int64) - ord("0")) @ (10 ** np.arange(7, -1, -1))
    return np.where(ok & (number >= 1) & (number <= VAL_IMAGES), number, 0)


def name_wnids(keys: np.ndarray) -> np.ndarray:
    """The wnid each key starts with (``n01440764_10026``, ``n01440764``) as an ``S9`` column,
    empty where a key does not start with one followed by ``_`` or its end."""
    chars = _chars(keys)
    if chars.shape[1] < 9:
        return np.zeros(len(keys), dtype="S9")
    ok = (chars[:, 0] == ord("n")) & _digits(chars[:, 1:9]).all(axis=1)
    if chars.shape[1] > 9:
        ok &= (chars[:, 9] == 0) | (chars[:, 9] == ord("_"))
    return np.where(ok, np.asarray(keys).astype("S9"), b"")


def present_classes(wnids: np.ndarray, keys: np.ndarray) -> ClassTable:
    """The class table of the wnids a listing holds (its ``wnid`` column, else the wnid its
    key starts with), sorted; each class named by its wnid (ImageNet-21k: no names ship)."""
    column = np.where(wnids != b"", wnids, name_wnids(keys)) if len(keys) else wnids
    found = tuple(w.decode("ascii") for w in np.unique(column).tolist() if w)
    if not found:
        raise SourceFormatError("no image is in a class tar or named <wnid>_*: the class "
                                "table cannot be made from the data; pass --classes")
    return ClassTable(found, found)


def packaged_data(name: str, sha256: str) -> bytes:
    """The bytes of the package data file ``name`` (below ``imgprep/inputs/``), refused when
    missing (InputMissingError) or when its sha256 is not ``sha256`` (LabelError): a damaged
    installation must not label a single image."""
    where = f"imgprep/inputs/{name}"
    try:
        data = resources.files("imgprep.inputs").joinpath(name).read_bytes()
    except OSError as e:
        raise InputMissingError(f"cannot read {where} ({e.strerror}): the installation is "
                                "incomplete; reinstall imgprep") from e
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise LabelError(f"{where} has sha256 {digest}, not {sha256}: the installation is "
                         "damaged; reinstall imgprep, or rebuild the file with "
                         "scripts/make_val_labels.py")
    return data


@functools.cache
def imagenet_val_labels() -> np.ndarray:
    """The published label of every ILSVRC2012 validation image: item n-1 is the class index
    (in ``imagenet_classes()``) of ``ILSVRC2012_val_%08d`` n. Refused (LabelError) when the
    packaged file is not the one recorded here."""
    data = packaged_data(VAL_LABELS_FILE, VAL_LABELS_SHA256)
    labels = np.frombuffer(data, dtype="<u2")
    labels.flags.writeable = False
    return labels


def load_class_table(path: Path | None) -> ClassTable:
    """The table in ``path``, or the ILSVRC2012 one when ``path`` is None."""
    if path is None:
        return imagenet_classes()
    try:
        text = path.read_text("utf-8-sig")  # a byte-order mark is not part of the first wnid
    except OSError as e:
        raise InputMissingError(f"cannot read class file {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise SourceFormatError(f"{path} is not UTF-8 text; a class file holds 'wnid name' "
                                "per line") from e
    return parse_class_table(text, str(path))
