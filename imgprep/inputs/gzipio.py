"""Reading a gzip stream front to back: the standard library's ``gzip`` (zlib), or
zlib-ng's when it is installed (the optional extra ``imgprep[gzip]``: the ``zlib-ng``
wheel), about twice as fast on JPEG-filled tars (docs/convert.md has the figures).

Both give the same bytes; only the speed differs. A damaged or cut-short stream raises one
of ``GZIP_ERRORS`` either way.
"""

from __future__ import annotations

import gzip
import importlib
import sys
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import IO, cast

from imgprep.errors import SourceFormatError, UnsafeArchiveError
from imgprep.inputs.reader import over_cap
from imgprep.inputs.spool import Item, Refused
from imgprep.shards.tarfmt import iter_stream


def _optional(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


_GZIP_NG = _optional("zlib_ng.gzip_ng")
_ZLIB_NG = _optional("zlib_ng.zlib_ng")

# What a damaged or cut-short stream raises, whichever inflate reads it.
GZIP_ERRORS: tuple[type[BaseException], ...] = (EOFError, zlib.error, gzip.BadGzipFile) + (
    (_ZLIB_NG.error,) if _ZLIB_NG is not None else ())


def inflater() -> str:
    """Which inflate ``open_gzip`` uses: ``zlib-ng`` or ``zlib``."""
    return "zlib-ng" if _GZIP_NG is not None else "zlib"


def open_gzip(path: Path | IO[bytes]) -> IO[bytes]:
    """The decompressed bytes of ``path`` (a file name, or a file open for reading, which
    stays the caller's to close) as a binary file read front to back."""
    if _GZIP_NG is not None:
        return cast("IO[bytes]", _GZIP_NG.open(path, "rb"))
    return cast("IO[bytes]", gzip.open(path, "rb"))


@contextmanager
def _compressed(path: Path, progress: bool) -> Iterator[Path | IO[bytes]]:
    """``path`` itself, or with ``progress`` the file open with a progress bar of the
    compressed bytes read on stderr (shown where stderr is a terminal)."""
    if not progress:
        yield path
        return
    from tqdm import tqdm
    from tqdm.utils import CallbackIOWrapper

    with open(path, "rb") as raw, tqdm(total=path.stat().st_size, desc=f"reading {path.name}",
                                       unit="B", unit_scale=True, file=sys.stderr,
                                       disable=None) as bar:
        yield cast("IO[bytes]", CallbackIOWrapper(bar.update, raw, "read"))


def damaged(source: Path, error: BaseException) -> SourceFormatError:
    """The error for a stream of ``source`` that ``GZIP_ERRORS``' ``error`` cut short."""
    return SourceFormatError(f"{source}: the compressed stream is damaged or cut short "
                             f"({error}); re-download it")


def gzip_members(source: Path, keep: Callable[[str], bool], whose: str,
                 max_bytes: int | None = None, progress: bool = False) -> Iterator[Item]:
    """Every member of the gzip-compressed tar ``source`` with its bytes (empty for a member
    ``keep`` turns down: only its name is kept, its bytes skipped unread), in archive order;
    a kept member over ``max_bytes`` (by its header) is ``Refused`` and skipped unread.
    Refuses the archive at a member that must not be read (``whose``: the archive it should
    have been). ``progress``: as ``open_gzip``'s."""
    def wanted(name: str, size: int) -> bool:
        return keep(name) and (max_bytes is None or size <= max_bytes)

    try:
        with _compressed(source, progress) as raw, open_gzip(raw) as f:
            for m in iter_stream(f, str(source), keep=wanted):
                if m.refused is not None:
                    raise UnsafeArchiveError(
                        f"{source}: member {m.name!r} {m.refused}; refused: this is not "
                        f"{whose}, or it was altered")
                if m.data is not None:
                    yield m.name, m.data
                elif max_bytes is not None and keep(m.name):
                    yield m.name, Refused(over_cap(
                        f"its tar header records {m.size:,} bytes", max_bytes))
                else:
                    yield m.name, b""
    except GZIP_ERRORS as e:  # what zlib-ng's inflate raises (zlib's: iter_stream's message)
        raise damaged(source, e) from None
