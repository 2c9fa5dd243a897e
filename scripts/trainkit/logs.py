"""Where the libraries' notes and warnings go in a training run.

``imgprep`` and ``loaders`` log through ``logging.getLogger("imgprep")`` / ``("loaders")`` and
add no handlers; the application decides. The trainer sends theirs and its own
(``train_imagenet``) to stderr, one line each: rank 0 shows notes (INFO) and warnings, the other
ranks warnings only, so a job of many ranks prints each note once.
"""

from __future__ import annotations

import logging
import sys

from imgprep import World

LOGGERS = ("imgprep", "loaders", "train_imagenet")


class LineFormatter(logging.Formatter):
    """``name: message`` for a note, ``name: warning: message`` (or error, ...) above."""

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        return f"{record.name}: {level}{super().format(record)}"


def configure_logging(world: World) -> None:
    """One stderr handler for each of ``LOGGERS``, at INFO on rank 0 and WARNING elsewhere
    (called again, it replaces the handler it set before)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter())
    for name in LOGGERS:
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if isinstance(h.formatter, LineFormatter)]:
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO if world.rank == 0 else logging.WARNING)
        logger.propagate = False
