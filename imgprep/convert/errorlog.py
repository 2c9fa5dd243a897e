"""The error log: one ``ErrorRecord`` per image that could not be converted or archive member
that was refused, written as ``<out>/<split>-errors.jsonl``; and the warnings log: one
``WarningRecord`` per image that converted whole although reading it found something odd
(libjpeg's warnings, trailing bytes), written as ``<out>/<split>-warnings.jsonl``.

Each line is ``{"key", "reason", "source"}`` (``{"key", "source", "warning"}`` in the
warnings log; sorted keys, UTF-8 as written, one object a line; docs/formats.md): ``source``
is the input path of the image (``<tar>/<member>`` inside a tar), ``key`` its sample key
(empty for a listing problem), ``reason`` what went wrong, ``warning`` what was found. Task
records keep both in the same form until the manifest is written.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgprep.fsutil import write_bytes_atomic


@dataclass(frozen=True, kw_only=True)
class ErrorRecord:
    """One failed image or refused member: where it is, its key, and why."""

    source: str
    key: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"source": self.source, "key": self.key, "reason": self.reason}

    @classmethod
    def from_json(cls, d: Any) -> ErrorRecord:
        """The record of one decoded line; ValueError when it is not one."""
        if not isinstance(d, dict) or set(d) != {"source", "key", "reason"} or not all(
                isinstance(v, str) for v in d.values()):
            raise ValueError(f"not an error record: {d!r}")
        return cls(source=d["source"], key=d["key"], reason=d["reason"])


@dataclass(frozen=True, kw_only=True)
class WarningRecord:
    """One image converted whole with a warning: where it is, its key, and what was found."""

    source: str
    key: str
    warning: str

    def to_json(self) -> dict[str, str]:
        return {"source": self.source, "key": self.key, "warning": self.warning}

    @classmethod
    def from_json(cls, d: Any) -> WarningRecord:
        """The record of one decoded line; ValueError when it is not one."""
        if not isinstance(d, dict) or set(d) != {"source", "key", "warning"} or not all(
                isinstance(v, str) for v in d.values()):
            raise ValueError(f"not a warning record: {d!r}")
        return cls(source=d["source"], key=d["key"], warning=d["warning"])


def error_log_path(out: Path, split: str) -> Path:
    return out / f"{split}-errors.jsonl"


def warning_log_path(out: Path, split: str) -> Path:
    return out / f"{split}-warnings.jsonl"


def write_error_log(path: Path, errors: Sequence[ErrorRecord | WarningRecord]) -> Path | None:
    """Write ``errors`` (or warnings) to ``path`` atomically (returns it), or remove a stale
    log when there are none (returns None)."""
    if not errors:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return None
    write_bytes_atomic(path, "".join(json.dumps(e.to_json(), sort_keys=True, ensure_ascii=False)
                                     + "\n" for e in errors).encode())
    return path
