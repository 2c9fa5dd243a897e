"""The tar format, one home: blocks, headers written and read, the members never to read, and
a walk over an archive's members, by offset or as a stream.

Every module that writes or reads tar bytes goes through this one: the shard writer
(``writers``), the strict shard reader (``tario``) and the layouts of the sample index
(``layout``), the loaders' per-sample header check, and the input listing (``tarscan``).

- Writing: ``header_bytes(name, size)`` is the fixed header imgprep writes (mtime 0, uid/gid
  0, no user names, mode 0644), byte for byte what ``tarfile`` writes for ``tar_header``
  (``headers_written`` tests many headers against it at once, for the loaders' reader);
  ``padding`` and ``end_of_archive`` close members and archives as ``tarfile`` does.
- Reading follows ``tarfile`` wherever it decides something: header checksums (unsigned, as
  POSIX), octal and GNU base-256 numbers, the ustar name prefix, the old regular type with a
  trailing slash meaning a folder, pax records (``path``, ``size``, sparse maps; global
  records apply to every later member) and GNU long names. What it cannot decode raises
  ``HeaderError``, which each reader turns into its own error naming the file and what to do.
- ``refusal(kind, name)`` says why a member must not be read (links, devices, fifos, sparse
  files, absolute names, ``..`` components), for every reader alike.
- ``walk`` yields the members of an archive read by offset (``os.pread``, a buffer in memory,
  a window of an outer tar); ``iter_stream`` reads the regular members of an archive that can
  only be read front to back (``gzip.GzipFile`` over a ``.tar.gz``) with their bytes.
"""

from __future__ import annotations

import gzip
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol
from zlib import adler32

import numpy as np

from imgprep.errors import SourceFormatError

BLOCK = 512  # a tar is made of 512-byte blocks: each header is one, data is padded to them
RECORD = 20 * BLOCK  # archives are padded to whole 10 KiB records, as tarfile does
ZERO_BLOCK = bytes(BLOCK)
MAX_EXTENSION = 1 << 20  # the largest pax or GNU long-name header read (a name, not data)
MAX_MEMBER = 1 << 30  # iter_stream's default cap on a member read into memory

REGULAR = b"0"
FOLDER = b"5"
FILE_KINDS = frozenset((b"0", b"7", b"S"))  # a file's data follows (tarfile's regular types)
_NO_DATA_KINDS = frozenset((b"1", b"2", b"3", b"4", b"5", b"6"))  # the size stores no data
_EXTENSIONS = frozenset((b"x", b"g", b"L", b"K"))  # pax, global pax, GNU long name and link
_REFUSED = {b"1": "is a hard link", b"2": "is a symbolic link", b"3": "is a character device",
            b"4": "is a block device", b"6": "is a fifo", b"S": "is a sparse file"}

ReadAt = Callable[[int, int], bytes]  # (size, offset) -> bytes, as os.pread without its fd


class HeaderError(ValueError):
    """A tar header or member that does not decode (checksum, number, cut short): a signal
    that each reader turns into its own error (``ShardError``, ``SourceFormatError`` …)
    naming the file and the next step."""


# ---------------------------------------------------------------------------- blocks


