"""The Hugging Face tar.gz form: its archives, member names, the stream and its refusals."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from imgprep.errors import LabelError, SourceFormatError, UnsafeArchiveError
from imgprep.inputs.fakes.targz import targz_bytes
from imgprep.inputs.forms import ListContext, detect, list_split
from imgprep.inputs.forms import targz as form


def _archive(path: Path, members: list[tuple[str, bytes]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(targz_bytes(members))
    return path


VAL = [("ILSVRC2012_val_00000001_n01751748.JPEG", b"a" * 700),
       ("ILSVRC2012_val_00000002_n09193705.JPEG", b"b" * 900),
       ("README.txt", b"not an image")]


def test_the_download_is_detected_as_one_split_per_kind_of_archive(tmp_path: Path) -> None:
    for i in range(2):
        _archive(tmp_path / "data" / f"train_images_{i}.tar.gz",
                 [(f"n01440764_{i}_n01440764.JPEG", b"x")])
    _archive(tmp_path / "data" / "val_images.tar.gz", VAL)
    _archive(tmp_path / "data" / "test_images.tar.gz", [("ILSVRC2012_test_00000001.JPEG", b"t")])
    found = detect(tmp_path)
    assert found.form == "hf-targz"
    assert [(s.split, s.by_default, s.labelled) for s in found.splits] == [
        ("train", True, True), ("val", True, True), ("test", False, False)]
    val = found.split("val")
    assert val is not None and val.spool_bytes == (tmp_path / "data/val_images.tar.gz").stat(
    ).st_size
    assert [s.what for s in found.skipped] == [f"{tmp_path}/data/test_images.tar.gz (tar.gz)"]


def test_a_gap_in_the_train_archives_is_an_unfinished_download(tmp_path: Path) -> None:
    for i in (0, 2):
        _archive(tmp_path / f"train_images_{i}.tar.gz", [(f"n01440764_{i}_n01440764.JPEG",
                                                          b"x")])
    with pytest.raises(SourceFormatError, match="lacks train_images_1.tar.gz of the train "
                       "archives: the download is unfinished"):
        detect(tmp_path)


def test_members_are_keyed_by_canonical_stem_and_labelled_by_their_suffix(
        tmp_path: Path) -> None:
    archive = _archive(tmp_path / "in" / "val_images.tar.gz", VAL)
    (split,) = detect(archive).splits
    listing = list_split(split, ListContext(spool_dir=tmp_path / "spool", workers=1))
    assert [listing.key_str(i) for i in range(len(listing))] == [
        "ILSVRC2012_val_00000001", "ILSVRC2012_val_00000002"]
    assert [listing.wnid_str(i) for i in range(len(listing))] == ["n01751748", "n09193705"]
    assert listing.skipped == 1  # README.txt
    data = Path(listing.containers[int(listing.container[1])]).read_bytes()
    offset, size = int(listing.offset[1]), int(listing.size[1])
    assert data[offset:offset + size] == b"b" * 900
    dry = list_split(split, ListContext(spool_dir=None, workers=1))
    assert (dry.key == listing.key).all() and (dry.size == listing.size).all()
    assert dry.containers == (str(archive),)


def _hostile(path: Path, member: tarfile.TarInfo) -> Path:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tf:
        tf.addfile(tarfile.TarInfo("ILSVRC2012_val_00000001_n01751748.JPEG"), io.BytesIO())
        tf.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    path.write_bytes(gzip.compress(raw.getvalue(), mtime=0))
    return path


@pytest.mark.parametrize(("member", "why"), [
    (tarfile.TarInfo("../ILSVRC2012_val_00000002_n01751748.JPEG"), "escapes the archive"),
    (tarfile.TarInfo("/etc/ILSVRC2012_val_00000003_n01751748.JPEG"), "absolute name"),
])
def test_a_member_escaping_the_archive_refuses_it_naming_the_member(
        tmp_path: Path, member: tarfile.TarInfo, why: str) -> None:
    member.size = 3
    archive = _hostile(tmp_path / "val_images.tar.gz", member)
    (split,) = detect(archive).splits
    with pytest.raises(UnsafeArchiveError, match=f"member {member.name!r} .*{why}"):
        list_split(split, ListContext(spool_dir=tmp_path / "spool", workers=1))


def test_a_link_member_refuses_the_archive(tmp_path: Path) -> None:
    link = tarfile.TarInfo("ILSVRC2012_val_00000002_n01751748.JPEG")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    archive = _hostile(tmp_path / "val_images.tar.gz", link)
    (split,) = detect(archive).splits
    with pytest.raises(UnsafeArchiveError, match="is a symbolic link; refused"):
        list_split(split, ListContext(spool_dir=tmp_path / "spool", workers=1))


def test_a_name_with_two_classes_is_refused(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "train_images_0.tar.gz",
                       [("n01440764_3_n01443537.JPEG", b"x")])
    (split,) = detect(archive).splits
    with pytest.raises(LabelError, match="names two classes: n01440764 in its stem, "
                       "n01443537 in its suffix"):
        list_split(split, ListContext(spool_dir=tmp_path / "spool", workers=1))


def test_an_archive_without_images_is_refused_saying_so(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "bounding_boxes.tar.gz", [("data/meta.mat", b"m")])
    (split,) = detect(archive).splits
    with pytest.raises(SourceFormatError, match=r"holds no images .*1 other members"):
        list_split(split, ListContext(spool_dir=tmp_path / "spool", workers=1))
    assert form.is_targz(archive) and not form.is_targz(tmp_path)
