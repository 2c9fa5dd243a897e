"""The image size cap on the input side: each form's recorded size checked before anything of
the image is read (``imgprep.inputs.sources.cap_sizes`` for forms read in place; the spool's
readers for the tar.gz and parquet forms), so that memory never follows an archive's claims."""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
import tarfile
import textwrap
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import pytest

from imgprep.inputs.forms import ListContext, detect, list_split
from imgprep.inputs.gzipio import gzip_members
from imgprep.inputs.sources import cap_sizes, list_source
from imgprep.inputs.spool import (
    Refused,
    SpoolJob,
    is_finished,
    read_index,
    source_stamp,
    spool_all,
    spool_path,
    write_spool,
)
from imgprep.inputs.ziplist import _cached
from tests.support import REPO, jpeg

MIB = 1 << 20
W = "n01440764"


def reasons(listing: Any) -> dict[str, str]:
    return {e.source.rpartition("/")[2]: e.reason for e in listing.errors}


def test_a_folder_file_over_the_cap_is_refused_by_its_size_on_disk(tmp_path: Path) -> None:
    (tmp_path / W).mkdir()
    (tmp_path / W / f"{W}_1.JPEG").write_bytes(jpeg((40, 30)))
    with open(tmp_path / W / f"{W}_2.JPEG", "wb") as f:
        f.truncate(1 << 30)  # sparse: a GiB that takes no disk
    listing = cap_sizes(list_source(tmp_path), 64 * MIB)
    assert [listing.key_str(i) for i in range(len(listing))] == [f"{W}_1"]
    assert reasons(listing)[f"{W}_2.JPEG"].startswith(
        "it is 1,073,741,824 bytes on disk, over --max-image-bytes (67,108,864); not read")


def _sparse_tar(path: Path, size: int) -> Path:
    """A tar of one small image and one of ``size`` zero bytes, written sparse."""
    small = jpeg((40, 30))
    with open(path, "wb") as f:
        for name, n in ((f"{W}/{W}_1.JPEG", len(small)), (f"{W}/{W}_2.JPEG", size)):
            info = tarfile.TarInfo(name)
            info.size = n
            f.write(info.tobuf(format=tarfile.GNU_FORMAT))
            if n == len(small):
                f.write(small)
            else:
                f.seek(n, io.SEEK_CUR)
            f.write(bytes(-n % 512))
        f.write(bytes(1024))
    return path


def test_a_tar_member_over_the_cap_is_refused_by_its_header(tmp_path: Path) -> None:
    src = _sparse_tar(tmp_path / "train.tar", 1 << 30)
    listing = cap_sizes(list_source(src), 64 * MIB)
    assert len(listing) == 1
    assert reasons(listing)[f"{W}_2.JPEG"].startswith(
        "its tar header records 1,073,741,824 bytes, over --max-image-bytes")


def test_a_zip_member_over_the_cap_is_refused_by_either_recorded_size(tmp_path: Path) -> None:
    src = tmp_path / "imagenet-object-localization-challenge.zip"
    top = f"ILSVRC/Data/CLS-LOC/train/{W}/"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{top}{W}_1.JPEG", jpeg((40, 30)))
        zf.writestr(f"{top}{W}_2.JPEG", bytes(8 * MIB))  # small deflated, large inflated
        zf.writestr(f"{top}{W}_3.JPEG", jpeg((400, 300), seed=3),
                    compress_type=zipfile.ZIP_STORED)
    _cached.cache_clear()
    split = detect(src).split("train")
    assert split is not None
    listing = list_split(split, ListContext())
    third = next(int(listing.size[i]) for i in range(len(listing))
                 if listing.key_str(i) == f"{W}_3")
    capped = cap_sizes(listing, third - 1)
    assert [capped.key_str(i) for i in range(len(capped))] == [f"{W}_1"]
    why = reasons(capped)
    assert why[f"{W}_2.JPEG"].startswith("its central directory records 8,388,608 bytes (")
    assert why[f"{W}_3.JPEG"].startswith(f"its central directory records {third:,} bytes")


