"""The exception hierarchy: every error a user can cause derives from ImgprepError.

Each subclass also derives from the matching builtin, so callers that already catch
``OSError`` or ``ValueError`` keep working. Messages name the file, shard or rank concerned and
say what to do next; the CLI prints them on one line and exits with ``exit_code``.
"""

from __future__ import annotations


class ImgprepError(Exception):
    """Base class for every error imgprep raises on purpose."""

    exit_code = 3


class InputMissingError(ImgprepError, FileNotFoundError):
    """An input path does not exist or cannot be read."""


class SourceFormatError(ImgprepError, ValueError):
    """An input exists but its layout or content is not one imgprep understands."""


class LabelError(ImgprepError, ValueError):
    """Ground truth is missing, ambiguous or inconsistent with the images."""


class UnsafeArchiveError(ImgprepError, ValueError):
    """An archive member that must not be read (links, devices, escaping names)."""


class ImageError(ImgprepError, ValueError):
    """One image could not be converted; recorded in the error log, never fatal by itself."""


class OutputError(ImgprepError, OSError):
    """The output location cannot be written."""


class OutputExistsError(ImgprepError, FileExistsError):
    """The output folder already holds a finished conversion of the split that this run
    would replace (other input, options or format); ``--overwrite`` replaces it."""


class ShardError(ImgprepError, ValueError):
    """A shard file that is damaged: bad header checksum, truncated, unreadable."""


class ManifestError(ImgprepError, ValueError):
    """A manifest is missing, unreadable, or does not describe the files beside it."""


class WorldError(ImgprepError, ValueError):
    """Launcher variables that do not describe a consistent set of ranks."""


class StageError(ImgprepError, OSError):
    """Staging could not complete: corrupt or vanished source, full disk, dead copier."""


class WaitTimeout(ImgprepError, TimeoutError):
    """A rank waited too long for another (a copier, a converting rank) to finish."""



class DependencyError(ImgprepError, ImportError):
    """A package imgprep needs but does not declare is missing or too old: PIL, which may be
    stock Pillow or pillow-simd (docs/install.md). Raised by ``import imgprep``."""
