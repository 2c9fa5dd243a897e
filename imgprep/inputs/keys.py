"""The key of an image, in one place: the same image gets the same key in every form.

The key is the file's stem (``n01440764_10026``, ``ILSVRC2012_val_00000001``), made safe for
webdataset (no dots, which it splits on) and label lists (no whitespace). Forms that append
the class to the name (the Hugging Face tar.gz copy: ``<stem>_<wnid>.JPEG``) strip it with
``split_wnid_suffix`` first, so their keys equal the image-net.org ones.
"""

from __future__ import annotations

import re

_UNSAFE_KEY = re.compile(r"[.\s/]")  # \s: exactly the characters str.isspace() accepts
_WNID_SUFFIX = re.compile(r"^(.+)_(n\d{8})$")


def sanitize_key(stem: str) -> str:
    """A webdataset- and label-list-safe key: no dots (webdataset splits on them), no spaces."""
    return _UNSAFE_KEY.sub("_", stem)


def stem_of(base: str) -> str:
    """A file name (no folder) without its extension; leading dots stay, as in
    ``posixpath.splitext``."""
    dot = base.rfind(".")
    if dot > 0 and base[:dot].strip("."):
        return base[:dot]
    return base


def member_key(name: str) -> str:
    """The key of the image stored under ``name`` (any folder, any extension)."""
    return sanitize_key(stem_of(name.rpartition("/")[2]))


def split_wnid_suffix(stem: str) -> tuple[str, str]:
    """``<stem>_<wnid>`` -> (stem, wnid); any other name -> (name, "")."""
    m = _WNID_SUFFIX.match(stem)
    return (m.group(1), m.group(2)) if m else (stem, "")
