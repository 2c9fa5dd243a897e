"""An S3 bucket (or an S3-compatible store: MinIO, Ceph, …) as a stage-to-node source.

``--src s3://BUCKET/PREFIX/`` names a converted folder uploaded under ``PREFIX`` (``aws s3
sync OUT s3://BUCKET/PREFIX/``): file ``NAME`` of the folder (a manifest ``<split>.json``,
a shard, the sample index, the error log) is object ``PREFIX + NAME``. As with every source,
sizes and sha256 come from the manifest, which is read first; the copier streams each object
to a temporary name, checks it and renames it (imgprep.stage.copier).

- **boto3** (the optional extra ``imgprep[s3]``) is imported when an ``s3://`` source is made;
  without it, staging stops with one line saying ``pip install imgprep[s3]``.
- **Configuration** is AWS's own: boto3's default chain finds the credentials (environment,
  ``AWS_PROFILE``, ``~/.aws/credentials`` and ``config``, a container or instance role) and
  the region, and boto3 >= 1.28 reads ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (an
  S3-compatible store) itself.
- **Parallel parts.** An object is read by ranged GETs of ``PART`` bytes, up to ``AHEAD`` at
  once, and handed out in order as the bytes arrive; every part after the first asks for the
  first one's ETag (``If-Match``), so an object replaced mid-read fails instead of mixing two
  versions. With the copier's ``--jobs`` streams, a node has up to ``jobs x AHEAD`` GETs
  in flight; fan-out's reader, one stream, has ``AHEAD``.
- **Stalls.** A read waits at most ``stall_s`` seconds (``--stall-timeout``) for a byte;
  botocore's read timeout is the same, and it makes at most ``ATTEMPTS`` attempts a request
  (5xx, throttling, a reset connection). A stuck request is left to its daemon thread.
- **Errors** are ``FetchFailed`` with a reason and the next step (``advice``): no
  credentials, credentials refused, no such bucket, no such object, access denied, a store
  that cannot be reached, a stall, a broken connection. Callers put the URL in front.
"""

from __future__ import annotations

import errno
import io
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from imgprep.errors import ManifestError, StageError
from imgprep.shards.manifest import manifest_path
from imgprep.stage.remote import STALL_S, FetchFailed, Source

PART = 8 << 20  # bytes a ranged GET asks for
AHEAD = 4  # parts of one object fetched at once
READ_CHUNK = 1 << 20  # bytes a part's thread reads from its response at a time
ATTEMPTS = 3  # botocore's attempts a request (standard retry mode)
POOL = 64  # HTTP connections kept to the store
POLL = 0.2  # seconds between two looks at a stalled read
BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,61}[A-Za-z0-9]$")
INSTALL = "pip install imgprep[s3]"


def parse(url: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://BUCKET/PREFIX/`` (the prefix ends with ``/`` unless
    empty), or a ValueError saying what is wrong."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not BUCKET.match(parts.netloc) or parts.query or \
            parts.fragment:
        raise ValueError(f"{url!r}: expected s3://BUCKET/PREFIX/ (a bucket name of 3 to 63 "
                         "letters, digits, dots and hyphens; no query or fragment)")
    prefix = parts.path.lstrip("/")
    return parts.netloc, prefix if not prefix or prefix.endswith("/") else prefix + "/"


class S3Source(Source):
    """A converted folder under ``s3://BUCKET/PREFIX/`` (see the module docstring)."""

    def __init__(self, url: str, stall_s: float = STALL_S) -> None:
        self.bucket, self.prefix = parse(url)
        self.url = f"s3://{self.bucket}/{self.prefix}"
        self.stall_s, self.part, self.ahead = stall_s, PART, AHEAD
        try:
            import boto3  # type: ignore[import-untyped]  # noqa: F401
        except ImportError:
            raise StageError(f"--src {self.url} needs boto3, which is not installed: "
                             f"{INSTALL} (or pip install boto3), then rerun") from None
        self._client: Any = None
        self._lock = threading.Lock()

    @classmethod
    def check(cls, url: str) -> str:
        bucket, prefix = parse(url)
        return f"s3://{bucket}/{prefix}"

    @classmethod
    def from_url(cls, url: str, stall_s: float) -> Source:
        return cls(url, stall_s)

    def __str__(self) -> str:
        return self.url

    def where(self, name: str) -> str:
        return self.url + name

    def client(self) -> Any:
        """The boto3 S3 client (one a source; clients are thread-safe)."""
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config  # type: ignore[import-untyped]

                config = Config(connect_timeout=min(self.stall_s, 60.0),
                                read_timeout=self.stall_s, max_pool_connections=POOL,
                                retries={"mode": "standard", "total_max_attempts": ATTEMPTS})
                self._client = boto3.session.Session().client("s3", config=config)
            return self._client

    def endpoint(self) -> str:
        """The store's address, for messages."""
        return str(self._client.meta.endpoint_url) if self._client is not None else "S3"

    def open(self, name: str) -> io.RawIOBase:
        try:
            client = self.client()
        except Exception as e:  # botocore: a profile that is not there, a bad config file
            raise fetch_error(e, self, "") from e
        return S3Stream(self, client, self.prefix + name)

    def manifests(self, split: str | None) -> list[str]:
        if not split:
            raise ManifestError(f"{self.url}: name the split to stage with --split (once per "
                                "split)")
        return [manifest_path(Path(), split).name]


