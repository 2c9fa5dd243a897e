"""The node-local folder's side of staging: small atomic writes, temporary names, removals,
the free-space check, and the one-line errors they raise (which name the file and the node,
and say what to do next).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from pathlib import Path

from imgprep.errors import OutputError, StageError
from imgprep.fsutil import atomic_open, tmp_name

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def why(err: BaseException | None) -> str:
    """A short reason for an error: "disk full", the OS's words, or the message."""
    if isinstance(err, OSError):
        return "disk full" if err.errno in DISK_FULL else (err.strerror or str(err))
    return str(err)


def size_text(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def check_space(dst: Path, need: int, shards: int, node: int) -> int:
    """``need`` (bytes still to copy), or a StageError when ``dst`` has not that much free."""
    free = shutil.disk_usage(dst).free
    if free < need:
        raise StageError(f"node {node}: {dst} has {size_text(free)} free but "
                         f"{size_text(need)} ({shards} shards) still to copy; free space "
                         "or use another --dst, then rerun")
    return need


def write_small(path: Path, data: bytes, node: int, durable: bool = True) -> None:
    """Write a small file atomically; a failure is a StageError that says what to do."""
    try:
        with atomic_open(path, durable=durable) as f:
            f.write(data)
    except OutputError as e:
        raise StageError(f"node {node}: cannot write {path}: {why(e.__cause__ or e)}; free "
                         "space there or use another --dst, then rerun to resume") from e


def write_error(err: OSError, name: str, dst: Path, node: int) -> StageError:
    """The one-line error for a failed write of ``name`` into ``dst``."""
    if err.errno in DISK_FULL:
        return StageError(f"node {node}: disk full writing {name} in {dst}; free "
                          "space there or use another --dst, then rerun to resume")
    return StageError(f"node {node}: cannot write {name} in {dst}: "
                      f"{err.strerror or err}; check that folder, then rerun to resume")


def drop_stale(dst: Path, split: str, keep: set[str]) -> None:
    """Remove shards of ``split`` from ``dst`` that are not in ``keep`` (another mode or node
    count): nothing in ``dst`` may look like part of the node's data but the manifest's."""
    pattern = re.compile(re.escape(split) + r"-\d{6}\.tar")
    for p in dst.glob(f"{split}-*.tar"):
        if pattern.fullmatch(p.name) and p.name not in keep and p.is_file():
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def remove(path: Path, node: int) -> None:
    """Remove ``path`` if it is there; a file that cannot be removed stops staging."""
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        raise StageError(f"node {node}: cannot replace {path}: {e.strerror}; remove it by "
                         "hand, then rerun") from e


def open_tmp(final: Path) -> int:
    """Open ``final``'s temporary name for writing, never through a link planted there."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
    return os.open(tmp_name(final), flags, 0o644)
