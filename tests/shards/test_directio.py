"""Appending past the page cache: the bytes, the fallbacks, the errors."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import tarfile
from pathlib import Path

import pytest

from imgprep.errors import OutputError
from imgprep.shards import directio
from imgprep.shards.directio import ALIGN, AppendWriter
from imgprep.shards.writers import ShardWriter


def _on_local_disk(folder: Path) -> bool:
    fd = os.open(folder, os.O_RDONLY)
    try:
        return directio.file_system(fd) in directio.LOCAL_DISK_FS
    finally:
        os.close(fd)


@pytest.fixture
def disk(tmp_path: Path) -> Path:
    """A folder on a local disk file system (where O_DIRECT is used), or skip."""
    if not _on_local_disk(tmp_path):
        pytest.skip(f"{tmp_path} is not on a local disk file system ({directio.LOCAL_DISK_FS})")
    return tmp_path


def _pieces(seed: int, count: int, most: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(0, most)) for _ in range(count)]


def _append(path: Path, batches: list[list[bytes]], direct: bool = True) -> tuple[bytes, bool]:
    """Write ``batches`` with an AppendWriter; (what each write() handed back, joined;
    whether O_DIRECT was still on before close)."""
    seen = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        w = AppendWriter(fd, 64 << 10, direct=direct)
        for b in batches:
            seen.append(bytes(w.write(b, sum(map(len, b)))))
        still = w.direct
        w.close()
    finally:
        os.close(fd)
    return b"".join(seen), still


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "page-cache"])
def test_appended_file_is_every_byte_in_order(tmp_path: Path, direct: bool) -> None:
    """Odd piece sizes, batches smaller and larger than a block and than the buffer: the file
    and the views handed back are the bytes given, in order."""
    data = _pieces(1, 400, 9000)
    batches = [data[i:i + 7] for i in range(0, 400, 7)] + [[b"x"], [], [b"y" * (200 << 10)]]
    want = b"".join(b"".join(b) for b in batches)
    seen, still = _append(tmp_path / "f", batches, direct)
    assert (tmp_path / "f").read_bytes() == want
    assert seen == want
    assert still is (direct and _on_local_disk(tmp_path))


def test_a_file_system_that_refuses_o_direct_gets_the_same_bytes(
        disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = directio.fcntl.fcntl

    def no_direct(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == directio.fcntl.F_SETFL and arg & os.O_DIRECT:
            raise OSError(errno.EINVAL, "no O_DIRECT here")
        return real(fd, cmd, arg)

    monkeypatch.setattr(directio.fcntl, "fcntl", no_direct)
    batches = [_pieces(2, 50, 5000) for _ in range(6)]
    seen, still = _append(disk / "f", batches)
    assert not still
    assert (disk / "f").read_bytes() == seen == b"".join(b"".join(b) for b in batches)


def test_a_write_refused_under_o_direct_is_written_again_through_the_page_cache(
        disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Some file systems take the flag and refuse the first write (EINVAL): that write is
    redone without it, and the rest follow it."""
    real, refused = os.pwrite, []

    def picky(fd: int, data: memoryview, offset: int) -> int:
        if os.O_DIRECT & directio.fcntl.fcntl(fd, directio.fcntl.F_GETFL):
            refused.append(offset)
            raise OSError(errno.EINVAL, "alignment")
        return real(fd, data, offset)

    monkeypatch.setattr(directio.os, "pwrite", picky)
    batches = [_pieces(3, 40, 6000) for _ in range(5)]
    seen, still = _append(disk / "f", batches)
    assert refused == [0] and not still
    assert (disk / "f").read_bytes() == seen == b"".join(b"".join(b) for b in batches)


def test_a_failed_write_is_raised_by_the_next_call(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, data: memoryview, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(directio.os, "pwrite", full)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        w = AppendWriter(fd, ALIGN)
        w.write([bytes(3 * ALIGN)], 3 * ALIGN)  # whole blocks: handed to the thread, which fails
        with pytest.raises(OSError) as e:
            w.write([b"more"], 4)
        assert e.value.errno == errno.ENOSPC
        w.abort()
    finally:
        os.close(fd)


def test_a_shard_on_a_full_disk_is_an_output_error_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.pwrite

    def fills_up(fd: int, data: memoryview, offset: int) -> int:
        if offset >= 2 << 20:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data, offset)

    monkeypatch.setattr(directio.os, "pwrite", fills_up)
    path = tmp_path / "train-000000.tar"
    with pytest.raises(OutputError, match="disk full"), ShardWriter(path) as w:
        for i in range(400):
            w.add(f"k{i:05d}", {"jpg": random.Random(i).randbytes(20_000), "cls": b"1"})
    assert list(tmp_path.iterdir()) == []


