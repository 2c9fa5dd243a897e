"""Crash-safe file writing: temporary name in the same folder, fsync, rename, fsync folder.

A crash at any moment leaves either the old file or the complete new one under the final
name, never a partial file. Temporary names start with ``.tmp-`` so reruns can sweep them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import IO, Any

from imgprep.errors import OutputError

TMP_PREFIX = ".tmp-"
PIECE_MARK = ".piece-"  # a temporary piece of a file: ``.tmp-<final name>.piece-<n>``


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_name(final: Path) -> Path:
    """The temporary sibling used while ``final`` is being written.

    The name is fixed (no pid) so that a rerun after a kill reuses and replaces it: the work
    that left it behind is redone, and nothing stale accumulates.
    """
    return final.with_name(f"{TMP_PREFIX}{final.name}")


def piece_name(final: Path, n: int) -> Path:
    """Where piece ``n`` of ``final`` is written before it is put into ``final``: a temporary
    name that reruns sweep and that a sweep keeping ``final`` keeps."""
    return final.with_name(f"{TMP_PREFIX}{final.name}{PIECE_MARK}{n}")


def tmp_final(name: str) -> str:
    """The final name a temporary file (or piece, or a piece's temporary file) of name
    ``name`` is written for."""
    while name.startswith(TMP_PREFIX):
        name = name[len(TMP_PREFIX):]
    return name.partition(PIECE_MARK)[0]


def _no_follow(path: str, flags: int) -> int:
    """Open refusing a symbolic link at the temporary name: it could point anywhere."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o666)


@contextlib.contextmanager
def atomic_open(final: Path, *, durable: bool = True,
                sync_dir: bool = True) -> Iterator[IO[bytes]]:
    """Open a temporary file beside ``final``; on success fsync and rename it into place.

    ``durable=False`` skips the file's fsync (for files that are verified before any use);
    ``sync_dir=False`` leaves the folder's fsync to the caller, who does it once for many
    renames (convert does it before writing the manifest). On any exception the temporary
    file is removed and ``final`` is left untouched.
    """
    tmp = tmp_name(final)
    try:
        f = open(tmp, "wb", opener=_no_follow)
    except OSError as e:
        raise OutputError(
            f"cannot write in {final.parent}: {e.strerror}; check that it exists and is writable"
        ) from e
    try:
        with f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, OutputError):
            what = "disk full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
            raise OutputError(
                f"cannot write {final}: {what}; free space or pick another --out"
            ) from e
        raise
    if durable and sync_dir:
        fsync_dir(final.parent)


def write_bytes_atomic(final: Path, data: bytes, *, durable: bool = True,
                       sync_dir: bool = True) -> None:
    """Write ``data`` to ``final`` atomically."""
    with atomic_open(final, durable=durable, sync_dir=sync_dir) as f:
        f.write(data)


def write_json_atomic(final: Path, obj: Any, *, durable: bool = True) -> None:
    """Write ``obj`` as stable, sorted, indented JSON, atomically (same object, same bytes)."""
    text = json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    write_bytes_atomic(final, text.encode("utf-8"), durable=durable)


def sweep_tmp(folder: Path, keep: Collection[str] = ()) -> int:
    """Remove temporary files a killed run left in ``folder``, and symbolic links planted at
    temporary names (which a write would follow out of the folder); returns how many.

    ``keep``: final names whose temporary files must stay (another process may be writing
    them right now; it replaces its own leftovers when it redoes the work).
    """
    n = 0
    if folder.is_dir():
        for p in folder.iterdir():
            if (p.name.startswith(TMP_PREFIX) and (p.is_symlink() or p.is_file())
                    and tmp_final(p.name) not in keep):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
                    n += 1
    return n


def ensure_writable_dir(path: Path) -> None:
    """Create ``path`` (and parents) or raise an OutputError that says what to do."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(
            f"cannot create output folder {path}: {e.strerror}; pick a writable --out"
        ) from e
    if not os.access(path, os.W_OK | os.X_OK):
        raise OutputError(f"output folder {path} is not writable; pick a writable --out")


def sha256_file(path: Path, chunk: int = 1 << 20,
                between: Callable[[], None] | None = None) -> str:
    """The sha256 of the file at ``path``, read ``chunk`` bytes at a time (unbuffered);
    ``between`` runs before each read, so a caller can stop a long hash by raising there."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while True:
            if between is not None:
                between()
            if not (block := f.read(chunk)):
                return h.hexdigest()
            h.update(block)