@dataclass
class _Part:
    """One ranged GET: where it starts, its bytes so far, and how it ended."""

    start: int
    data: bytearray
    filled: int = 0
    done: bool = False
    error: FetchFailed | None = None


class S3Stream(io.RawIOBase):
    """One object read by ranged GETs on daemon threads, ``ahead`` parts at once, handed out
    in order as they arrive (see the module docstring). A read that waits ``stall_s``
    seconds for a byte raises FetchFailed; so does any part's error."""

    def __init__(self, source: S3Source, client: Any, key: str) -> None:
        super().__init__()
        self.source, self.s3, self.key = source, client, key
        self.cond = threading.Condition()
        self.parts: dict[int, _Part] = {}
        self.size: int | None = None  # learnt from the first part's answer
        self.etag: str | None = None
        self.cur = self.pos = 0  # the part being read and the offset in it
        self.started = 0  # parts started
        self.last = time.monotonic()  # when a byte last arrived or a part last started
        with self.cond:
            self._start_parts()

    def readable(self) -> bool:
        return True

    def _start_parts(self) -> None:
        """Start the parts of the window ``cur .. cur + ahead - 1`` (the first alone until
        the size is known). Called with ``cond`` held."""
        part, ahead = self.source.part, self.source.ahead
        end = 1 if self.size is None else -(-self.size // part)
        if self.closed:
            return
        while self.started < min(end, self.cur + ahead):
            i = self.started
            p = self.parts[i] = _Part(i * part, bytearray())
            self.started += 1
            self.last = time.monotonic()
            threading.Thread(target=self._fetch, args=(i, p), name="s3-part",
                             daemon=True).start()

    def _fetch(self, i: int, p: _Part) -> None:
        try:
            body, length = self._get(i, p)
            with self.cond:
                p.data = bytearray(length)
            while p.filled < length and not self.closed:
                block = body.read(min(READ_CHUNK, length - p.filled))
                if not block:
                    raise FetchFailed(errno.EIO, "the store sent fewer bytes than it said",
                                      "check the network and the store, then rerun to resume")
                with self.cond:
                    p.data[p.filled:p.filled + len(block)] = block
                    p.filled += len(block)
                    self.last = time.monotonic()
                    self.cond.notify_all()
            body.close()
            with self.cond:
                p.done = True
                self.cond.notify_all()
        except Exception as e:
            with self.cond:
                p.error = fetch_error(e, self.source, self.key)
                self.cond.notify_all()

    def _get(self, i: int, p: _Part) -> tuple[Any, int]:
        """GET part ``i``'s range; learn the object's size and ETag from the first. Returns
        the body and the part's length."""
        from botocore.exceptions import ClientError  # type: ignore[import-untyped]

        kw: dict[str, Any] = {"Bucket": self.source.bucket, "Key": self.key,
                              "Range": f"bytes={p.start}-{p.start + self.source.part - 1}"}
        if self.etag is not None:
            kw["IfMatch"] = self.etag
        try:
            r = self.s3.get_object(**kw)
        except ClientError as e:
            if i or e.response.get("Error", {}).get("Code") != "InvalidRange":
                raise
            r = self.s3.get_object(Bucket=self.source.bucket, Key=self.key)  # empty object
        length = int(r["ContentLength"])
        if i == 0:
            total = str(r.get("ContentRange") or f"/{length}").rpartition("/")[2]
            with self.cond:
                self.size, self.etag = int(total), r.get("ETag")
                self._start_parts()
        want = min(self.source.part, (self.size or 0) - p.start)
        if length != want:
            raise FetchFailed(errno.EIO, f"the store sent {length} bytes for a part of "
                              f"{want}: the object changed while it was read",
                              "rerun once the upload is finished")
        return r["Body"], length

    def readinto(self, b: Any) -> int:
        out = memoryview(b).cast("B")
        with self.cond:
            while True:
                if self.size is not None and self.cur * self.source.part >= self.size:
                    return 0
                p = self.parts[self.cur]
                if p.error is not None:
                    raise p.error
                if self.pos < p.filled:
                    n = min(len(out), p.filled - self.pos)
                    out[:n] = memoryview(p.data)[self.pos:self.pos + n]
                    self.pos += n
                    if p.done and self.pos == p.filled:
                        self._next_part()
                    return n
                if p.done:
                    self._next_part()
                    continue
                if (idle := time.monotonic() - self.last) > self.source.stall_s:
                    raise stalled(self.source)
                self.cond.wait(min(POLL, self.source.stall_s - idle + 0.01))

    def _next_part(self) -> None:
        del self.parts[self.cur]
        self.cur, self.pos = self.cur + 1, 0
        self._start_parts()

    def close(self) -> None:
        """Stop reading (part threads end at their next block) and let the parts go."""
        if not self.closed:
            super().close()
            with self.cond:
                self.parts.clear()


def stalled(source: S3Source) -> FetchFailed:
    return FetchFailed(errno.ETIMEDOUT, f"no data for {source.stall_s:g} s: the store "
                       "stalled", "check the network and the store "
                       f"({source.endpoint()}), then rerun to resume (or raise --stall-timeout)")


def fetch_error(e: BaseException, source: S3Source, key: str) -> FetchFailed:
    """What a boto3 error reading ``key`` means, as a FetchFailed with its next step."""
    from botocore import exceptions as bx  # type: ignore[import-untyped]

    if isinstance(e, FetchFailed):
        return e
    if isinstance(e, bx.ClientError):
        return _answer(e, source, key)
    if isinstance(e, bx.NoCredentialsError | bx.PartialCredentialsError):
        return FetchFailed(errno.EACCES, "no AWS credentials found", "set AWS_ACCESS_KEY_ID "
                           "and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run aws configure "
                           "(boto3 looks in the environment, ~/.aws/credentials and "
                           "~/.aws/config, then a container or instance role), then rerun")
    if isinstance(e, bx.ReadTimeoutError):
        return stalled(source)
    if isinstance(e, bx.EndpointConnectionError | bx.ConnectTimeoutError):
        return FetchFailed(errno.ECONNREFUSED, f"cannot connect to {source.endpoint()}",
                           "check the network, and AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3) "
                           "for an S3-compatible store, then rerun")
    if isinstance(e, bx.ResponseStreamingError | bx.IncompleteReadError |
                  bx.ConnectionClosedError):
        return FetchFailed(errno.EIO, f"the connection to {source.endpoint()} broke mid-object",
                           "check the network and the store, then rerun to resume")
    return FetchFailed(errno.EIO, f"{type(e).__name__}: {e}", "check --src, the AWS "
                       "configuration (AWS_PROFILE, ~/.aws/config) and the store, then rerun")


def _answer(e: Any, source: S3Source, key: str) -> FetchFailed:
    """A ClientError: the store answered with an error code."""
    err = e.response.get("Error", {})
    code = str(err.get("Code", "?"))
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code == "NoSuchBucket":
        return FetchFailed(errno.ENOENT, f"no bucket {source.bucket} at {source.endpoint()} "
                           "(NoSuchBucket)", "check the bucket in --src (aws s3 ls lists "
                           "yours) and, for an S3-compatible store, AWS_ENDPOINT_URL, then rerun")
    if code in ("NoSuchKey", "404") and key.endswith(".json"):  # a manifest: no folder here
        return FetchFailed(errno.ENOENT, "no such object (NoSuchKey)", "check the prefix in "
                           f"--src (aws s3 ls {source.url}) or upload the converted folder "
                           f"there (aws s3 sync OUT {source.url}), then rerun")
    if code in ("NoSuchKey", "404"):
        return FetchFailed(errno.ENOENT, "no such object (NoSuchKey)", "the upload is "
                           "incomplete: upload the converted folder again (aws s3 sync OUT "
                           f"{source.url} sends what is missing), then rerun to resume")
    if code in ("AccessDenied", "403", "AllAccessDisabled") or status == 403 and code not in \
            ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"):
        return FetchFailed(errno.EACCES, f"access denied ({code}, HTTP 403)", "the credentials "
                           "in use may not read it: grant them s3:GetObject on "
                           f"{source.url}* or use others (AWS_PROFILE), then rerun")
    if status == 403:
        return FetchFailed(errno.EACCES, f"the store refused the credentials ({code})", "check "
                           "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, "
                           "AWS_SESSION_TOKEN), and that they are this store's "
                           "(AWS_ENDPOINT_URL), then rerun")
    if code == "PreconditionFailed":
        return FetchFailed(errno.EIO, "the object was replaced while it was read (its ETag "
                           "changed)", "rerun once the upload is finished")
    message = str(err.get("Message", "")).rstrip(".")
    return FetchFailed(errno.EIO, f"the store answered {code} (HTTP {status})"
                       + (f": {message}" if message else ""), "check --src and the store, "
                       "then rerun")