def test_shard_bytes_do_not_depend_on_o_direct(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The same samples through O_DIRECT and through the page cache: the same shard, the same
    sha256 (checked against the file), readable by tarfile."""
    samples = [(f"n01440764_{i}", {"jpg": random.Random(i).randbytes(i * 997 % 70_000),
                                   "cls": b"%d" % i}) for i in range(120)]
    shas = []
    for name, direct in (("a.tar", True), ("b.tar", False)):
        if not direct:
            monkeypatch.setattr(directio, "set_direct", lambda fd, on: False)
        with ShardWriter(tmp_path / name) as w:
            for key, fields in samples:
                w.add(key, fields)
        data = (tmp_path / name).read_bytes()
        assert w.sha256 == hashlib.sha256(data).hexdigest() and w.bytes == len(data)
        shas.append(w.sha256)
    assert shas[0] == shas[1]
    with tarfile.open(tmp_path / "a.tar") as tf:
        assert [m.name for m in tf.getmembers()][:2] == ["n01440764_0.cls", "n01440764_0.jpg"]
        assert tf.extractfile("n01440764_7.jpg").read() == samples[7][1]["jpg"]  # type: ignore[union-attr]


MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
30 25 0:27 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684084k
41 27 0:52 / /mnt/data rw,relatime shared:7 - nfs4 server:/export rw,vers=4.2
"""


@pytest.mark.parametrize(("dev", "fs"), [((254, 0), "ext4"), ((0, 52), "nfs4"),
                                         ((0, 27), "tmpfs"), ((8, 1), None)])
def test_the_file_system_is_read_from_the_mount_of_the_files_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dev: tuple[int, int],
        fs: str | None) -> None:
    """Optional fields before the separator (``shared:7``) do not shift the type; a device
    with no mount, or no mount table, is None."""
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTINFO)
    st = os.stat_result((0o100644, 1, os.makedev(*dev), 1, 0, 0, 0, 0, 0, 0))
    monkeypatch.setattr(directio.os, "fstat", lambda fd: st)
    assert directio.file_system(0, str(table)) == fs
    assert directio.file_system(0, str(tmp_path / "missing")) is None


def test_a_file_on_nfs_is_written_through_the_page_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NFS takes O_DIRECT, but then makes every write wait for a flush of the server's disk:
    a shard on a file server goes through the page cache, with the same bytes."""
    monkeypatch.setattr(directio, "file_system", lambda fd: "nfs4")
    set_to = []
    real = directio.set_direct
    monkeypatch.setattr(directio, "set_direct", lambda fd, on: set_to.append(on) or real(fd, on))
    batches = [_pieces(4, 30, 5000) for _ in range(4)]
    seen, still = _append(tmp_path / "f", batches)
    assert not still and True not in set_to
    assert (tmp_path / "f").read_bytes() == seen == b"".join(b"".join(b) for b in batches)


def test_a_file_on_a_local_disk_gets_o_direct(disk: Path) -> None:
    """On ext4/xfs/btrfs (this machine's /tmp), the writer really bypasses the page cache."""
    fd = os.open(disk / "f", os.O_WRONLY | os.O_CREAT)
    try:
        w = AppendWriter(fd, ALIGN)
        assert w.direct and os.O_DIRECT & directio.fcntl.fcntl(fd, directio.fcntl.F_GETFL)
        w.close()
    finally:
        os.close(fd)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "page-cache"])
def test_the_digest_and_copied_files_take_every_byte_in_order(tmp_path: Path,
                                                              direct: bool) -> None:
    """The digest updated on the writer's thread is the file's sha256; ``copy_from``
    appends a whole file (larger than the buffer too) between ordinary writes."""
    other = tmp_path / "other"
    other.write_bytes(random.Random(5).randbytes(300_000))
    pieces = _pieces(6, 60, 9000)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    src = os.open(other, os.O_RDONLY)
    digest = hashlib.sha256()
    try:
        w = AppendWriter(fd, 64 << 10, direct=direct, digest=digest)
        w.write(pieces[:30], sum(map(len, pieces[:30])))
        w.copy_from(src, 300_000)
        w.write(pieces[30:], sum(map(len, pieces[30:])))
        w.close()
    finally:
        os.close(fd)
        os.close(src)
    want = b"".join(pieces[:30]) + other.read_bytes() + b"".join(pieces[30:])
    assert (tmp_path / "f").read_bytes() == want
    assert digest.hexdigest() == hashlib.sha256(want).hexdigest()
