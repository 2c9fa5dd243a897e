"""The tar format's one home (``imgprep.shards.tarfmt``): headers written byte for byte as
``tarfile`` writes them and read back as ``tarfile`` reads them, one set of refusal rules, and
walks by offset and over a stream (a ``.tar.gz`` read through ``gzip``) that find what
``tarfile`` finds, refuse what must not be read, and name the member where an archive is cut
short."""

from __future__ import annotations

import functools
import gzip
import io
import tarfile
from collections.abc import Iterable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imgprep.errors import SourceFormatError
from imgprep.shards.tarfmt import (
    BLOCK,
    RECORD,
    HeaderError,
    StreamMember,
    checksum_ok,
    data_span,
    decode_header,
    end_of_archive,
    header_bytes,
    headers_written,
    iter_stream,
    octal,
    padded,
    padding,
    parse_pax,
    refusal,
    tar_header,
    walk,
)

LONG = "n01440764/" + "a" * 120 + ".JPEG"  # longer than a ustar name: a pax path or GNU 'L'
FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}


def _info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0,
          link: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.size, ti.linkname = kind, size, link
    return ti


def archive(members: Iterable[tuple[str, bytes] | tarfile.TarInfo],
            fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A tar made by ``tarfile``: (name, bytes) regular members, TarInfo ones as they are."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tf.addfile(m)
            else:
                tf.addfile(_info(m[0], size=len(m[1])), io.BytesIO(m[1]))
    return buf.getvalue()


def tarfile_view(data: bytes) -> list[tuple[str, bytes, int, int]]:
    """(name, type, data offset, size) of every member, as ``tarfile`` lists them."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return [(m.name, m.type, m.offset_data, m.size) for m in tf]


def walk_view(data: bytes) -> list[tuple[str, bytes, int, int]]:
    def read_at(size: int, offset: int) -> bytes:
        return data[offset:offset + size]

    return [(name, kind, offset, size)
            for name, kind, _, offset, size, _, _ in walk(read_at, len(data))]


class Trickle(io.RawIOBase):
    """A stream that hands out at most ``step`` bytes a read, as a pipe or socket may."""

    def __init__(self, data: bytes, step: int = 7) -> None:
        super().__init__()
        self._data, self._pos, self._step = data, 0, step

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1, /) -> bytes:
        n = self._step if n < 0 else min(n, self._step)
        out = self._data[self._pos:self._pos + n]
        self._pos += len(out)
        return out


class Sparse(io.RawIOBase):
    """A seekable archive of one member whose data (zeros) is never held in memory: its
    header, ``size`` zero bytes padded, and the end of the archive."""

    def __init__(self, header: bytes, size: int) -> None:
        super().__init__()
        self.head, self.zeros = header, padded(size)
        self.tail = end_of_archive(len(header) + self.zeros)
        self.len, self.pos = len(header) + self.zeros + len(self.tail), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = {0: 0, 1: self.pos, 2: self.len}[whence] + pos
        return self.pos

    def read_at(self, size: int, offset: int) -> bytes:
        after = len(self.head) + self.zeros
        out = b"".join((self.head[offset:offset + size],
                        bytes(max(0, min(offset + size, after) - max(offset, len(self.head)))),
                        self.tail[max(0, offset - after):max(0, offset + size - after)]))
        return out

    def read(self, n: int = -1, /) -> bytes:
        out = self.read_at(self.len - self.pos if n < 0 else n, self.pos)
        self.pos += len(out)
        return out


def gz(data: bytes) -> gzip.GzipFile:
    return gzip.GzipFile(fileobj=io.BytesIO(gzip.compress(data, mtime=0)))


# ---------------------------------------------------------------------------- headers


@pytest.mark.parametrize(("name", "size"), [
    ("a.jpg", 0), ("n01440764_10026.jpg", 12345), ("x" * 100, 1), ("é_key.jpg", 10),
    ("k.jpg", 8**11 - 1), ("big.jpg", 8**11), (LONG, 3),
])
def test_written_headers_are_tarfiles_and_read_back_as_tarfile_reads_them(
        name: str, size: int) -> None:
    h = header_bytes(name, size)
    assert h == tar_header(name, size).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    tar = Sparse(h, size)
    with tarfile.open(fileobj=tar) as tf:
        assert [(m.name, m.type, m.offset_data, m.size) for m in tf] == [
            (name, b"0", len(h), size)]
    assert [(m[0], m[1], m[3], m[4]) for m in walk(tar.read_at, tar.len)] == [
        (name, b"0", len(h), size)]


@settings(max_examples=200, deadline=None)
@given(name=st.text(st.characters(blacklist_characters="\0/", blacklist_categories=("Cs",)),
                    min_size=1, max_size=140),
       size=st.integers(0, 8**12))
def test_any_name_and_size_round_trip(name: str, size: int) -> None:
    h = header_bytes(name, size)
    head = h[-BLOCK:]  # the member's own header, after any pax header (a long name or size)
    assert checksum_ok(head) and decode_header(head)[0] == b"0"
    tar = Sparse(h, size)
    assert [(m[0], m[4]) for m in walk(tar.read_at, tar.len)] == [(name, size)]


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_decoded_headers_equal_tarfiles_for_every_format(fmt: int) -> None:
    folder = _info("n01440764/", tarfile.DIRTYPE)
    prefixed = "p" * 90 + "/" + "q" * 90 + ".JPEG"  # ustar's prefix field holds the folder
    members: list[tuple[str, bytes] | tarfile.TarInfo] = [
        folder, ("n01440764/a.JPEG", b"x" * 700), (prefixed, b"y"), ("empty.JPEG", b""),
        _info("n01440764/link", tarfile.SYMTYPE, link="a.JPEG"), ("after.JPEG", b"z" * 513)]
    if fmt != tarfile.USTAR_FORMAT:
        members.append((LONG, b"w" * 10))
    data = archive(members, fmt)
    assert walk_view(data) == tarfile_view(data)


def test_numbers_octal_and_base_256() -> None:
    assert octal(b"0000644\0") == 0o644 and octal(b"        ") == 0 and octal(b" 17 \0\0") == 15
    assert octal(b"\x80" + (2**40).to_bytes(11, "big")) == 2**40  # GNU, for sizes >= 8 GiB
    assert octal(b"\xff" * 8) == -1
    with pytest.raises(HeaderError, match="not octal"):
        octal(b"12x4\0")
    big = tar_header("big.jpg", 2**36).tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
    assert decode_header(big) == (b"0", "big.jpg", 2**36)


def test_a_damaged_header_does_not_decode() -> None:
    h = bytearray(header_bytes("k.jpg", 5))
    h[0] ^= 0x01
    assert not checksum_ok(bytes(h))
    with pytest.raises(HeaderError, match="checksum"):
        decode_header(bytes(h))


def test_old_style_regular_type_with_a_slash_is_a_folder() -> None:
    ti = _info("old/", tarfile.AREGTYPE)
    assert decode_header(ti.tobuf(tarfile.GNU_FORMAT))[:2] == (b"5", "old")
    ti = _info("old.jpg", tarfile.AREGTYPE, 3)
    assert decode_header(ti.tobuf(tarfile.GNU_FORMAT)) == (b"0", "old.jpg", 3)


def test_pax_records_parse_and_malformed_ones_are_refused() -> None:
    rec = b"29 path=n01440764/a b=c.JPEG\n" + b"11 size=42\n"
    assert parse_pax(rec + b"\0" * 10) == {"path": b"n01440764/a b=c.JPEG", "size": b"42"}
    for bad in (b"9 path=ab\n", b"12 path=abc", b"x path=a\n", b"8 noeq\n"):
        with pytest.raises(HeaderError, match="pax record"):
            parse_pax(bad)


def test_padding_closes_members_and_archives_as_tarfile_does() -> None:
    assert [padded(n) for n in (0, 1, 512, 513)] == [0, 512, 512, 1024]
    assert [len(padding(n)) for n in (0, 1, 512, 513)] == [0, 511, 0, 511]
    member = header_bytes("k.jpg", 3) + b"abc" + padding(3)
    assert member + end_of_archive(len(member)) == archive([("k.jpg", b"abc")])
    assert len(end_of_archive(0)) == RECORD
    assert data_span(b"2", 100) == data_span(b"5", 100) == 0 and data_span(b"0", 1) == BLOCK


# ---------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(("kind", "name", "why"), [
    (tarfile.LNKTYPE, "a.jpg", "is a hard link"), (tarfile.SYMTYPE, "a.jpg", "is a symbolic link"),
    (tarfile.CHRTYPE, "a.jpg", "is a character device"),
    (tarfile.BLKTYPE, "a.jpg", "is a block device"), (tarfile.FIFOTYPE, "a.jpg", "is a fifo"),
    (tarfile.GNUTYPE_SPARSE, "a.jpg", "is a sparse file"),
    (tarfile.REGTYPE, "/etc/passwd", "escapes the archive with an absolute name"),
    (tarfile.REGTYPE, "C:/x.jpg", "escapes the archive with an absolute name"),
    (tarfile.REGTYPE, "../x.jpg", "escapes the archive with '..'"),
    (tarfile.REGTYPE, "a/../../x.jpg", "escapes the archive with '..'"),
    (tarfile.DIRTYPE, "..", "escapes the archive with '..'"),
    (tarfile.REGTYPE, "a/..b/c..jpg", None), (tarfile.REGTYPE, "n01440764/x.JPEG", None),
    (tarfile.DIRTYPE, "n01440764", None), (tarfile.CONTTYPE, "a.jpg", None),
])
def test_refusal_rules(kind: bytes, name: str, why: str | None) -> None:
    assert refusal(kind, name) == why


# ---------------------------------------------------------------------------- walks


def test_a_walk_by_offset_names_the_member_cut_short() -> None:
    data = archive([("a.jpg", b"a" * 600), ("b.jpg", b"b" * 2000)])
    cut = data[:tarfile_view(data)[1][2] + 100]  # inside b.jpg's data
    with pytest.raises(HeaderError, match="cut short inside member 'b.jpg'"):
        walk_view(cut)
    no_end = data[:tarfile_view(data)[1][2] + padded(2000)]  # both members, no end blocks
    with pytest.raises(HeaderError, match="after member 'b.jpg', before the end-of-archive"):
        walk_view(no_end)


def test_a_walk_from_a_header_to_a_stop_reads_only_that_far() -> None:
    data = archive([(f"k{j}.jpg", bytes(100 * j)) for j in range(5)], tarfile.GNU_FORMAT)
    offsets = [o for _, _, o, _ in tarfile_view(data)]
    reads: list[int] = []

    def read_at(size: int, offset: int) -> bytes:
        reads.append(offset)
        return data[offset:offset + size]

    got = list(walk(read_at, len(data), start=offsets[1] - BLOCK, stop=offsets[3]))
    assert [m[0] for m in got] == ["k1.jpg", "k2.jpg", "k3.jpg"]
    assert [(m[2], m[3]) for m in got] == [(o - BLOCK, o) for o in offsets[1:4]]
    assert max(reads) < offsets[3]


def test_the_walk_tells_which_extended_headers_applied() -> None:
    data = archive([("short.jpg", b"s"), (LONG, b"l")], tarfile.PAX_FORMAT)
    got = list(walk(functools.partial(lambda d, n, o: d[o:o + n], data), len(data)))
    assert [(m[0], m[5], m[6]) for m in got] == [
        ("short.jpg", b"", None), (LONG, b"x", {"path": LONG.encode()})]
    data = archive([(LONG, b"l")], tarfile.GNU_FORMAT)
    assert [(m[0], m[5]) for m in walk(lambda n, o: data[o:o + n], len(data))] == [
        (LONG, b"L")]


def test_global_pax_records_apply_to_every_later_member_as_in_tarfile() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT,
                      pax_headers={"comment": "made elsewhere"}) as tf:
        for name in ("a.jpg", LONG):
            tf.addfile(_info(name, size=2), io.BytesIO(b"xy"))
    data = buf.getvalue()
    assert walk_view(data) == tarfile_view(data)
    got = list(walk(lambda n, o: data[o:o + n], len(data)))
    assert [(m[5], m[6]) for m in got] == [
        (b"g", {"comment": b"made elsewhere"}),
        (b"xg", {"comment": b"made elsewhere", "path": LONG.encode()})]


# ---------------------------------------------------------------------------- streams


def test_a_tar_gz_streams_its_regular_members_with_their_bytes() -> None:
    members = [("n01440764/a.JPEG", b"a" * 1000), (LONG, b"long"), ("empty.JPEG", b""),
               ("ü/é.JPEG", b"u" * 513)]
    data = archive([_info("n01440764", tarfile.DIRTYPE), *members])
    got = list(iter_stream(gz(data), "train_images_0.tar.gz"))
    assert got == [StreamMember(n, len(b), b) for n, b in members]


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
def test_short_reads_do_not_change_what_a_stream_gives(fmt: int) -> None:
    members = [(f"k{j}.jpg", bytes([j]) * (j * 300)) for j in range(6)]
    data = archive(members, fmt)
    assert [(m.name, m.data) for m in iter_stream(Trickle(data), "t.tar")] == members


def test_members_that_must_not_be_read_are_reported_with_their_reason() -> None:
    data = archive([
        ("a.JPEG", b"a"), _info("evil.JPEG", tarfile.SYMTYPE, link="/etc/passwd"),
        _info("hard.JPEG", tarfile.LNKTYPE, link="a.JPEG"), ("../up.JPEG", b"up"),
        ("/abs.JPEG", b"abs"), _info("dev", tarfile.CHRTYPE), ("b.JPEG", b"b" * 2000),
        ("huge.JPEG", b"h" * 5000), ("c.JPEG", b"c")])
    got = [(m.name, m.data, m.refused) for m in iter_stream(gz(data), "x.tar.gz",
                                                             max_size=4096)]
    assert got == [
        ("a.JPEG", b"a", None), ("evil.JPEG", None, "is a symbolic link"),
        ("hard.JPEG", None, "is a hard link"),
        ("../up.JPEG", None, "escapes the archive with '..'"),
        ("/abs.JPEG", None, "escapes the archive with an absolute name"),
        ("dev", None, "is a character device"), ("b.JPEG", b"b" * 2000, None),
        ("huge.JPEG", None, "is 5000 bytes, over the 4096-byte limit"), ("c.JPEG", b"c", None)]


def test_a_truncated_tar_gz_names_the_archive_and_the_member() -> None:
    data = archive([("a.JPEG", b"a" * 700), ("b.JPEG", bytes(range(256)) * 40)])
    packed = gzip.compress(data, mtime=0)
    stream = gzip.GzipFile(fileobj=io.BytesIO(packed[:len(packed) // 2]))
    got: list[str] = []
    with pytest.raises(SourceFormatError, match=r"x\.tar\.gz: .*member 'b\.JPEG'.*re-download"):
        got.extend(m.name for m in iter_stream(stream, "x.tar.gz"))
    assert got == ["a.JPEG"]


@pytest.mark.parametrize(("cut", "words"), [
    (BLOCK + 300, "cut short inside member 'a.JPEG'"),
    (2 * BLOCK + 100, "cut short at byte 1024, after member 'a.JPEG'"),
    (4 * BLOCK, "cut short at byte 2048, after member 'b.JPEG', before the end-of-archive"),
])
def test_a_truncated_plain_stream_names_the_member(cut: int, words: str) -> None:
    data = archive([("a.JPEG", b"a" * 500), ("b.JPEG", b"b")])
    with pytest.raises(SourceFormatError, match=f"t.tar: {words}"):
        list(iter_stream(io.BytesIO(data[:cut]), "t.tar"))


def test_a_damaged_gzip_trailer_is_caught_after_the_last_member() -> None:
    packed = bytearray(gzip.compress(archive([("a.JPEG", b"a" * 100)]), mtime=0))
    packed[-8] ^= 0xFF  # the CRC32 of the whole stream
    with pytest.raises(SourceFormatError, match=r"compressed stream .*after member 'a\.JPEG'"):
        list(iter_stream(gzip.GzipFile(fileobj=io.BytesIO(bytes(packed))), "x.tar.gz"))


def _one_by_one(h: bytes, size: int, suffix: bytes) -> bool:
    """``header_bytes``' test of one header, as the loaders' reader made it alone."""
    raw = h[:100].split(b"\0", 1)[0]
    return (len(raw) < 100 and raw.endswith(suffix) and raw.isascii() and size < 8**11
            and h == header_bytes(raw.decode("ascii"), size))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(
    st.text("abz09_-./", max_size=104), st.sampled_from([".jpg", ".cls", ".yuv420", ""]),
    st.integers(0, 8**11 + 5), st.one_of(st.just(-1), st.integers(0, 511)), st.integers(0, 7),
    st.booleans(),
    st.sampled_from([b".jpg", b".cls", b".yuv420"])), min_size=1, max_size=12))
def test_headers_written_decides_a_batch_as_header_bytes_decides_each(rows) -> None:
    """Names of every length around 100, sizes past 11 octal digits, a bit flipped anywhere
    in the header or none, and the size or the suffix asked for not the written one."""
    blocks, sizes, suffixes, want = [], [], [], []
    for stem, ext, size, flip_at, bit, other_size, suffix in rows:
        name = stem + ext
        h = bytearray(header_bytes(name, min(size, 8**11 - 1))[:BLOCK] if len(name) <= 100
                      else bytes(BLOCK))
        if flip_at >= 0:
            h[flip_at] ^= 1 << bit
        asked = size + 1 if other_size else size
        blocks.append(bytes(h))
        sizes.append(asked)
        suffixes.append(suffix)
        want.append(_one_by_one(bytes(h), asked, suffix))
    ok, length = headers_written(np.frombuffer(b"".join(blocks), np.uint8).reshape(-1, BLOCK),
                                 np.asarray(sizes, np.int64), suffixes)
    assert ok.tolist() == want
    assert length.tolist() == [len(b[:100].split(b"\0", 1)[0]) for b in blocks]


def test_headers_written_passes_every_header_imgprep_writes() -> None:
    names = [f"r{i:02d}-n01440764_{i}.{ext}" for i in range(40) for ext in ("jpg", "cls")]
    sizes = [7 * i + 1 for i in range(len(names))]
    blocks = b"".join(header_bytes(n, s) for n, s in zip(names, sizes, strict=True))
    ok, length = headers_written(np.frombuffer(blocks, np.uint8).reshape(-1, BLOCK),
                                 np.asarray(sizes, np.int64),
                                 [b"." + n.rsplit(".", 1)[1].encode() for n in names])
    assert ok.all() and length.tolist() == [len(n) for n in names]
