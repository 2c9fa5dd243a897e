"""Listing a tar in place (``imgprep.inputs.tarlist``): every image's name, data offset and size
as ``tarfile`` gives them, from the fast header reader and from its ``tarfile`` fallback alike;
the class tars of an outer tar listed on forked processes, in order, with offsets into the
outer file and errors where a walk in one process would have found them."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest

from imgprep.inputs import tarscan
from imgprep.inputs.tarlist import Columns, TarJob, list_tar, run_jobs
from tests.support import jpeg, tar_bytes, write_tar

WNIDS = ("n01440764", "n01443537", "n01484850", "n01491361", "n01494475")
LONG = "n01440764/" + "a" * 120 + ".JPEG"  # a PAX path record


def list_outer(path: Path, workers: int | None = 1) -> tuple[dict[str, np.ndarray], list[str],
                                                              list[TarJob]]:
    """``path`` listed as ``list_source`` lists a tar: the tar itself, then its class tars
    (``run_jobs``), merged in the order found. Returns (columns, error sources, jobs)."""
    cols, jobs = Columns(), []
    with open(path, "rb") as f:
        list_tar(cols, f, TarJob(str(path), cols.container_id(str(path)), 0, None, str(path),
                                 "", ""), 0, jobs)
    shift = 0
    for job, part in zip(jobs, run_jobs(jobs, workers), strict=True):
        cols.merge(part, job.at, shift)
        shift += len(part.errors)
    return cols.arrays(), [e.source for e in cols.errors], jobs


def tarfile_view(path: Path) -> list[tuple[str, int, int]]:
    """(name, data offset, size) of every image member, as tarfile reads them."""
    with tarfile.open(path) as tf:
        return [(m.name, m.offset_data, m.size) for m in tf
                if m.isfile() and m.name.lower().endswith((".jpeg", ".jpg", ".png"))]


def rows(arr: dict[str, np.ndarray]) -> list[tuple[str, int, int]]:
    return [(m.decode(), int(o), int(s))
            for m, o, s in zip(arr["member"], arr["offset"], arr["size"], strict=True)]


@pytest.fixture
def flat_tar(tmp_path: Path) -> Path:
    """A tar of images in class folders, with a long (PAX) name, a folder entry and a file
    that is not an image."""
    folder = tarfile.TarInfo("n01443537")
    folder.type = tarfile.DIRTYPE
    return write_tar(tmp_path / "flat.tar", [
        ("n01440764/n01440764_1.JPEG", jpeg(seed=1)),
        folder,
        ("n01443537/n01443537_7.jpg", jpeg((90, 70), seed=2)),
        ("README.txt", b"not an image\n"),
        (LONG, jpeg(seed=3)),
        ("n01443537/x.png", b"\x89PNG" + bytes(700)),
    ])


def test_a_tar_is_listed_in_place_as_tarfile_lists_it(flat_tar: Path) -> None:
    arr, errors, jobs = list_outer(flat_tar)
    assert rows(arr) == tarfile_view(flat_tar) and len(rows(arr)) == 4
    assert errors == [] and jobs == []
    assert [w.decode() for w in arr["wnid"]] == ["n01440764", "n01443537", "n01440764",
                                                 "n01443537"]
    assert [k.decode() for k in arr["key"]] == ["n01440764_1", "n01443537_7", "a" * 120, "x"]
    with open(flat_tar, "rb") as f, tarfile.open(flat_tar) as tf:
        for name, offset, size in rows(arr):  # the offsets point at the very bytes
            f.seek(offset)
            member = tf.extractfile(name)
            assert member is not None and f.read(size) == member.read()


def test_the_tarfile_fallback_lists_the_same(flat_tar: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    fast, _, _ = list_outer(flat_tar)

    def refuse(fd: int, base: int, limit: int) -> tuple[list[tarscan.Entry], int]:
        raise tarscan.Fallback("refused here")
    monkeypatch.setattr(tarscan, "scan", refuse)
    slow, errors, _ = list_outer(flat_tar)
    assert errors == []
    for name in ("container", "offset", "size", "member", "key", "wnid"):
        assert slow[name].tolist() == fast[name].tolist(), name


def test_a_link_is_refused_and_recorded_and_the_images_around_it_listed(tmp_path: Path) -> None:
    link = tarfile.TarInfo("n01440764/evil.JPEG")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    path = write_tar(tmp_path / "link.tar", [("n01440764/a.JPEG", jpeg(seed=1)), link,
                                             ("n01440764/b.JPEG", jpeg(seed=2))])
    arr, errors, _ = list_outer(path)  # the scanner leaves links to tarfile
    assert rows(arr) == tarfile_view(path) and len(rows(arr)) == 2
    assert errors == ["n01440764/evil.JPEG"]


def outer_tar(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """ILSVRC2012_img_train.tar: five class tars, an unsafe member between the second and
    third, and an unsafe member inside the third and the fifth; and {key: bytes} of its good
    images, in order."""
    members: list[tuple[str, bytes]] = []
    images: dict[str, bytes] = {}
    for c, w in enumerate(WNIDS):
        inner = [(f"{w}_{j}.JPEG", jpeg((64 + 8 * j, 48), seed=10 * c + j)) for j in range(3)]
        images.update((name[:-5], data) for name, data in inner)
        if c in (2, 4):
            inner.insert(1, (f"../{w}_escape.JPEG", jpeg(seed=99)))
        members.append((f"{w}.tar", tar_bytes(inner)))
        if c == 1:
            members.append(("../outer_escape.JPEG", jpeg(seed=98)))
    return write_tar(tmp_path / "ILSVRC2012_img_train.tar", members), images


def test_class_tars_are_listed_on_forked_processes_in_order(tmp_path: Path) -> None:
    path, expected = outer_tar(tmp_path)
    one, errors, jobs = list_outer(path, workers=1)
    with tarfile.open(path) as tf:
        inner = [(m.offset_data, m.size) for m in tf if m.name.endswith(".tar")]
    assert [(j.base, j.length, j.wnid) for j in jobs] == \
        [(o, s, w) for (o, s), w in zip(inner, WNIDS, strict=True)]
    for workers in (2, 3, None):
        many, errors_many, _ = list_outer(path, workers=workers)
        for name in ("container", "offset", "size", "member", "key", "wnid"):
            assert many[name].tolist() == one[name].tolist(), (workers, name)
        assert errors_many == errors
    # errors in the order one walk finds them: the outer one, the third class tar's, the fifth's
    assert errors == ["../outer_escape.JPEG", f"{WNIDS[2]}.tar/../{WNIDS[2]}_escape.JPEG",
                      f"{WNIDS[4]}.tar/../{WNIDS[4]}_escape.JPEG"]
    # offsets into the outer file: the bytes there are each image's own
    assert [k.decode() for k in one["key"]] == list(expected)
    assert [w.decode() for w in one["wnid"]] == [w for w in WNIDS for _ in range(3)]
    with open(path, "rb") as f:
        for key, offset, size in zip(one["key"], one["offset"], one["size"], strict=True):
            f.seek(int(offset))
            assert f.read(int(size)) == expected[key.decode()]
