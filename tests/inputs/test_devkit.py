"""The ILSVRC2012 devkit: its ID -> wnid map ships with the package (checked by sha256 and
against the class table, equal to the real map_clsloc.txt), and its archive is read as ground
truth through a stream (the tar format's stream walk), refusing members that escape it, a
linked ground truth and a truncated download."""

from __future__ import annotations

import gzip
import io
import lzma
import tarfile
from pathlib import Path

import pytest

from imgprep.errors import LabelError, SourceFormatError, UnsafeArchiveError
from imgprep.inputs import devkit
from imgprep.inputs.devkit import archive_ground_truth, devkit_wnids, is_archive
from imgprep.inputs.groundtruth import LabelCheck, read_ground_truth
from imgprep.inputs.synsets import imagenet_classes
from tests.support import devkit_archive

CLASSES = imagenet_classes()
GT = "ILSVRC2012_validation_ground_truth.txt"
TOP = "ILSVRC2012_devkit_t12"


def test_the_shipped_map_holds_every_class_once() -> None:
    wnids = devkit_wnids()
    assert len(wnids) == 1000 and sorted(wnids) == list(CLASSES.wnids)
    assert devkit_wnids() is wnids  # read and checked once


@pytest.mark.realdata
def test_the_shipped_map_is_the_real_map_clsloc(real_data: Path) -> None:
    rows = [ln.split() for ln in (real_data / "meta" / "map_clsloc.txt").read_text().splitlines()]
    assert {int(i): w for w, i, *_ in rows} == dict(enumerate(devkit_wnids(), 1))


def test_a_damaged_devkit_map_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    devkit_wnids.cache_clear()
    monkeypatch.setattr(devkit, "DEVKIT_IDS_SHA256", "0" * 64)
    try:
        with pytest.raises(LabelError, match=r"ilsvrc2012_devkit_ids.txt has sha256 e85e4969.*"
                                             r"not 0{64}.*reinstall imgprep"):
            devkit_wnids()
    finally:
        devkit_wnids.cache_clear()


@pytest.mark.parametrize("form", ["tar.gz", "tar", "tar.xz"])
def test_the_devkit_archive_reads_as_its_ground_truth(sample: Path, tmp_path: Path,
                                                      form: str) -> None:
    archive = devkit_archive(tmp_path / f"{TOP}.{form}", (sample / GT).read_bytes(),
                             compress=form == "tar.gz")
    if form == "tar.xz":
        archive.write_bytes(lzma.compress(archive.read_bytes()))
    assert is_archive(archive) and not is_archive(sample / GT)
    got = read_ground_truth([archive], CLASSES)
    want = read_ground_truth([sample / GT], CLASSES)
    assert got.labels == want.labels and len(got.labels) > 20
    assert got.check == LabelCheck("canonical", len(got.labels), 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [archive.name]  # nothing extracted


def test_a_member_named_outside_the_archive_is_refused(sample: Path, tmp_path: Path) -> None:
    evil = tarfile.TarInfo("../../etc/evil.txt")
    evil.size = 3
    archive = devkit_archive(tmp_path / f"{TOP}.tar.gz", (sample / GT).read_bytes(), [evil])
    with pytest.raises(UnsafeArchiveError, match=r"member ../../etc/evil.txt escapes the "
                                                 r"archive with '..'; it is not the ILSVRC2012"):
        archive_ground_truth(archive)


def test_a_linked_ground_truth_member_is_refused(tmp_path: Path) -> None:
    link = tarfile.TarInfo(f"{TOP}/other/{GT}")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    archive = devkit_archive(tmp_path / f"{TOP}.tar.gz", b"1\n", [link])
    with pytest.raises(UnsafeArchiveError, match=rf"member {TOP}/other/{GT} is a symbolic link"):
        archive_ground_truth(archive)


def test_a_truncated_archive_is_refused(sample: Path, tmp_path: Path) -> None:
    whole = devkit_archive(tmp_path / "whole.tar.gz", (sample / GT).read_bytes()).read_bytes()
    cut = tmp_path / f"{TOP}.tar.gz"
    cut.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(SourceFormatError, match=rf"{cut.name}: the compressed stream is damaged "
                                                r"or cut short .*; re-download it"):
        read_ground_truth([cut], CLASSES)


def test_an_archive_without_the_ground_truth_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.tar.gz"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("readme.txt")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"hi"))
    other.write_bytes(gzip.compress(buf.getvalue()))
    with pytest.raises(LabelError, match=rf"other.tar.gz holds no {GT} among its 1 members; "
                                         "pass ILSVRC2012_devkit_t12.tar.gz"):
        read_ground_truth([other], CLASSES)
