"""A zip's central directory checked against its local headers, as zip checkers do
(``imgprep.inputs.ziplist.check_layout`` at listing, ``imgprep.inputs.reader`` at reading):
members that share bytes or lie outside the archive refuse it whole; a local header that names
another member, or records another method, CRC-32 or size, refuses its member.

Zips are generated with hypothesis (partial and whole overlaps, headers and directory that
disagree, sizes that lie) and every verdict is cross-checked with the zip checkers found on
the machine: ``bsdtar -tf`` (libarchive), ``unzip -t`` and a Python whose ``zipfile`` refuses
overlapped entries (3.12.2 and later). imgprep never accepts what one of them refuses, and
refuses only what one of them refuses or a member whose recorded sizes disagree: a local
header that records another method, CRC-32 or size than the central directory, or data that
gives another size than it records (each checker reads some of these fields and trusts the
rest; imgprep compares them all).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import io
import os
import shutil
import struct
import subprocess
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgprep.errors import SourceFormatError
from imgprep.inputs.reader import ZipEntry, read_zip_member
from imgprep.inputs.ziplist import _cached, read_index
from tests.support.cli import invoke

CENTRAL, LOCAL = b"PK\x01\x02", b"PK\x03\x04"
WHEN = (2019, 1, 1, 0, 0, 0)
TOP = "ILSVRC/Data/CLS-LOC/"


# ---------------------------------------------------------------------------- building zips


def central_records(data: bytes | bytearray) -> list[int]:
    """The offsets of the central-directory records, in order."""
    found, pos = [], data.find(CENTRAL)
    while pos >= 0:
        found.append(pos)
        pos = data.find(CENTRAL, pos + 4)
    return found


def local_of(data: bytes | bytearray, record: int) -> int:
    """The local header offset that the central record at ``record`` holds."""
    return int(struct.unpack_from("<I", data, record + 42)[0])


def add(data: bytearray, at: int, fmt: str, delta: int) -> None:
    """Add ``delta`` to the field at ``at`` (wrapping, as a forger may)."""
    value, = struct.unpack_from(fmt, data, at)
    struct.pack_into(fmt, data, at, (value + delta) % (1 << (8 * struct.calcsize(fmt))))


class _Unseekable(io.RawIOBase):
    """A write-only stream: zipfile then writes data descriptors after each member."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.buf += b
        return len(b)


@dataclass(frozen=True)
class Member:
    payload: bytes
    deflated: bool
    zip64: bool


def build(members: list[Member], streamed: bool) -> bytearray:
    """A valid zip of ``members`` named as Kaggle's train images (``streamed``: written to a
    stream that cannot seek, so every member has a data descriptor)."""
    sink: io.RawIOBase | io.BytesIO = _Unseekable() if streamed else io.BytesIO()
    with zipfile.ZipFile(sink, "w") as zf:
        for k, m in enumerate(members):
            zi = zipfile.ZipInfo(f"{TOP}train/n01440764/n01440764_{k}.JPEG", date_time=WHEN)
            zi.compress_type = zipfile.ZIP_DEFLATED if m.deflated else zipfile.ZIP_STORED
            with zf.open(zi, "w", force_zip64=m.zip64) as w:
                w.write(m.payload)
    return bytearray(sink.buf if isinstance(sink, _Unseekable) else sink.getvalue())


# Each mutation takes the zip's bytes, a member index and a small number; it changes the
# central directory (cd) or a local header (local) the way a damaged or forged zip does.
def _cd(at: int, fmt: str) -> Callable[[bytearray, int, int], None]:
    def change(data: bytearray, k: int, d: int) -> None:
        add(data, central_records(data)[k] + at, fmt, d)
    return change


def _local(at: int, fmt: str) -> Callable[[bytearray, int, int], None]:
    def change(data: bytearray, k: int, d: int) -> None:
        add(data, local_of(data, central_records(data)[k]) + at, fmt, d)
    return change


