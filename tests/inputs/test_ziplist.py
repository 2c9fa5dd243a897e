"""Zip archives read in place (``imgprep.inputs.ziplist`` and the zip codecs of
``imgprep.inputs.reader``): the central directory listed once into columns, each member read
by the offset of its local header (stored or deflated, CRC-32 checked), hostile members
refused by name, and archives that are cut short or split refused saying so."""

from __future__ import annotations

import io
import os
import stat
import struct
import warnings
import zipfile
from pathlib import Path

import pytest

from imgprep.errors import SourceFormatError
from imgprep.inputs.reader import ZIP_DEFLATED, ZIP_STORED, ZipEntry, read_zip_member
from imgprep.inputs.ziplist import ZipIndex, _cached, read_index
from tests.support import jpeg

WHEN = (2019, 1, 1, 0, 0, 0)
CENTRAL = b"PK\x01\x02"


def info(name: str, mode: int = 0o100644, method: int = zipfile.ZIP_DEFLATED) -> zipfile.ZipInfo:
    zi = zipfile.ZipInfo(name, date_time=WHEN)
    zi.create_system, zi.external_attr, zi.compress_type = 3, mode << 16, method
    return zi


def write_zip(path: Path, members: list[tuple[zipfile.ZipInfo | str, bytes]]) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are written on purpose
        with zipfile.ZipFile(path, "w") as zf:
            for zi, data in members:
                zf.writestr(info(zi) if isinstance(zi, str) else zi, data)
    _cached.cache_clear()
    return path


def patch_central(path: Path, name: str, at: int, fmt: str, value: int) -> None:
    """Set a field of ``name``'s central-directory record (``at`` bytes into it)."""
    data = bytearray(path.read_bytes())
    pos = data.find(CENTRAL)
    while pos >= 0:
        n, = struct.unpack_from("<H", data, pos + 28)
        if data[pos + 46:pos + 46 + n] == name.encode():
            struct.pack_into(fmt, data, pos + at, value)
            path.write_bytes(bytes(data))
            _cached.cache_clear()
            return
        pos = data.find(CENTRAL, pos + 4)
    raise AssertionError(f"{name} not in the central directory")


def entry(index: ZipIndex, i: int, head: int | None = None) -> ZipEntry:
    """Image member ``i`` of ``index`` as the reader gets it (``head``: another guess)."""
    return ZipEntry(index.names[i], int(index.offset[i]),
                    int(index.head[i]) if head is None else head, int(index.stored[i]),
                    int(index.size[i]), int(index.codec[i]), int(index.crc[i]),
                    int(index.end[i]))


def read_all(index: ZipIndex) -> dict[str, bytes]:
    fd = os.open(index.path, os.O_RDONLY)
    try:
        return {name: read_zip_member(fd, entry(index, i)) for i, name in enumerate(index.names)}
    finally:
        os.close(fd)


def reasons(index: ZipIndex) -> dict[str, str]:
    return {e.source: e.reason for e in index.refused}


# ---------------------------------------------------------------------------- reading


def test_stored_and_deflated_members_read_back_by_offset(tmp_path: Path) -> None:
    images = {f"train/n01440764/n01440764_{k}.JPEG": jpeg((40, 30), seed=k) for k in range(4)}
    members = [(info(n, method=zipfile.ZIP_STORED if k % 2 else zipfile.ZIP_DEFLATED), d)
               for k, (n, d) in enumerate(images.items())]
    index = read_index(write_zip(tmp_path / "a.zip", [*members, ("a/notes/readme.txt", b"hi")]))
    assert index.names == list(images)
    assert index.codec.tolist() == [ZIP_DEFLATED, ZIP_STORED] * 2
    assert read_all(index) == images
    assert index.refused == () and index.small == {} and index.others == {"a/notes": 1}


def test_small_top_files_are_kept_and_read_as_text(tmp_path: Path) -> None:
    index = read_index(write_zip(tmp_path / "a.zip", [
        ("LOC_val_solution.csv", b"ImageId,PredictionString\n"), ("top/map.txt", b"x\n"),
        ("a/b/deep.txt", b"deep")]))
    assert set(index.small) == {"LOC_val_solution.csv", "top/map.txt"}
    member = index.small["LOC_val_solution.csv"]
    assert member.read_text() == "ImageId,PredictionString\n"
    assert str(member) == f"{tmp_path / 'a.zip'}/LOC_val_solution.csv"
    assert member.name == "LOC_val_solution.csv"


def test_a_local_header_longer_than_guessed_is_read_again(tmp_path: Path) -> None:
    """force_zip64 writes a 20-byte zip64 extra in the local header only: the guess from the
    central directory is short, and the reader reads the data where the header says."""
    path = tmp_path / "a.zip"
    data = jpeg((40, 30), seed=1)
    with zipfile.ZipFile(path, "w") as zf, zf.open(info("x/a.JPEG"), "w", force_zip64=True) as w:
        w.write(data)
    _cached.cache_clear()
    index = read_index(path)
    assert read_all(index) == {"x/a.JPEG": data}
    fd = os.open(path, os.O_RDONLY)
    try:  # the smallest guess works too
        assert read_zip_member(fd, entry(index, 0, head=30)) == data
    finally:
        os.close(fd)


def test_a_streamed_zip_with_data_descriptors_reads(tmp_path: Path) -> None:
    class Stream(io.RawIOBase):  # not seekable: zipfile writes data descriptors
        def __init__(self) -> None:
            self.buf = bytearray()

        def writable(self) -> bool:
            return True

        def write(self, b: bytes) -> int:  # type: ignore[override]
            self.buf += b
            return len(b)

    out = Stream()
    data = {f"d/{k}.jpg": jpeg((30, 30), seed=k) for k in range(3)}
    with zipfile.ZipFile(out, "w") as zf:
        for n, d in data.items():
            zf.writestr(info(n), d)
    path = tmp_path / "s.zip"
    path.write_bytes(bytes(out.buf))
    _cached.cache_clear()
    assert read_all(read_index(path)) == data