def test_a_tar_gz_member_over_the_cap_is_refused_unread(tmp_path: Path) -> None:
    src = tmp_path / "train_images_0.tar.gz"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in ((f"{W}_1_{W}.JPEG", b"a" * 100), (f"{W}_2_{W}.JPEG", bytes(64 * MIB)),
                           ("README.txt", bytes(64 * MIB))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    src.write_bytes(gzip.compress(buf.getvalue(), compresslevel=1))
    del buf
    tracemalloc.start()
    try:
        got = list(gzip_members(src, lambda n: n.endswith(".JPEG"), "the Hub's archive",
                                max_bytes=MIB))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got[0] == (f"{W}_1_{W}.JPEG", b"a" * 100)
    assert isinstance(got[1][1], Refused) and got[1][1].reason.startswith(
        "its tar header records 67,108,864 bytes, over --max-image-bytes (1,048,576)")
    assert got[2] == ("README.txt", b"")  # not an image: skipped unread
    assert peak < 8 * MIB, f"{peak} bytes held while streaming"


def test_the_spool_keeps_refusals_and_is_remade_for_another_cap(tmp_path: Path) -> None:
    path = tmp_path / "a.spool"
    write_spool(path, iter([("a", b"abc"), ("b", Refused("too big")), ("c", b"de")]))
    index = read_index(path)
    assert index.names == ("a", "b", "c") and index.size.tolist() == [3, 0, 2]
    assert index.refused == {1: "too big"}
    source = tmp_path / "src.txt"
    source.write_text("x")
    assert source_stamp(source, 10) != source_stamp(source, 11) != source_stamp(source)
    calls: list[int | None] = []
    job = SpoolJob(source=source, spool=spool_path(tmp_path / "spool", 0, source),
                   read=_record(calls), max_bytes=10)
    spool_all([job], workers=1)
    spool_all([job], workers=1)
    assert calls == [10] and is_finished(job.spool, source_stamp(source, 10))
    spool_all([SpoolJob(source=source, spool=job.spool, read=_record(calls), max_bytes=20)],
              workers=1)
    assert calls == [10, 20]


class _record:  # noqa: N801 - used as a function; picklable for the spool's forks
    def __init__(self, calls: list[int | None]) -> None:
        self.calls = calls

    def __call__(self, source: Path, max_bytes: int | None) -> Any:
        self.calls.append(max_bytes)
        return iter([("x", b"1")])


pq = pytest.importorskip("pyarrow.parquet")


def _parquet(path: Path, value: bytes, rows: int, group: int) -> Path:
    """A parquet of the Hub's columns whose every ``image.bytes`` is ``value``, written
    dictionary-encoded (one copy on disk) but declared plain binary."""
    import pyarrow as pa

    indices = pa.array([0] * rows, pa.int32())
    image = pa.StructArray.from_arrays(
        [pa.DictionaryArray.from_arrays(indices, pa.array([value], pa.binary())),
         pa.array([f"{W}_{i}_{W}.JPEG" for i in range(rows)])], names=["bytes", "path"])
    table = pa.table({"image": image, "label": pa.array([0] * rows, pa.int64())})
    pq.write_table(table, path, row_group_size=group, store_schema=False,
                   dictionary_pagesize_limit=2 * len(value))
    return path


def test_a_parquet_row_group_over_the_cap_is_refused_unread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from imgprep.inputs import parquetio

    src = tmp_path / "train.parquet"
    small = _parquet(tmp_path / "small.parquet", b"x" * 1000, rows=3, group=3)
    big = _parquet(tmp_path / "big.parquet", bytes(range(256)) * 8192, rows=2, group=2)
    with pq.ParquetWriter(src, pq.read_schema(small)) as w:
        for part in (small, big, small):
            w.write_table(pq.read_table(part))
    read: list[int] = []
    real = pq.ParquetFile.iter_batches
    monkeypatch.setattr(pq.ParquetFile, "iter_batches",
                        lambda self, **kw: read.extend(kw["row_groups"]) or real(self, **kw))
    got = list(parquetio.iter_images(src, max_bytes=MIB))
    assert read == [0, 2]  # the row group of two 2 MiB images is never read
    assert [isinstance(x, Refused) for x in got] == [False] * 3 + [True] * 2 + [False] * 3
    assert got[3].reason.startswith("its row group 1, read whole, takes ")
    assert "bytes (by its page headers), over --max-image-bytes (1,048,576); not read" in \
        got[3].reason
    assert got[:3] == got[5:] == [b"x" * 1000] * 3


def test_parquet_pages_are_sized_by_their_headers_not_the_footer(tmp_path: Path) -> None:
    """A page header that claims more than the footer totals is what is counted: pyarrow
    would size its buffer by it."""
    import os

    from imgprep.inputs import parquetio

    src = _parquet(tmp_path / "train.parquet", bytes(range(256)) * 64, rows=1, group=1)
    meta = pq.ParquetFile(src).metadata
    col = meta.row_group(0).column(0)
    fd = os.open(src, os.O_RDONLY)
    try:
        honest = parquetio.read_cost(fd, meta, 0)
    finally:
        os.close(fd)
    headers = honest - col.total_compressed_size - col.total_uncompressed_size
    assert -64 < headers < 0  # the footer's total counts the page headers too
    data = bytearray(src.read_bytes())
    at = min(o for o in (col.dictionary_page_offset, col.data_page_offset) if o)
    # the first header: field 1 (the page type: 0x15, a one-byte varint), then field 2 (its
    # uncompressed size: 0x15, a zigzag varint)
    assert data[at] == 0x15 and data[at + 2] == 0x15
    old = _varint(data, at + 3)
    claim = _zigzag_varint(1_000_000)
    assert len(claim) == len(_zigzag_varint(old)), "the claim must keep the header's length"
    data[at + 3:at + 3 + len(claim)] = claim
    src.write_bytes(bytes(data))
    fd = os.open(src, os.O_RDONLY)
    try:
        lying = parquetio.read_cost(fd, meta, 0)
    finally:
        os.close(fd)
    assert lying - honest == 1_000_000 - old


def _varint(data: bytearray, at: int) -> int:
    out = shift = 0
    while True:
        out |= (data[at] & 0x7F) << shift
        if not data[at] & 0x80:
            return (out >> 1) ^ -(out & 1)
        at, shift = at + 1, shift + 7


def _zigzag_varint(n: int) -> bytes:
    z, out = (n << 1) ^ (n >> 63), bytearray()
    while True:
        if z < 0x80:
            return bytes(out + bytes([z]))
        out.append(z & 0x7F | 0x80)
        z >>= 7


@pytest.mark.slow
def test_a_value_a_parquet_repeats_is_held_once(tmp_path: Path) -> None:
    """64 rows naming one 8 MiB value (dictionary-encoded): 512 MiB when a row group is
    decoded whole (about 0.9 GB at the peak), a value at a time when decoded a row at a
    time; measured in a fresh process."""
    src = _parquet(tmp_path / "train.parquet", bytes(range(256)) * 32768, rows=64, group=64)
    script = textwrap.dedent(f"""
        from pathlib import Path
        from imgprep.inputs.parquetio import iter_images
        n = sum(len(x) for x in iter_images(Path({str(src)!r}), max_bytes=64 << 20))
        peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
        print(n, int(peak.split()[1]) // 1024)  # (ru_maxrss would count the parent's too)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=REPO, timeout=300, check=True)
    total, peak_mb = map(int, run.stdout.split())
    assert total == 64 * 8 * MIB
    assert peak_mb < 300, f"{peak_mb} MB peak"


def test_a_ground_truth_member_over_its_bound_is_refused_unread(tmp_path: Path) -> None:
    from imgprep.inputs.reader import MAX_TEXT_BYTES
    from imgprep.inputs.ziplist import read_index

    src = tmp_path / "a.zip"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr("LOC_val_solution.csv", bytes(MAX_TEXT_BYTES + 1))
    _cached.cache_clear()
    member = read_index(src).small["LOC_val_solution.csv"]
    with pytest.raises(OSError, match="more than a ground-truth file holds"):
        member.read_bytes()