def _point_at_other(data: bytearray, k: int, d: int) -> None:
    """Point member k's central entry at another member's local header, with that member's
    method, CRC and sizes (the forged entry of a mislabelled image)."""
    records = central_records(data)
    src = records[(k + 1 + d % (len(records) - 1)) % len(records)] if len(records) > 1 \
        else records[k]
    for at, fmt in ((10, "<H"), (16, "<I"), (20, "<I"), (24, "<I"), (42, "<I")):
        struct.pack_into(fmt, data, records[k] + at, struct.unpack_from(fmt, data, src + at)[0])


def _rename_local(data: bytearray, k: int, d: int) -> None:
    """Change one byte of member k's name in its local header only."""
    local = local_of(data, central_records(data)[k])
    name_len, = struct.unpack_from("<H", data, local + 26)
    data[local + 30 + d % name_len] ^= 0x20


MUTATIONS: dict[str, Callable[[bytearray, int, int], None]] = {
    "none": lambda data, k, d: None,
    "cd offset": _cd(42, "<I"),  # a partial overlap, or a header inside another's data
    "cd compressed size": _cd(20, "<I"),  # data running into the next member, or cut short
    "cd size": _cd(24, "<I"),
    "cd crc": _cd(16, "<I"),
    "cd method": _cd(10, "<H"),
    "local compressed size": _local(18, "<I"),
    "local size": _local(22, "<I"),
    "local crc": _local(14, "<I"),
    "local method": _local(8, "<H"),
    "local extra length": _local(28, "<H"),  # the data moved: into the next member
    "entry at another member": _point_at_other,
    "local name": _rename_local,
}

members = st.lists(st.builds(Member, payload=st.binary(max_size=300), deflated=st.booleans(),
                             zip64=st.booleans()), min_size=1, max_size=4)


# ---------------------------------------------------------------------------- verdicts


def imgprep_verdict(path: Path) -> str:
    """"ok", or what imgprep refuses: the archive at listing, or a member when read."""
    _cached.cache_clear()
    try:
        index = read_index(path)
    except SourceFormatError as e:
        return f"archive: {e}"
    if index.refused:
        return f"listing: {index.refused[0].reason}"
    fd = os.open(path, os.O_RDONLY)
    try:
        for i, name in enumerate(index.names):
            try:
                read_zip_member(fd, ZipEntry(
                    name, int(index.offset[i]), int(index.head[i]), int(index.stored[i]),
                    int(index.size[i]), int(index.codec[i]), int(index.crc[i]),
                    int(index.end[i])))
            except OSError as e:
                return f"member {name}: {e}"
    finally:
        os.close(fd)
    return "ok"


def sizes_disagree(path: Path) -> bool:
    """Whether a member's local header records another method, CRC-32 or size than its
    central-directory entry (0 stands for a value in a data descriptor; all ones for one in
    the local zip64 field, compared from there) or its data descriptor does, or its data
    gives another size than the central directory records."""
    data = path.read_bytes()
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            at = info.header_offset
            flags, method, _, _, crc, stored, size, n, extra = struct.unpack_from(
                "<HHHHIIIHH", data, at + 6)
            if method != info.compress_type:
                return True
            extra_field = data[at + 30 + n:at + 30 + n + extra]
            zip64 = [v for k, v in _extra_fields(extra_field) if k == 1]
            values = list(struct.unpack_from(f"<{len(zip64[0]) // 8}Q", zip64[0])) \
                if zip64 else []
            if size == 0xFFFFFFFF:
                size = values.pop(0) if values else -1
            if stored == 0xFFFFFFFF:
                stored = values.pop(0) if values else -1
            for local, central in ((crc, info.CRC), (stored, info.compress_size),
                                   (size, info.file_size)):
                if local != central and not (flags & 0x8 and local == 0):
                    return True
            end = at + 30 + n + extra + info.compress_size
            if flags & 0x8 and not any(
                    data[end + skip:end + skip + struct.calcsize(fmt)] == struct.pack(
                        fmt, info.CRC, info.compress_size, info.file_size)
                    for skip in (0, 4) for fmt in ("<III", "<IQQ")):
                return True  # the data descriptor records other values
            raw = data[at + 30 + n + extra:end]
            with contextlib.suppress(zlib.error):
                got = zlib.decompressobj(-15).decompress(raw) if method == 8 else raw
                if len(got) != info.file_size:
                    return True
    return False