def test_a_damaged_member_fails_its_crc_naming_it(tmp_path: Path) -> None:
    data = jpeg((40, 30), seed=3)
    path = write_zip(tmp_path / "a.zip", [(info("x/a.JPEG", method=zipfile.ZIP_STORED), data)])
    index = read_index(path)
    raw = bytearray(path.read_bytes())
    at = raw.find(data) + 100
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(OSError, match="CRC-32 mismatch .* damaged; re-download"):
        read_all(index)


def test_damaged_deflate_data_is_refused(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "a.zip", [("x/a.JPEG", b"\0" * 5000)])
    index = read_index(path)
    raw = bytearray(path.read_bytes())
    start = int(index.offset[0]) + int(index.head[0])
    raw[start:start + 4] = b"\xff\xff\xff\xff"
    path.write_bytes(bytes(raw))
    with pytest.raises(OSError, match="deflated data is damaged|inflates to other than"):
        read_all(index)


# ---------------------------------------------------------------------------- hostile members


@pytest.mark.parametrize(("name", "mode", "method", "expected"), [
    ("/abs/a.JPEG", 0o100644, zipfile.ZIP_STORED, "absolute name"),
    ("train/../../a.JPEG", 0o100644, zipfile.ZIP_STORED, "escapes the archive with '..'"),
    ("train/link.JPEG", stat.S_IFLNK | 0o777, zipfile.ZIP_STORED, "is a symlink; refused"),
    ("train/dev.JPEG", stat.S_IFCHR | 0o644, zipfile.ZIP_STORED, "a device, fifo or socket"),
    ("train/b.JPEG", 0o100644, zipfile.ZIP_BZIP2, "compressed with bzip2"),
    ("train/l.JPEG", 0o100644, zipfile.ZIP_LZMA, "compressed with lzma"),
])
def test_hostile_members_are_refused_by_name(tmp_path: Path, name: str, mode: int,
                                             method: int, expected: str) -> None:
    good = jpeg((30, 30), seed=1)
    index = read_index(write_zip(tmp_path / "h.zip", [("train/ok.JPEG", good),
                                                      (info(name, mode, method), good)]))
    assert index.names == ["train/ok.JPEG"]
    assert list(reasons(index)) == [name]
    assert expected in reasons(index)[name] and repr(name) in reasons(index)[name]
    assert read_all(index) == {"train/ok.JPEG": good}


def test_an_encrypted_member_is_refused(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "e.zip", [("train/a.JPEG", b"x"), ("train/ok.JPEG", b"y")])
    patch_central(path, "train/a.JPEG", 8, "<H", 0x1)
    index = read_index(path)
    assert index.names == ["train/ok.JPEG"]
    assert "'train/a.JPEG' is encrypted" in reasons(index)["train/a.JPEG"]


def test_a_name_seen_twice_keeps_the_first_copy(tmp_path: Path) -> None:
    index = read_index(write_zip(tmp_path / "d.zip", [("train/a.JPEG", b"first"),
                                                      ("train/a.JPEG", b"second")]))
    assert index.names == ["train/a.JPEG"]
    assert read_all(index) == {"train/a.JPEG": b"first"}
    assert "appears twice; the second copy is refused" in reasons(index)["train/a.JPEG"]


# ---------------------------------------------------------------------------- whole archives


def test_a_zip_cut_short_is_refused_as_an_early_stop(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "cut.zip", [(f"t/{k}.JPEG", jpeg((60, 40), seed=k))
                                            for k in range(5)])
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(SourceFormatError, match=r"no end-of-central-directory record: the "
                       r"download stopped early; re-download it .*zip -FF cut\.zip"):
        read_index(path)


def test_the_last_part_of_a_split_zip_is_refused_naming_the_join(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "big.zip", [("t/a.JPEG", b"x")])
    raw = bytearray(path.read_bytes())
    struct.pack_into("<H", raw, raw.rfind(b"PK\x05\x06") + 4, 2)
    path.write_bytes(bytes(raw))
    _cached.cache_clear()
    with pytest.raises(SourceFormatError, match=r"last part of a split zip archive \(part 3\): "
                       r"join the parts first \(zip -s 0 big\.zip --out joined\.zip\)"):
        read_index(path)


def test_a_damaged_central_directory_is_refused(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "bad.zip", [("t/a.JPEG", b"x" * 100)])
    raw = bytearray(path.read_bytes())
    raw[raw.find(CENTRAL)] = ord("X")
    path.write_bytes(bytes(raw))
    _cached.cache_clear()
    with pytest.raises(SourceFormatError, match="central directory cannot be read"):
        read_index(path)


@pytest.mark.slow
def test_a_zip64_archive_of_70000_members_lists_and_reads(tmp_path: Path) -> None:
    """More members than a plain end record counts: zipfile writes zip64 records."""
    path = tmp_path / "many.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for k in range(70_000):
            zf.writestr(info(f"t/n01440764_{k}.JPEG", method=zipfile.ZIP_STORED), b"%d" % k)
    _cached.cache_clear()
    index = read_index(path)
    assert len(index.names) == 70_000
    fd = os.open(path, os.O_RDONLY)
    try:
        last = read_zip_member(fd, entry(index, len(index.names) - 1))
    finally:
        os.close(fd)
    assert last == b"69999"
