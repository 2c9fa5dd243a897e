"""Image names in the Hugging Face Hub copies of ILSVRC2012 and in shard sets: the key and
the class each name carries.

One image has one key in every form: its canonical stem (``n01440764_10026``,
``ILSVRC2012_val_00000001``, ``ILSVRC2012_test_00000001``). The Hub's copies append the
class to a name (``n01440764_10026_n01440764.JPEG``,
``ILSVRC2012_val_00000001_n01751748.JPEG``): ``parse_name`` strips that suffix
(``imgprep.inputs.keys``, the one home of keys) and returns the wnid it names. A train
name's own prefix is a wnid too; when both are there and differ, the name contradicts
itself, and ``parse_name`` says so.

Which split a Hub file holds is in its name (``train-00000-of-00294.parquet``,
``validation-…``, ``test-…``; ``train_images_0.tar.gz``, ``val_images.tar.gz``,
``test_images.tar.gz``; the words of ``imgprep.inputs.splitnames``): ``hub_split``, and
``file_split`` for a file given alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from imgprep.inputs.keys import sanitize_key, split_wnid_suffix, stem_of
from imgprep.inputs.splitnames import WORD, split_in_name, split_of_word

CANONICAL_RE = re.compile(r"^(n\d{8}_\d+|ILSVRC2012_(val|test)_\d{8})$")
_TRAIN_PREFIX_RE = re.compile(r"^(?P<wnid>n\d{8})_")
# File names of the Hub's copy: parquet shards and the older tar.gz archives.
PARQUET_NAME_RE = re.compile(
    rf"^(?P<split>{WORD})-(?P<index>\d{{5}})-of-(?P<count>\d{{5}})\.parquet$")
TARGZ_NAME_RE = re.compile(rf"^(?P<split>{WORD})_images(?:_(?P<index>\d+))?\.tar\.gz$")


@dataclass(frozen=True)
class HubName:
    """What one image name says: its ``key`` (the canonical stem when the name holds one),
    the ``wnid`` it names (empty when none) and, when the name contradicts itself, why."""

    key: str
    wnid: str
    conflict: str = ""


def parse_name(name: str) -> HubName:
    """The key and class of an image named ``name`` (a member name or ``image.path``)."""
    stem, wnid = split_wnid_suffix(stem_of(name.rpartition("/")[2]))
    prefix = _TRAIN_PREFIX_RE.match(stem)
    conflict = ""
    if prefix is not None:
        if wnid and prefix.group("wnid") != wnid:
            conflict = (f"{name!r} names two classes: {prefix.group('wnid')} in its stem, "
                        f"{wnid} in its suffix")
        wnid = wnid or prefix.group("wnid")
    return HubName(sanitize_key(stem), wnid, conflict)


def is_canonical(key: str) -> bool:
    """Whether ``key`` is an ILSVRC2012 file stem (train, val or test)."""
    return CANONICAL_RE.match(key) is not None


def hub_split(file_name: str) -> str | None:
    """``train``, ``val`` or ``test`` for a file named as in the Hub's copy, else None."""
    m = PARQUET_NAME_RE.match(file_name) or TARGZ_NAME_RE.match(file_name)
    return split_of_word(m.group("split")) if m else None


def file_split(file_name: str) -> str:
    """The split of one of the Hub's files: from its name as the Hub names files, else from
    the words in its name (a file given alone)."""
    return hub_split(file_name) or split_in_name(file_name)
