"""Which split a name says: the one rule set every form uses.

A name says its split with a word (``WORDS``): ``train`` or ``training``; ``val``, ``valid``
or ``validation``; ``test`` or ``testing``. A folder or tar says it by being named so (any
case), or as image-net.org names its archives (``ILSVRC2012_img_val.tar`` …, ``ARCHIVES``):
``split_of_name``. A form whose file names carry the word inside a pattern (the Hugging Face
Hub's ``validation-00000-of-00014.parquet`` and ``val_images.tar.gz``, a webdataset set's
``imagenet1k-train-0000.tar``) writes ``WORD`` into its pattern where the word goes and turns
what it matched into the split with ``split_of_word``. A single file given alone whose name
follows no pattern holds the split whose word its name contains (``split_in_name``: test,
then val, else train).
"""

from __future__ import annotations

WORDS = {"train": "train", "training": "train", "val": "val", "valid": "val",
         "validation": "val", "test": "test", "testing": "test"}
ARCHIVES = {"ilsvrc2012_img_train": "train", "ilsvrc2012_img_val": "val",
            "ilsvrc2012_img_test": "test", "ilsvrc2012_img_test_v10102019": "test"}
# A regular-expression alternative of every word, the longest first.
WORD = "|".join(sorted(WORDS, key=len, reverse=True))


def split_of_word(word: str) -> str | None:
    """``train``, ``val`` or ``test`` for a word of ``WORDS`` (any case), else None."""
    return WORDS.get(word.casefold())


def split_of_name(name: str) -> str | None:
    """``train``, ``val`` or ``test`` when a folder or tar name says so (any case), else
    None."""
    stem = (name[:-4] if name.lower().endswith(".tar") else name).casefold()
    return WORDS.get(stem) or ARCHIVES.get(stem)


def split_in_name(name: str) -> str:
    """The split of a file given alone, by the words in its name: test, val, else train."""
    words = name.lower()
    return "test" if "test" in words else "val" if "val" in words else "train"