def _extra_fields(extra: bytes) -> list[tuple[int, bytes]]:
    out, at = [], 0
    while at + 4 <= len(extra):
        kind, n = struct.unpack_from("<HH", extra, at)
        out.append((kind, extra[at + 4:at + 4 + n]))
        at += 4 + n
    return out


STRICTER = ("local header records another", "inflates to other than", "stored uncompressed",
            "data descriptor")


@functools.cache
def checkers() -> dict[str, Callable[[Path], bool]]:
    """{name: accepts(path)} for each zip checker on this machine."""
    found: dict[str, Callable[[Path], bool]] = {}
    if shutil.which("bsdtar"):
        found["bsdtar -tf"] = _bsdtar_accepts
    if shutil.which("unzip"):
        found["unzip -t"] = lambda p: _quiet(["unzip", "-tqq", str(p)]) == 0
    python = _strict_python()
    if python is not None:
        found[f"{python} zipfile"] = functools.partial(_zipfile_accepts, python)
    return found


def _quiet(cmd: list[str]) -> int:
    return subprocess.run(cmd, capture_output=True, timeout=60).returncode


def _bsdtar_accepts(path: Path) -> bool:
    """bsdtar lists without complaint, and lists the central directory's names (it keeps
    one entry per local header: a second entry pointing at one is dropped silently)."""
    run = subprocess.run(["bsdtar", "-tf", str(path)], capture_output=True, timeout=60)
    with zipfile.ZipFile(path) as zf:
        names = sorted(zf.namelist())
    return run.returncode == 0 and sorted(run.stdout.decode().splitlines()) == names


_ZIPFILE_CHECK = "import sys, zipfile\nz = zipfile.ZipFile(sys.argv[1])\n" \
                 "for i in z.infolist(): z.read(i)\n"


def _zipfile_accepts(python: str, path: Path) -> bool:
    return _quiet([python, "-c", _ZIPFILE_CHECK, str(path)]) == 0


