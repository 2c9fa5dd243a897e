"""Where the library's warnings and notes go when it runs as the ``imgprep`` command.

The library logs to ``imgprep`` and its children (one logger a module) and adds no handler of
its own; the command adds one that prints each record as one line on stderr, through click
(so a test's runner sees it): ``imgprep: warning: …`` for a warning, ``imgprep: …`` for a
note. ``--quiet`` keeps the warnings and drops the notes; errors are the commands' own lines.
A command's own warnings go the same way (``warn``), so that every warning has one prefix.
"""

from __future__ import annotations

import logging

import click

LIBRARY_LOGGER = "imgprep"


class _Echo(logging.Handler):
    """One line on stderr a record, wherever stderr is at the time of the record."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(self.format(record), err=True)
        except Exception:  # a closed stream: logging's own rule, reported and not raised
            self.handleError(record)


class _Lines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.ERROR:
            prefix = "imgprep: error: "
        elif record.levelno >= logging.WARNING:
            prefix = "imgprep: warning: "
        else:
            prefix = "imgprep: "
        return prefix + super().format(record)


def configure_logging(quiet: bool) -> None:
    """Print the library's records on stderr from notes (INFO) up, or from warnings up when
    ``quiet``; a second call (another command in the same process) replaces the first."""
    logger = logging.getLogger(LIBRARY_LOGGER)
    for old in [h for h in logger.handlers if isinstance(h, _Echo)]:
        logger.removeHandler(old)
    handler = _Echo()
    handler.setFormatter(_Lines())
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)


def warn(message: str) -> None:
    """A command's own warning, printed as the library's are: ``imgprep: warning: …``."""
    logging.getLogger(f"{LIBRARY_LOGGER}.cli").warning(message)
