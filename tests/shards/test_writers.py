"""The shard writer: hand-built ustar headers equal tarfile's, archives read back everywhere."""

from __future__ import annotations

import hashlib
import io
import random
import tarfile
from pathlib import Path

import pytest

from imgprep.fsutil import piece_name, sweep_tmp, tmp_final, tmp_name
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


def _samples(seed: int, n: int) -> list[tuple[str, dict[str, bytes]]]:
    rng = random.Random(seed)
    return [(f"k{seed}_{i:04d}", {"jpg": rng.randbytes(rng.randint(0, 300_000)),
                                  "cls": str(i).encode(), "json": b"{}"}) for i in range(n)]


def test_a_shard_joined_from_pieces_equals_one_written_whole(tmp_path: Path) -> None:
    """Pieces written by ``piece=True`` writers and appended in order give the bytes, the
    checksum and the layout of the shard written in one go (samples larger than a write
    buffer included), and the pieces are gone."""
    parts = [_samples(1, 9), _samples(2, 0), _samples(3, 30), _samples(4, 1)]
    with ShardWriter(tmp_path / "whole.tar") as whole:
        for key, fields in (s for p in parts for s in p):
            whole.add(key, fields)
    pieces = []
    for n, part in enumerate(parts):
        path = piece_name(tmp_path / "joined.tar", n)
        with ShardWriter(path, piece=True) as w:
            for key, fields in part:
                w.add(key, fields)
        assert w.sha256 == "" and w.bytes == path.stat().st_size
        pieces.append((path, w.layout()))
    with ShardWriter(tmp_path / "joined.tar") as joined:
        joined.add("first", {"jpg": b"x" * 700})  # a sample before the pieces, still pending
        for path, layout in pieces:
            joined.append_piece(path, layout)
    with ShardWriter(tmp_path / "whole2.tar") as whole2:
        whole2.add("first", {"jpg": b"x" * 700})
        for key, fields in (s for p in parts for s in p):
            whole2.add(key, fields)
    data = (tmp_path / "joined.tar").read_bytes()
    assert data == (tmp_path / "whole2.tar").read_bytes()
    assert (joined.samples, joined.bytes, joined.sha256) == (
        whole2.samples, len(data), hashlib.sha256(data).hexdigest())
    a, b = joined.layout(), whole2.layout()
    assert (a.exts, a.keys) == (b.exts, b.keys)
    for field in ("counts", "offset", "size", "ext"):
        assert getattr(a, field).tolist() == getattr(b, field).tolist()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["joined.tar", "whole.tar",
                                                          "whole2.tar"]


def test_pieces_are_swept_with_their_shard_and_kept_with_it(tmp_path: Path) -> None:
    """A killed run's pieces (and their own temporary files) are temporary files of their
    shard: a sweep removes them, unless it keeps that shard's name (another rank is
    writing it)."""
    for shard in ("train-000000.tar", "train-000001.tar"):
        piece = piece_name(tmp_path / shard, 16)
        piece.write_bytes(b"x")
        tmp_name(piece).write_bytes(b"y")
    assert tmp_final(tmp_name(piece_name(tmp_path / "a.tar", 3)).name) == "a.tar"
    assert sweep_tmp(tmp_path, {"train-000001.tar"}) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".tmp-.tmp-train-000001.tar.piece-16", ".tmp-train-000001.tar.piece-16"]
