"""Where stage-to-node reads a converted folder from: a folder, a URL webdataset opens, or an
S3 (or S3-compatible) store.

A *source* answers three things for a file name of the converted folder (a manifest
``<split>.json``, a shard, the sample index, the error log): where it is (for messages), a
stream of its bytes, and (folders only) its local path, so that copies between file systems
stay in the kernel (copy_file_range). Sizes and sha256 come from the manifest, never the source.

URL sources (docs/staging.md, "Sources"):

- ``http://host/path/`` and ``https://…``: the folder served over HTTP; each file is fetched
  from the base URL plus its name (a missing trailing ``/`` is added);
- ``pipe:COMMAND``: a shell command that writes one file to stdout; ``{}`` in it stands for the
  file name (shell-quoted when it is not a plain name), e.g.
  ``pipe:aws s3 cp s3://bucket/imagenet/{} -``.

Both are opened with ``webdataset.gopen`` (its ``gopen_schemes``: curl for http(s), a shell for
``pipe:``). A stream fails (``FetchFailed``) when the command or curl exits non-zero: closing
it checks the exit status, so a copy counts as read only once the fetch is known to be whole.
It also fails when no byte arrives for ``STALL_S`` seconds (a server that stops sending, a
hung command): curl alone would wait for ever, and so would the node's ranks behind it.
A URL has no listing: name the split (``--split``).

``s3://BUCKET/PREFIX/`` is read with boto3 (imgprep.stage.s3). Sources are found by their
URL's scheme in ``SCHEMES``, as timm's reader factory picks a reader by prefix: the module
holding one is imported only when a URL of its scheme is used, so boto3 (the optional extra
``imgprep[s3]``) loads for ``s3://`` alone.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import io
import os
import shlex
from pathlib import Path
from types import TracebackType
from typing import Any, cast
from urllib.parse import quote, urlsplit

from imgprep.errors import ManifestError
from imgprep.procs import readable
from imgprep.shards.manifest import find_manifests, manifest_path

SCHEMES = {  # URL prefix -> "module:class" of its Source, imported on first use
    "http://": "imgprep.stage.remote:UrlSource", "https://": "imgprep.stage.remote:UrlSource",
    "pipe:": "imgprep.stage.remote:UrlSource", "s3://": "imgprep.stage.s3:S3Source"}
URL_PREFIXES = tuple(SCHEMES)
NAME_SLOT = "{}"  # where a pipe: command takes the file name
STALL_S = 300.0  # a fetch that delivers no byte for this long is abandoned (curl's retries fit)
CURL_EXITS = {6: "host not found", 7: "connection refused or host unreachable",
              18: "the transfer was cut short", 22: "the server answered with an HTTP error "
              "(404 not found, or another 4xx/5xx)", 28: "timed out", 35: "TLS handshake "
              "failed", 52: "the server sent nothing", 56: "the connection was reset"}


class FetchFailed(OSError):
    """A URL could not be read whole (``strerror`` says why); callers name the URL.
    ``advice``, when set, is the next step (else the caller's own)."""

    def __init__(self, code: int | None, why: str, advice: str | None = None) -> None:
        super().__init__(code, why)
        self.advice = advice


def is_url(text: str) -> bool:
    """Whether ``--src`` text is a URL (else a folder)."""
    return text.startswith(URL_PREFIXES)


def source_class(url: str) -> type[Source]:
    """The Source class for ``url``'s scheme (``SCHEMES``), or a ValueError saying which
    schemes there are."""
    spec = next((v for k, v in SCHEMES.items() if url.startswith(k)), None)
    if spec is None:
        raise ValueError(f"{url!r}: expected http(s)://HOST/PATH/, s3://BUCKET/PREFIX/ or "
                         "pipe:COMMAND (or a folder)")
    module, name = spec.split(":")
    cls: type[Source] = getattr(importlib.import_module(module), name)
    return cls


def check_url(url: str) -> str:
    """``url`` spelled one way if it is a source URL stage-to-node can read, else a
    ValueError saying why."""
    return source_class(url).check(url)


def check_http_or_pipe(url: str) -> str:
    """``check_url`` for http(s) and ``pipe:`` URLs."""
    if url.startswith("pipe:"):
        if NAME_SLOT not in url:
            raise ValueError(f"{url!r}: a pipe: source needs {NAME_SLOT} where the file name "
                             "goes, e.g. 'pipe:aws s3 cp s3://bucket/imagenet/{} -'")
        return url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or \
            parts.fragment:
        raise ValueError(f"{url!r}: expected http(s)://HOST/PATH/ (the converted folder's "
                         "URL, without query or fragment) or pipe:COMMAND")
    return url if url.endswith("/") else url + "/"


class Source:
    """A converted folder to stage from (see the module docstring)."""

    folder: Path | None = None  # set for local folders: their files are read by path

    @classmethod
    def check(cls, url: str) -> str:
        """``url`` spelled one way, or a ValueError saying what is wrong with it."""
        raise ValueError(f"{url!r} is not a URL")

    @classmethod
    def from_url(cls, url: str, stall_s: float) -> Source:
        """The source behind ``url`` (checked); a read silent for ``stall_s`` s fails."""
        raise ValueError(f"{url!r} is not a URL")

    def where(self, name: str) -> str:
        """How messages name file ``name`` of the source."""
        raise NotImplementedError

    def open(self, name: str) -> io.RawIOBase:
        """An unbuffered stream of file ``name``; OSError (FetchFailed for URLs) when it
        cannot be read whole, raised at the latest when the stream is closed."""
        raise NotImplementedError

    def manifests(self, split: str | None) -> list[str]:
        """The file names of the manifests to stage (one split, or all that are found)."""
        raise NotImplementedError

    def read(self, name: str) -> bytes:
        """The whole of a small file (a manifest, the error log)."""
        with self.open(name) as f:
            return f.readall()


class FolderSource(Source):
    """A converted folder on a (shared) file system."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __str__(self) -> str:
        return str(self.folder)

    def where(self, name: str) -> str:
        return str(self._path(name))

    def _path(self, name: str) -> Path:
        return cast(Path, self.folder) / name

    def open(self, name: str) -> io.RawIOBase:
        return open(self._path(name), "rb", buffering=0)

    def manifests(self, split: str | None) -> list[str]:
        folder = cast(Path, self.folder)
        if split:
            return [manifest_path(folder, split).name]
        return [p.name for p in find_manifests(folder)]


class UrlSource(Source):
    """A converted folder behind an http(s) base URL or a ``pipe:`` command."""

    @classmethod
    def check(cls, url: str) -> str:
        return check_http_or_pipe(url)

    @classmethod
    def from_url(cls, url: str, stall_s: float) -> Source:
        return cls(url, stall_s)

    def __init__(self, url: str, stall_s: float | None = None) -> None:
        self.url = check_http_or_pipe(url)
        self.stall_s = STALL_S if stall_s is None else stall_s

    def __str__(self) -> str:
        return self.url

    def where(self, name: str) -> str:
        if self.url.startswith("pipe:"):
            return self.url.replace(NAME_SLOT, shlex.quote(name))
        return self.url + quote(name)

    def open(self, name: str) -> io.RawIOBase:
        from webdataset.gopen import gopen

        url = self.where(name)
        try:
            pipe = gopen(url, "rb")
        except FileNotFoundError as e:  # no curl, or no shell
            raise FetchFailed(errno.ENOENT, f"cannot start {e.filename or 'curl'} (install "
                                            "it: webdataset runs it to fetch)") from e
        except ValueError as e:  # webdataset refuses (WDS_SECURE=1) or knows no such scheme
            raise FetchFailed(errno.EPERM, f"webdataset will not open it ({e})") from e
        return Fetch(pipe, url.startswith("pipe:"), self.stall_s)

    def manifests(self, split: str | None) -> list[str]:
        if not split:
            raise ManifestError(f"{self.url} is a URL, which cannot be listed: name the split "
                                "with --split (once per split)")
        return [manifest_path(Path(), split).name]


class Fetch(io.RawIOBase):
    """A webdataset ``Pipe`` (curl or a shell command) as a raw binary stream. Each read
    returns what the command has written (waiting at most ``stall_s`` seconds for a byte, else
    the command is killed and FetchFailed raised). Closing it waits for the command and raises
    FetchFailed unless it exited 0; leaving a ``with`` block on an error kills the command
    instead (the error at hand is the one to report)."""

    def __init__(self, pipe: Any, is_command: bool, stall_s: float = STALL_S) -> None:
        super().__init__()
        self.pipe, self.is_command, self.stall_s = pipe, is_command, stall_s
        self._fd: int = pipe.stream.fileno()  # read directly: only this object reads it

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if not readable(self._fd, self.stall_s):
            with contextlib.suppress(OSError):
                self.pipe.proc.kill()
            who = "the command" if self.is_command else "the server"
            raise FetchFailed(errno.ETIMEDOUT, f"no data for {self.stall_s:g} s: {who} "
                                               "stalled (the copy is abandoned)")
        try:
            return os.readv(self._fd, [b])
        except OSError as e:
            who = "the command" if self.is_command else "curl"
            raise FetchFailed(e.errno, f"reading from {who} failed ({e.strerror})") from e

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        try:
            self.pipe.close()
        except OSError as e:
            raise self._failed() from e

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
            return
        with contextlib.suppress(OSError):
            self.pipe.proc.kill()
        with contextlib.suppress(Exception):  # its exit status says only that it was killed
            self.close()

    def _failed(self) -> FetchFailed:
        status = self.pipe.status
        if self.is_command:
            why = f"the command exited with status {status}"
        else:
            why = CURL_EXITS.get(status, f"curl exited with status {status}")
        return FetchFailed(errno.EIO, why)


def source_of(src: Path | str, stall_s: float = STALL_S) -> Source:
    """The source ``--src`` names: a URL (``is_url``, by its scheme: ``SCHEMES``; a fetch
    silent for ``stall_s`` seconds is abandoned) or a folder."""
    if isinstance(src, str) and is_url(src):
        return source_class(src).from_url(src, stall_s)
    return FolderSource(Path(src))
