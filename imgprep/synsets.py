"""The ILSVRC2012 class table: index = position of the wnid in the sorted list of wnids."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from imgprep.errors import InputMissingError, SourceFormatError

WNID_RE = re.compile(r"^n\d{8}$")


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


def imagenet_classes() -> ClassTable:
    """The 1000 ILSVRC2012 classes shipped with the package."""
    text = resources.files("imgprep").joinpath("data/synset_words.txt").read_text("utf-8")
    return parse_class_table(text, "imgprep/data/synset_words.txt")


def load_class_table(path: Path | None) -> ClassTable:
    """The table in ``path``, or the ILSVRC2012 one when ``path`` is None."""
    if path is None:
        return imagenet_classes()
    try:
        text = path.read_text("utf-8")
    except OSError as e:
        raise InputMissingError(f"cannot read class file {path}: {e.strerror}") from e
    return parse_class_table(text, str(path))
