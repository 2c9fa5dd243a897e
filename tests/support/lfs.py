"""A clone made without its Git LFS objects (``GIT_LFS_SKIP_SMUDGE=1``, or no git-lfs
installed): each tracked file is left as its pointer, three lines of text."""

from __future__ import annotations

import hashlib
from pathlib import Path


def pointer(data: bytes) -> bytes:
    """The Git LFS pointer file of ``data``, as git-lfs writes it."""
    return (b"version https://git-lfs.github.com/spec/v1\n"
            + f"oid sha256:{hashlib.sha256(data).hexdigest()}\nsize {len(data)}\n".encode())


def as_pointers(files: list[Path]) -> list[Path]:
    """Replace each of ``files`` by its pointer, as such a clone has it; ``files``."""
    for p in files:
        p.write_bytes(pointer(p.read_bytes()))
    return files
