"""The fast shard reader refuses what no shard should hold, naming the shard and member."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from imgprep.errors import ShardError, UnsafeArchiveError
from imgprep.shards.tario import iter_members, iter_samples
from imgprep.shards.verify import verify_shards
from imgprep.shards.writers import ShardWriter


def _tar(path: Path, extra: tarfile.TarInfo, data: bytes = b"") -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        ok = tarfile.TarInfo("a.jpg")
        ok.size = 3
        tf.addfile(ok, io.BytesIO(b"abc"))
        tf.addfile(extra, io.BytesIO(data) if data else None)
    return path


def _info(name: str, kind: bytes, size: int = 0) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.size = kind, size
    if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        ti.linkname = "/etc/passwd"
    return ti


@pytest.mark.parametrize(("kind", "what"), [
    (tarfile.SYMTYPE, "symbolic link"), (tarfile.LNKTYPE, "hard link"),
    (tarfile.CHRTYPE, "character device"), (tarfile.BLKTYPE, "block device"),
    (tarfile.FIFOTYPE, "fifo"),
])
def test_links_and_devices_are_refused(tmp_path: Path, kind: bytes, what: str) -> None:
    path = _tar(tmp_path / "s-000000.tar", _info("b.jpg", kind))
    with pytest.raises(UnsafeArchiveError, match=f"'b.jpg' is a {what}; refused") as e:
        list(iter_members(path))
    assert str(path) in str(e.value)


@pytest.mark.parametrize("name", ["../evil.jpg", "/abs/evil.jpg", "x/../../evil.jpg"])
def test_escaping_names_are_refused(tmp_path: Path, name: str) -> None:
    path = _tar(tmp_path / "s-000000.tar", _info(name, tarfile.REGTYPE, 4), b"evil")
    with pytest.raises(UnsafeArchiveError, match="escapes the archive"):
        list(iter_samples(path))


def test_damage_is_a_shard_error(tmp_path: Path) -> None:
    path = tmp_path / "s-000000.tar"
    with ShardWriter(path) as w:
        w.add("k", {"jpg": b"x" * 700, "cls": b"1"})
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF  # inside the first header: its checksum no longer matches
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="checksum"):
        list(iter_members(path))
    path.write_bytes(bytes(data[:700]))
    with pytest.raises(ShardError):
        list(iter_members(path))
    with pytest.raises(ShardError, match="cannot read shard"):
        list(iter_members(tmp_path / "missing.tar"))


def test_verify_reports_a_hostile_shard(tmp_path: Path) -> None:
    from imgprep.fsutil import sha256_file
    from imgprep.sections import ManifestOptions
    from imgprep.shards.manifest import Manifest, ShardEntry

    path = _tar(tmp_path / "train-000000.tar", _info("b.jpg", tarfile.SYMTYPE))
    m = Manifest(split="train", format="shards", total_samples=1, classes=[["n0", "x"]],
                 mean=[0.5] * 3, std=[0.2] * 3,
                 options=ManifestOptions(format="shards", split="train"), tool_version="test",
                 shards=[ShardEntry(path.name, 1, path.stat().st_size, sha256_file(path))])
    rep = verify_shards(tmp_path, m, decode=False, tick=lambda n: None)
    assert any("train-000000.tar: unreadable" in p and "symbolic link" in p
               for p in rep.problems)
