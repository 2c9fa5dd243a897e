"""The shard writer: hand-built ustar headers equal tarfile's, archives read back everywhere."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from imgprep.shards.tarfmt import RECORD, header_bytes, tar_header
from imgprep.shards.writers import ShardWriter


@pytest.mark.parametrize(("name", "size"), [
    ("a.jpg", 0), ("n01440764_10026.jpg", 12345), ("n03992509_potter's_wheel.cls", 3),
    ("x" * 96 + ".jpg", 7), ("x" * 97 + ".json", 7), ("é_key.jpg", 10), ("k.jpg", 8**11 - 1),
    ("y" * 100, 1), ("big.jpg", 8**11), ("a" * 101, 2),
])
def test_header_bytes_equal_tarfile(name: str, size: int) -> None:
    expected = tar_header(name, size).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    assert header_bytes(name, size) == expected


def _reference(samples: list[tuple[str, dict[str, bytes]]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for key, fields in samples:
            for ext in sorted(fields):
                tf.addfile(tar_header(f"{key}.{ext}", len(fields[ext])), io.BytesIO(fields[ext]))
    return buf.getvalue()


def test_shard_equals_tarfile_archive(tmp_path: Path) -> None:
    samples = [(f"key_{i}", {"jpg": bytes([i]) * (i * 37), "cls": str(i).encode()})
               for i in range(40)] + [("ü" * 60, {"jpg": b"x" * 513, "cls": b"1"})]
    with ShardWriter(tmp_path / "s-000000.tar") as w:
        for key, fields in samples:
            w.add(key, fields)
    data = (tmp_path / "s-000000.tar").read_bytes()
    assert data == _reference(samples)
    assert len(data) % RECORD == 0
    assert (w.samples, w.bytes, w.sha256) == (41, len(data), hashlib.sha256(data).hexdigest())
    with tarfile.open(tmp_path / "s-000000.tar") as tf:
        members = tf.getmembers()
        assert [m.name for m in members[:2]] == ["key_0.cls", "key_0.jpg"]
        assert all((m.mtime, m.uid, m.gid, m.mode, m.uname) == (0, 0, 0, 0o644, "")
                   for m in members)
        f = tf.extractfile("key_39.jpg")
        assert f is not None and f.read() == bytes([39]) * (39 * 37)


def test_failed_shard_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), ShardWriter(tmp_path / "s-000000.tar") as w:
        w.add("a", {"jpg": b"1"})
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []
