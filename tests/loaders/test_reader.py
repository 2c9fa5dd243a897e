"""Reading samples by offset (``loaders.reader``): the exact bytes and labels of every sample in
the order asked, neighbouring samples of one shard in one ``pread`` (across gaps up to ``GAP``,
up to ``MAX_READ`` a call), never one read across two shards, and a shard that changed since
it was indexed named rather than misread. Shards are written with imgprep's writer and located
with ``tarfile``, independently of the sample index."""

from __future__ import annotations

import os
import random
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import loaders.reader as reader_mod
from imgprep.shards.writers import ShardWriter
from loaders.errors import LoaderError
from loaders.reader import GAP, Locations, Reader

Sample = tuple[str, bytes, int]  # key, jpg bytes, label


def payload(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def write_shards(folder: Path, shards: list[list[Sample]]) -> Locations:
    """Write each list of samples as a shard; their Locations as the loader builds them."""
    names, sizes, cols = [], [], [[], [], [], []]
    for i, samples in enumerate(shards):
        path = folder / f"train-{i:06d}.tar"
        with ShardWriter(path) as w:
            for key, data, label in samples:
                w.add(key, {"jpg": data, "cls": str(label).encode()})
        with tarfile.open(path) as tf:
            members = {m.name: m for m in tf}
        for key, _, _ in samples:
            jpg, cls = members[f"{key}.jpg"], members[f"{key}.cls"]
            for col, value in zip(cols, (jpg.offset_data, jpg.size, cls.offset_data, cls.size),
                                  strict=True):
                col.append(value)
        names.append(path.name)
        sizes.append(path.stat().st_size)
    first = np.concatenate([[0], np.cumsum([len(s) for s in shards])]).astype(np.int64)
    c = [np.asarray(col, np.int64) for col in cols]
    return Locations(folder, tuple(names), np.asarray(sizes, np.int64), first, (c[0], c[1]),
                     (c[2], c[3]))


Preads = list[tuple[int, int, int]]  # fd, size, offset


@pytest.fixture
def preads(monkeypatch: pytest.MonkeyPatch) -> Preads:
    """Every ``os.pread`` the reader makes, in order."""
    calls: Preads = []
    real: Callable[[int, int, int], bytes] = os.pread

    def counting(fd: int, size: int, offset: int) -> bytes:
        calls.append((fd, size, offset))
        return real(fd, size, offset)
    monkeypatch.setattr(os, "pread", counting)
    return calls


def test_samples_come_back_byte_for_byte_in_the_order_asked(tmp_path: Path) -> None:
    shards = [[(f"s{i}_{j}", payload(300 + 977 * j, 10 * i + j), 100 * i + j) for j in range(5)]
              for i in range(3)]
    loc = write_shards(tmp_path, shards)
    flat = [(f"train-{i:06d}.tar", *s) for i, samples in enumerate(shards) for s in samples]
    ids = np.asarray([7, 0, 14, 3, 8, 1, 12, 7], np.int64)  # mixed shards, one twice
    r = Reader(loc, rank=0)
    try:
        assert r.read(ids) == [flat[i] for i in ids]
    finally:
        r.close()


def test_neighbouring_samples_of_a_shard_are_one_pread(tmp_path: Path, preads: Preads) -> None:
    loc = write_shards(tmp_path, [[(f"k{j}", payload(1000 + j, j), j) for j in range(6)]])
    r = Reader(loc, rank=0)
    out = r.read(np.asarray([4, 1, 5, 0, 2, 3], np.int64))
    assert [label for *_, label in out] == [4, 1, 5, 0, 2, 3]
    ((_, size, offset),) = preads
    # from the first member's header to the end of the last member's data
    assert offset == min(loc.jpg[0][0], loc.cls[0][0]) - 512
    assert offset + size == max(loc.jpg[0][5] + loc.jpg[1][5], loc.cls[0][5] + loc.cls[1][5])


@pytest.mark.parametrize("between", [GAP - 8192, GAP + 8192])
def test_a_gap_up_to_GAP_is_read_across_and_a_wider_one_is_not(tmp_path: Path, preads: Preads,
                                                               between: int) -> None:
    samples = [("a", payload(2000, 1), 1), ("b", payload(between, 2), 2),
               ("c", payload(3000, 3), 3)]
    loc = write_shards(tmp_path, [samples])
    lo_c = min(loc.jpg[0][2], loc.cls[0][2]) - 512
    hi_a = max(loc.jpg[0][0] + loc.jpg[1][0], loc.cls[0][0] + loc.cls[1][0])
    gap = int(lo_c - hi_a)
    assert (gap <= GAP) == (between < GAP)  # the two cases fall either side of GAP
    r = Reader(loc, rank=0)
    out = r.read(np.asarray([2, 0], np.int64))
    assert [(key, data, label) for _, key, data, label in out] == [samples[2], samples[0]]
    assert len(preads) == (1 if gap <= GAP else 2)
    preads.clear()
    r.read(np.asarray([0, 1, 2], np.int64))  # contiguous: one read whatever the sizes
    assert len(preads) == 1


def test_no_read_is_longer_than_MAX_READ_unless_one_sample_is(tmp_path: Path, preads: Preads,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    samples = [(f"k{j}", payload(4000, j), j) for j in range(10)]
    loc = write_shards(tmp_path, [samples])
    monkeypatch.setattr(reader_mod, "MAX_READ", 3 * 5120)  # about three samples a read
    r = Reader(loc, rank=0)
    out = r.read(np.arange(10, dtype=np.int64))
    assert [(key, data, label) for _, key, data, label in out] == samples
    assert len(preads) > 1 and all(size <= 3 * 5120 for _, size, _ in preads)
    spans = sorted((offset, offset + size) for _, size, offset in preads)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))  # no byte twice


def test_samples_of_two_shards_are_never_one_read(tmp_path: Path, preads: Preads) -> None:
    loc = write_shards(tmp_path, [[(f"a{j}", payload(500, j), j) for j in range(3)],
                                  [(f"b{j}", payload(500, 9 + j), 10 + j) for j in range(3)]])
    r = Reader(loc, rank=0)
    out = r.read(np.asarray([3, 2, 4, 0], np.int64))
    assert [label for *_, label in out] == [10, 2, 11, 0]
    assert len(preads) == 2 and len({fd for fd, _, _ in preads}) == 2


def test_a_shard_changed_since_it_was_indexed_is_named(tmp_path: Path) -> None:
    loc = write_shards(tmp_path, [[(f"k{j}", payload(700, j), j) for j in range(3)]])
    path = tmp_path / loc.names[0]
    data = bytearray(path.read_bytes())
    data[int(loc.jpg[0][1]) - 512] ^= 0x01  # the first byte of sample 1's jpg header (its name)
    path.write_bytes(bytes(data))
    at = int(loc.jpg[0][1]) - 512  # the message names the header's byte in the shard
    with pytest.raises(LoaderError, match=rf"rank 3: {loc.names[0]}: the tar header at byte "
                                          rf"{at} is not the jpg member of 700 bytes .*imgprep "
                                          r"index"):
        Reader(loc, rank=3).read(np.asarray([1], np.int64))
    path.write_bytes(bytes(data[:-512]))
    with pytest.raises(LoaderError, match=f"{path} is {len(data) - 512} bytes"):
        Reader(loc, rank=0).read(np.asarray([0], np.int64))


def test_a_batchs_reads_are_announced_before_the_first_is_waited_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pread's span was advised (``WILLNEED``) first, at most ``MAX_OPEN`` ahead: a
    cold set is read at the disk's queue depth, with no descriptor opened twice a batch."""
    monkeypatch.setattr(reader_mod, "MAX_OPEN", 4)
    shards = [[(f"s{i}", payload(500, i), i)] for i in range(10)]  # one read a shard
    loc = write_shards(tmp_path, shards)
    calls: list[tuple[str, int, int]] = []
    real_pread, real_advise, real_open = os.pread, os.posix_fadvise, os.open

    def pread(fd: int, size: int, offset: int) -> bytes:
        calls.append(("read", offset, size))
        return real_pread(fd, size, offset)

    def advise(fd: int, offset: int, size: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_WILLNEED
        calls.append(("advise", offset, size))
        real_advise(fd, offset, size, advice)

    opened: list[str] = []

    def counting_open(path: Any, flags: int, *args: Any) -> int:
        opened.append(str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "posix_fadvise", advise)
    monkeypatch.setattr(os, "open", counting_open)
    r = Reader(loc, rank=0)
    try:
        out = r.read(np.asarray([9, 2, 5, 0, 7, 1, 8, 3, 6, 4], np.int64))
    finally:
        r.close()
    assert [label for *_, label in out] == [9, 2, 5, 0, 7, 1, 8, 3, 6, 4]
    kinds = "".join("a" if k == "advise" else "r" for k, _, _ in calls)
    assert kinds == "aaaarrrr" "aaaarrrr" "aarr"  # MAX_OPEN advised, then those read
    for at in range(0, len(calls), 8):
        chunk = calls[at:at + 8]
        half = len(chunk) // 2
        assert [c[1:] for c in chunk[:half]] == [c[1:] for c in chunk[half:]]
    assert len(opened) == len(set(opened)) == 10  # every shard opened once