def _strict_python() -> str | None:
    """A Python whose zipfile refuses overlapped entries (3.12.2 and later), if any."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    candidates = [shutil.which(n) for n in ("python3.14", "python3.13", "python3.12")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    for python in filter(None, candidates):
        probe = subprocess.run([python, "-c", "import inspect, zipfile; "
                                "print('Overlapped entries' in inspect.getsource(zipfile))"],
                               capture_output=True, text=True, timeout=60, env=env)
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return python
    return None


# ---------------------------------------------------------------------------- tests


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(members=members, streamed=st.booleans(), mutation=st.sampled_from(sorted(MUTATIONS)),
       which=st.integers(0, 3), delta=st.one_of(st.integers(-40, 40), st.integers(-3000, 3000)))
def test_imgprep_accepts_a_zip_exactly_when_every_zip_checker_does(
        members: list[Member], streamed: bool, mutation: str, which: int, delta: int) -> None:
    if not checkers():
        pytest.skip("no zip checker here (bsdtar, unzip, Python >= 3.12.2): "
                    "apt-get install libarchive-tools unzip")
    data = build(members, streamed)
    MUTATIONS[mutation](data, which % len(members), delta)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "a.zip"
        path.write_bytes(bytes(data))
        try:
            with zipfile.ZipFile(path):
                pass
        except (zipfile.BadZipFile, ValueError, OSError):
            return  # a central directory that cannot be parsed at all: refused elsewhere
        ours = imgprep_verdict(path)
        theirs = {name: accepts(path) for name, accepts in checkers().items()}
        if ours == "ok" or all(theirs.values()):
            stricter = any(why in ours for why in STRICTER) and sizes_disagree(path)
            assert (ours == "ok") == all(theirs.values()) or stricter, (mutation, ours, theirs)
        if ours == "ok":  # and what imgprep reads is what zipfile reads
            index = read_index(path)
            with zipfile.ZipFile(path) as zf:
                assert len(index.names) == len(members)
                assert [zf.read(n) for n in index.names] == [m.payload for m in members]


def test_the_zip_checkers_are_here_or_named() -> None:
    """One line says which cross-check cannot run on this machine."""
    missing = [name for name in ("bsdtar -tf", "unzip -t") if name not in checkers()]
    if missing or not any(name.endswith("zipfile") for name in checkers()):
        pytest.skip(f"cross-check without {', '.join(missing) or 'a Python >= 3.12.2'}: "
                    "apt-get install libarchive-tools unzip; a Python >= 3.12.2 on PATH")


@pytest.mark.parametrize("mutation", sorted(set(MUTATIONS) - {"none"}))
def test_each_kind_of_disagreement_is_refused_naming_the_member(tmp_path: Path,
                                                                mutation: str) -> None:
    payloads = [Member(bytes(range(256)) * (k + 2), deflated=k % 2 == 1, zip64=False)
                for k in range(3)]
    data = build(payloads, streamed=False)
    MUTATIONS[mutation](data, 1, 1)
    path = tmp_path / "a.zip"
    path.write_bytes(bytes(data))
    verdict = imgprep_verdict(path)
    assert verdict != "ok"
    assert "n01440764_1.JPEG" in verdict or "n01440764_2.JPEG" in verdict
    assert "re-download" in verdict or "re-pack" in verdict  # (a method it cannot read)


def _forged(path: Path, images: Path) -> Path:
    """The Kaggle-shaped zip of two real images and a forged central entry: a goldfish
    (n01443537) named n01443537_99999.JPEG whose entry points at the local header of a dog
    (n02110063), with the dog's CRC and sizes."""
    fish = next(images.glob("n01443537_*.JPEG")).read_bytes()
    dog = next(images.glob("n02110063_*.JPEG")).read_bytes()
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{TOP}train/n01443537/n01443537_1.JPEG", fish)
        zf.writestr(f"{TOP}train/n02110063/n02110063_1.JPEG", dog)
        zf.writestr(f"{TOP}train/n01443537/n01443537_99999.JPEG", fish)
    data = bytearray(path.read_bytes())
    _point_at_other(data, 2, 1)  # entry 2 takes entry 1's place: the dog's
    path.write_bytes(bytes(data))
    _cached.cache_clear()
    return path


@pytest.mark.realdata
def test_an_entry_pointing_at_another_image_refuses_the_zip(real_data: Path,
                                                             tmp_path: Path) -> None:
    src = _forged(tmp_path / "imagenet-object-localization-challenge.zip", real_data / "images")
    with zipfile.ZipFile(src) as zf:  # the forged entry holds the dog's local header
        assert zf.getinfo(f"{TOP}train/n01443537/n01443537_99999.JPEG").header_offset == \
            zf.getinfo(f"{TOP}train/n02110063/n02110063_1.JPEG").header_offset
    r = invoke("convert", src, "-o", tmp_path / "out", "-j", "1")
    assert r.exit_code == 3, r.output
    assert "n02110063_1.JPEG" in r.stderr and "n01443537_99999.JPEG" in r.stderr
    assert "overlaps" in r.stderr and "re-download it" in r.stderr
    assert not (tmp_path / "out").exists()
    for checker, accepts in checkers().items():
        assert not accepts(src), checker