def padded(size: int) -> int:
    """``size`` rounded up to whole blocks: the bytes a member's data takes in the archive."""
    return -(-size // BLOCK) * BLOCK


def padding(size: int) -> bytes:
    """The zero bytes that follow ``size`` bytes of member data."""
    return ZERO_BLOCK[:-size % BLOCK]


def end_of_archive(size: int) -> bytes:
    """What closes an archive of ``size`` bytes so far: two zero blocks, then zeros up to a
    whole record, as ``tarfile`` writes."""
    return bytes(2 * BLOCK + (-(size + 2 * BLOCK) % RECORD))


# ---------------------------------------------------------------------------- writing


def tar_header(name: str, size: int) -> tarfile.TarInfo:
    """A regular member's ``TarInfo`` with every machine-dependent field fixed."""
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode = size, 0, 0o644
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.type = tarfile.REGTYPE
    return ti


_USTAR_MODE_IDS = b"0000644\x000000000\x000000000\x00"  # bytes 100-124: mode, uid, gid
_USTAR_MTIME = b"00000000000\x00"  # bytes 136-148
_USTAR_MAGIC = b"ustar\x0000"  # bytes 257-265
# Sum of every fixed header byte, the checksum field counted as 8 spaces (as POSIX says).
_USTAR_FIXED_SUM = sum(_USTAR_MODE_IDS) + sum(_USTAR_MTIME) + 8 * 32 + ord("0") + sum(_USTAR_MAGIC)


def header_bytes(name: str, size: int) -> bytes:
    """The header block(s) of a regular member ``name`` of ``size`` bytes.

    Short ASCII names (every ImageNet key) get a ustar header assembled here from fixed parts,
    its checksum the fixed parts' sum plus the name's and size's, byte for byte what
    ``tarfile`` writes but ~20x cheaper; anything else goes through ``tarfile``'s pax encoder.
    """
    if len(name) <= 100 and name.isascii() and size < 8**11:
        n = name.encode("ascii")
        sz = b"%011o\x00" % size
        chk = b"%06o\x00 " % (_USTAR_FIXED_SUM + sum(n) + sum(sz))
        return b"".join((n, ZERO_BLOCK[len(n):100], _USTAR_MODE_IDS, sz, _USTAR_MTIME, chk,
                         b"0", ZERO_BLOCK[:100], _USTAR_MAGIC, ZERO_BLOCK[265:]))
    return tar_header(name, size).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


_TEMPLATE = np.frombuffer(header_bytes("", 0), np.uint8)  # the fixed parts, where they lie
_OCTAL = {n: 3 * np.arange(n - 1, -1, -1) for n in (6, 11)}  # digit shifts, most first


def headers_written(blocks: np.ndarray, sizes: np.ndarray, suffixes: list[bytes]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``header_bytes``' test for many headers at once: which rows of ``blocks`` (n x BLOCK
    uint8) are byte for byte the ustar header ``header_bytes`` writes for their own name and
    ``sizes[i]``, that name ASCII, shorter than 100 bytes and ending with ``suffixes[i]``;
    and each row's name length. A row that fails may still be another writer's valid header:
    such rows are for the one-by-one check."""
    n = len(blocks)
    names = blocks[:, :100]
    nul = names == 0
    length = np.where(nul.any(1), nul.argmax(1), 100)
    want = np.repeat(_TEMPLATE[None], n, 0)
    want[:, :100] = np.where(np.arange(100) < length[:, None], names, 0)
    want[:, 124:135] = (sizes[:, None] >> _OCTAL[11]) & 7 | 48
    chk = _USTAR_FIXED_SUM + want[:, :100].sum(1, dtype=np.int64) \
        + want[:, 124:136].sum(1, dtype=np.int64)
    want[:, 148:154] = (chk[:, None] >> _OCTAL[6]) & 7 | 48
    ok = (want == blocks).all(1) & (length < 100) & (names < 128).all(1) & (sizes < 8**11)
    for suffix in set(suffixes):
        rows = np.flatnonzero([x == suffix for x in suffixes])
        at = np.maximum(length[rows, None] - len(suffix) + np.arange(len(suffix)), 0)
        ok[rows] &= (names[rows[:, None], at] == np.frombuffer(suffix, np.uint8)).all(1)
    return ok, length


# ---------------------------------------------------------------------------- reading


def octal(field: bytes) -> int:
    """A header's number field: octal digits up to the first NUL (blank: 0), or GNU base-256
    (first byte 0x80, or 0xff for a negative number), as ``tarfile`` reads it."""
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        if field[:1] in (b"\x80", b"\xff"):  # never digits: tried second, off the usual path
            n = int.from_bytes(field[1:], "big")
            return n - 256 ** (len(field) - 1) if field[0] == 0xFF else n
        raise HeaderError(f"number field {field!r} is not octal") from None


def checksum_ok(h: bytes) -> bool:
    """Whether header block ``h`` adds up: its bytes' unsigned sum, the checksum field read
    as spaces. Each half sums to under 65521, so adler32's low half is its exact sum plus 1."""
    total = (adler32(h[:256]) & 0xFFFF) + (adler32(h[256:]) & 0xFFFF) - 2
    try:
        return total - sum(h[148:156]) + 256 == octal(h[148:156])
    except HeaderError:
        return False


def decode_header(h: bytes) -> tuple[bytes, str, int]:
    """Header block ``h`` as ``(type flag, name, size)``, decoded as ``tarfile`` decodes it:
    the ustar prefix joined to the name; the old regular type ``b"\\0"`` read as ``b"0"``,
    or as ``b"5"`` (a folder, its trailing slashes dropped) when the name ends with a slash;
    names UTF-8, undecodable bytes kept as surrogates (``surrogateescape``). ``HeaderError``
    when its checksum or a number is wrong."""
    if not checksum_ok(h):
        raise HeaderError("tar header checksum mismatch")
    kind = h[156:157]
    raw = h[:100].split(b"\0", 1)[0]
    size = octal(h[124:136])
    if size < 0:
        raise HeaderError(f"negative member size {size}")
    if kind == b"\0":
        kind = FOLDER if raw.endswith(b"/") else REGULAR
    if kind == FOLDER:
        raw = raw.rstrip(b"/")
    if h[345] and kind not in (b"L", b"K", b"S"):
        raw = h[345:500].split(b"\0", 1)[0] + b"/" + raw
    return kind, raw.decode("utf-8", "surrogateescape"), size


def parse_pax(data: bytes) -> dict[str, bytes]:
    """The records of a pax extended header, ``{keyword: value}`` (``"%d %s=%s\\n"`` each,
    the length counting the whole record); ``HeaderError`` on a malformed record."""
    out: dict[str, bytes] = {}
    pos, end = 0, len(data)
    while pos < end and data[pos] != 0:
        sp = data.find(b" ", pos, pos + 20)
        length = int(data[pos:sp]) if sp > pos and data[pos:sp].isdigit() else 0
        record = data[sp + 1:pos + length]
        key, eq, value = record.partition(b"=")
        if length <= 0 or pos + length > end or not eq or not record.endswith(b"\n"):
            raise HeaderError(f"malformed pax record at byte {pos} of its header")
        out[key.decode("utf-8", "surrogateescape")] = value[:-1]
        pos += length
    return out


def refusal(kind: bytes, name: str) -> str | None:
    """Why a member of type ``kind`` named ``name`` must not be read, or None: links, devices,
    fifos and sparse files (``"is a symbolic link"``), names that a careless extractor would
    write outside the archive (``"escapes the archive with '..'"``)."""
    why = _REFUSED.get(kind)
    if why is not None:
        return why
    if name[:1] == "/" or (name[1:2] == ":" and name[:1].isalpha()):
        return "escapes the archive with an absolute name"
    if ".." in name and ".." in name.split("/"):
        return "escapes the archive with '..'"
    return None


def data_span(kind: bytes, size: int) -> int:
    """The bytes a member's data takes after its header: none for links, devices, fifos and
    folders whatever their size field says (as ``tarfile`` reads them), else ``padded``."""
    return 0 if kind in _NO_DATA_KINDS else padded(size)


# ---------------------------------------------------------------------------- walking


Member = tuple[str, bytes, int, int, int, bytes, dict[str, bytes] | None]
"""A member as ``walk`` finds it, ``(name, kind, header, offset, size, via, pax)``: its name,
type flag and size (after any pax or GNU long-name header), where its header and its data
start, the kinds of the extended headers that applied to it (``b"x"`` pax, ``b"g"`` global
pax, ``b"L"`` GNU long name; ``b""`` none) and their pax records (None where there were
none). A plain tuple: ``walk`` makes one per member, where a named one costs a tenth more."""


def walk(read_at: ReadAt, end: int | None, *, start: int = 0, stop: int | None = None,
         base: int = 0) -> Iterator[Member]:
    """Every member whose header starts at ``start`` or later (a header boundary) up to the
    end-of-archive block, reading headers only (``read_at(size, base + offset)``, as
    ``functools.partial(os.pread, fd)``); offsets are from ``base``, ``end`` the archive's
    size (None: unknown, a stream). Pax and GNU long-name headers apply to the member they
    precede and are not yielded. With ``stop``, the walk ends quietly at the first header
    that would not end by ``stop``. ``HeaderError`` when the archive is damaged or cut short
    (an archive ends with its end-of-archive block), naming the byte and the member."""
    pos, last, ext, active = start, None, _Extended(), False
    size_end = end if end is not None else 1 << 63  # a stream's end shows as a short read
    limit = stop if stop is not None else size_end
    while pos + BLOCK <= limit:
        h = read_at(BLOCK, base + pos)
        if len(h) < BLOCK:
            break
        if h == ZERO_BLOCK:
            if ext.local is not None or ext.long_name is not None:
                raise HeaderError(f"an extended header ends the archive at byte {pos}")
            return
        try:
            kind, name, size = decode_header(h)
        except HeaderError as e:
            raise HeaderError(f"{e} in the tar header at byte {pos}{_after(last)}") from None
        body = pos + BLOCK
        if kind in _EXTENSIONS:
            ext.take(kind, _extension(read_at, base + body, size, pos), pos)
            pos, active = body + padded(size), True
            continue
        if active:
            name, kind, size, via, pax = ext.apply(name, kind, size, pos)
            active = bool(ext.glob)
        else:
            via, pax = b"", None
        span = 0 if kind in _NO_DATA_KINDS else -(-size // BLOCK) * BLOCK
        if span and body + size > size_end:
            raise HeaderError(f"cut short inside member {name!r}: its data ends at byte "
                              f"{body + size}, the archive at byte {end}")
        yield name, kind, pos, body, size, via, pax
        last, pos = name, body + span
    if stop is None:
        raise HeaderError(f"cut short at byte {pos}{_after(last)}, before the end-of-archive "
                          "block")


def _after(name: str | None) -> str:
    return "" if name is None else f", after member {name!r}"


def _extension(read_at: ReadAt, at: int, size: int, pos: int) -> bytes:
    """The data of the extended header at byte ``pos`` (``at`` where its data starts)."""
    if size > MAX_EXTENSION:
        raise HeaderError(f"an extended header of {size} bytes at byte {pos}")
    data = read_at(size, at)
    if len(data) < size:
        raise HeaderError(f"cut short inside the extended header at byte {pos}")
    return data


class _Extended:
    """The extended headers read so far: pax records for the next member (``local``) and
    for every later one (``glob``), a GNU long name for the next member."""

    def __init__(self) -> None:
        self.local: dict[str, bytes] | None = None
        self.glob: dict[str, bytes] = {}
        self.long_name: str | None = None

    def take(self, kind: bytes, data: bytes, pos: int) -> None:
        """An extended header of type ``kind`` at byte ``pos`` with its ``data``."""
        try:
            if kind == b"L":
                self.long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            elif kind == b"x":
                self.local = parse_pax(data)
            elif kind == b"g":
                self.glob.update(parse_pax(data))
        except HeaderError as e:
            raise HeaderError(f"{e} at byte {pos}") from None

    def apply(self, name: str, kind: bytes, size: int, pos: int
              ) -> tuple[str, bytes, int, bytes, dict[str, bytes] | None]:
        """``(name, kind, size, via, pax)`` of the member whose header at byte ``pos`` gives
        ``name``, ``kind`` and ``size``, as the extended headers before it make them (see
        ``Member``); they are then spent, but for the global records."""
        via, pax = b"", None
        if self.local is not None or self.glob:
            pax = {**self.glob, **self.local} if self.local is not None else self.glob
            via = (b"x" if self.local is not None else b"") + (b"g" if self.glob else b"")
            path = pax.get("GNU.sparse.name", pax.get("path"))
            if path is not None:
                name = path.decode("utf-8", "surrogateescape").rstrip("/")
            if "size" in pax:
                if not pax["size"].isdigit():
                    raise HeaderError(f"pax size {pax['size']!r} of the member at byte {pos}")
                size = int(pax["size"])
            if any(k.startswith("GNU.sparse.") for k in pax):
                kind = b"S"  # a sparse map: refused (``refusal``)
        if self.long_name is not None:
            name = self.long_name.removesuffix("/") if kind == FOLDER else self.long_name
            via += b"L"
        self.local = self.long_name = None
        return name, kind, size, via, pax


# ---------------------------------------------------------------------------- streams


class Readable(Protocol):
    """What ``iter_stream`` reads from: a ``read(n)`` that returns up to ``n`` bytes, and
    ``b""`` at the end (a file, ``gzip.GzipFile``, a socket's file)."""

    def read(self, n: int, /) -> bytes: ...


@dataclass(frozen=True, slots=True)
class StreamMember:
    """A regular member of a streamed archive: its name and size with its bytes, or, for a
    member that must not be read, ``data`` None and ``refused`` the reason (a phrase that
    follows the member's name: ``"is a symbolic link"``)."""

    name: str
    size: int
    data: bytes | None
    refused: str | None = None


class _Sequential:
    """``read_at`` over a stream, for offsets that only go forward (what ``walk`` and the
    member reads of ``iter_stream`` ask): the bytes in between are read and dropped."""

    def __init__(self, stream: Readable) -> None:
        self.stream, self.pos = stream, 0

    def __call__(self, size: int, offset: int) -> bytes:
        if offset < self.pos:
            raise ValueError(f"a stream reads forward only: byte {offset} is behind it")
        self.skip(offset - self.pos)
        parts, got = [], 0
        while got < size:
            chunk = self.stream.read(size - got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        self.pos += got
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def skip(self, n: int) -> None:
        while n > 0 and (chunk := self.stream.read(min(n, 1 << 20))):
            n -= len(chunk)
            self.pos += len(chunk)


def iter_stream(stream: Readable, archive: str, *, max_size: int = MAX_MEMBER,
                keep: Callable[[str, int], bool] | None = None) -> Iterator[StreamMember]:
    """The regular members of the tar that ``stream`` reads front to back (``archive`` names
    it in errors), in archive order, each read whole into memory: a ``StreamMember`` with
    its bytes, or with the reason it is refused instead (``refusal``, or over ``max_size``
    bytes) and its bytes skipped, or, where ``keep(name, size)`` says no, with neither (its
    bytes skipped unread). Folders and other members that hold no file are passed over.
    After the end-of-archive block the stream is read to its end, so that a gzip stream's
    checksum is checked. ``SourceFormatError`` naming the archive and the member
    when the archive is damaged or cut short::

        with gzip.open(path, "rb") as f:
            for m in iter_stream(f, str(path)):
                ...  # m.name, m.size, m.data (None when m.refused says why)
    """
    read = _Sequential(stream)
    where = "before its first member"  # for a compressed stream's own errors
    try:
        for name, kind, _, offset, size, _, _ in walk(read, None):
            if kind not in FILE_KINDS and kind not in _REFUSED:
                where = f"after member {name!r}"
                continue  # a folder, a volume label …: no file to read
            why = refusal(kind, name)
            skip = why is None and keep is not None and not keep(name, size)
            if why is None and not skip and size > max_size:
                why = f"is {size} bytes, over the {max_size}-byte limit"
            if why is not None or skip:
                where = f"after member {name!r}"
                yield StreamMember(name, size, None, why)
                continue
            where = f"inside member {name!r}"
            data = read(size, offset)
            if len(data) < size:
                raise HeaderError(f"cut short inside member {name!r} ({len(data)} of its "
                                  f"{size} bytes)")
            where = f"after member {name!r}"
            yield StreamMember(name, size, data)
        read.skip(1 << 62)
    except HeaderError as e:
        raise SourceFormatError(f"{archive}: {e}; re-download it") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise SourceFormatError(f"{archive}: the compressed stream is damaged or cut short "
                                f"{where} ({e}); re-download it") from None
