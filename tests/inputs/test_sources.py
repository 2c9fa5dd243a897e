"""Tests for imgprep.inputs.sources: listing every ILSVRC2012 layout in place, and hostile
archives."""

from __future__ import annotations

import gzip
import io
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from imgprep.errors import InputMissingError, SourceFormatError
from imgprep.inputs import tarscan
from imgprep.inputs.fakeset import val_numbers
from imgprep.inputs.sources import Listing, SourceReader, list_source, sanitize_key
from imgprep.inputs.synsets import imagenet_classes
from tests.support import jpeg, tar_bytes, write_tar

WNIDS = ("n01440764", "n01443537", "n15075141")


def _images(wnid: str, n: int = 3, seed: int = 0) -> list[tuple[str, bytes]]:
    """``n`` small distinct JPEG members named like ILSVRC2012 train files."""
    return [(f"{wnid}_{100 + j}.JPEG", jpeg((32, 24), seed=seed * 100 + j)) for j in range(n)]


def _train_members() -> dict[str, list[tuple[str, bytes]]]:
    return {w: _images(w, 3, seed=k) for k, w in enumerate(WNIDS)}


def _keys(listing: Listing) -> list[str]:
    return [listing.key_str(i) for i in range(len(listing))]


def _read_all(listing: Listing) -> dict[str, bytes]:
    """Every listed item's bytes, read the way the converter reads them."""
    out = {}
    with SourceReader(listing.containers) as reader:
        for i in range(len(listing)):
            out[listing.key_str(i)] = reader.read(
                int(listing.container[i]), int(listing.offset[i]), int(listing.size[i]),
                listing.member_str(i))
    return out


def _error_for(listing: Listing, fragment: str) -> str:
    """The reason of the one listing error whose source mentions ``fragment``."""
    hits = [e for e in listing.errors if fragment in e.source]
    assert len(hits) == 1, listing.errors
    return hits[0].reason


# --- layouts -------------------------------------------------------------------------------------


def test_outer_train_tar(tmp_path: Path) -> None:
    members = _train_members()
    path = write_tar(tmp_path / "ILSVRC2012_img_train.tar",
                     [(f"{w}.tar", tar_bytes(imgs)) for w, imgs in members.items()])
    listing = list_source(path)
    expected = {name[:-5]: (w, data) for w, imgs in members.items() for name, data in imgs}
    assert listing.kind == "tar"
    assert _keys(listing) == sorted(expected)
    assert listing.errors == () and listing.skipped == 0
    for i in range(len(listing)):
        key = listing.key_str(i)
        assert listing.wnid_str(i) == expected[key][0]
        assert listing.member_str(i) == f"{expected[key][0]}.tar/{key}.JPEG"
        assert int(listing.offset[i]) >= 0
    assert _read_all(listing) == {k: d for k, (_, d) in expected.items()}


def test_folder_of_class_tars(tmp_path: Path) -> None:
    members = _train_members()
    for w, imgs in members.items():
        write_tar(tmp_path / f"{w}.tar", imgs)
    listing = list_source(tmp_path)
    assert listing.kind == "class-tars"
    expected = {name[:-5]: (w, data) for w, imgs in members.items() for name, data in imgs}
    assert _keys(listing) == sorted(expected)
    assert [listing.wnid_str(i) for i in range(len(listing))] == [
        expected[k][0] for k in sorted(expected)]
    assert listing.errors == ()
    assert _read_all(listing) == {k: d for k, (_, d) in expected.items()}


def test_extracted_tree(tmp_path: Path) -> None:
    members = _train_members()
    for w, imgs in members.items():
        (tmp_path / w).mkdir()
        for name, data in imgs:
            (tmp_path / w / name).write_bytes(data)
    listing = list_source(tmp_path)
    assert listing.kind == "folder"
    expected = {name[:-5]: (w, data) for w, imgs in members.items() for name, data in imgs}
    assert _keys(listing) == sorted(expected)
    for i in range(len(listing)):
        key = listing.key_str(i)
        assert listing.wnid_str(i) == expected[key][0]
        assert listing.member_str(i) == f"{expected[key][0]}/{key}.JPEG"
        assert int(listing.offset[i]) < 0
        assert int(listing.size[i]) == len(expected[key][1])
    assert _read_all(listing) == {k: d for k, (_, d) in expected.items()}


def _val_images(n: int = 5) -> list[tuple[str, bytes]]:
    return [(f"ILSVRC2012_val_{i:08d}.JPEG", jpeg((24, 32), seed=i)) for i in range(1, n + 1)]


def test_flat_val_folder(tmp_path: Path) -> None:
    root = tmp_path / "val"
    root.mkdir()
    imgs = _val_images()
    for name, data in reversed(imgs):
        (root / name).write_bytes(data)
    listing = list_source(root)
    assert listing.kind == "folder"
    assert _keys(listing) == [n[:-5] for n, _ in imgs]
    assert all(listing.wnid_str(i) == "" for i in range(len(listing)))
    assert _read_all(listing) == {n[:-5]: d for n, d in imgs}


def test_flat_val_tar(tmp_path: Path) -> None:
    imgs = _val_images()
    path = write_tar(tmp_path / "ILSVRC2012_img_val.tar", reversed(imgs))
    listing = list_source(path)
    assert listing.kind == "tar"
    assert _keys(listing) == [n[:-5] for n, _ in imgs]
    assert [listing.member_str(i) for i in range(len(listing))] == [n for n, _ in imgs]
    assert all(listing.wnid_str(i) == "" for i in range(len(listing)))
    assert _read_all(listing) == {n[:-5]: d for n, d in imgs}


def test_png_and_jpg_extensions_listed_case_insensitively(tmp_path: Path) -> None:
    data = jpeg((16, 16))
    path = write_tar(tmp_path / "x.tar", [("a.png", data), ("b.JPG", data), ("c.Jpeg", data),
                                          ("d.gif", data)])
    listing = list_source(path)
    assert _keys(listing) == ["a", "b", "c"]
    assert listing.skipped == 1


def test_listing_independent_of_member_order(tmp_path: Path) -> None:
    members = _train_members()
    order_a = [(f"{w}.tar", tar_bytes(imgs)) for w, imgs in members.items()]
    order_b = [(f"{w}.tar", tar_bytes(list(reversed(imgs))))
               for w, imgs in reversed(members.items())]
    a = list_source(write_tar(tmp_path / "a.tar", order_a))
    b = list_source(write_tar(tmp_path / "b.tar", order_b))
    assert _keys(a) == sorted(_keys(a))
    for col in ("key", "member", "wnid", "size"):
        np.testing.assert_array_equal(getattr(a, col), getattr(b, col))
    assert _read_all(a) == _read_all(b)


def test_non_images_are_counted_as_skipped(tmp_path: Path) -> None:
    inner = tar_bytes([*_images(WNIDS[0], 2), ("notes.txt", b"hello"), ("Thumbs.db", b"x")])
    path = write_tar(tmp_path / "train.tar", [(f"{WNIDS[0]}.tar", inner),
                                              ("README", b"readme"), ("list.csv", b"a,b")])
    listing = list_source(path)
    assert len(listing) == 2
    assert listing.skipped == 4
    assert listing.errors == ()


def test_skipped_in_folders(tmp_path: Path) -> None:
    (tmp_path / WNIDS[0]).mkdir()
    for name, data in _images(WNIDS[0], 2):
        (tmp_path / WNIDS[0] / name).write_bytes(data)
    (tmp_path / WNIDS[0] / "desc.txt").write_text("x")
    (tmp_path / "LICENSE").write_text("x")
    listing = list_source(tmp_path)
    assert len(listing) == 2
    assert listing.skipped == 2


@pytest.mark.parametrize(("stem", "key"), [
    ("plain_name", "plain_name"),
    ("a.b", "a_b"),
    ("with space", "with_space"),
    ("tab\there", "tab_here"),
    ("x/y", "x_y"),
    ("n01440764_1.crop.v2", "n01440764_1_crop_v2"),
])
def test_sanitize_key(stem: str, key: str) -> None:
    assert sanitize_key(stem) == key
    assert "." not in sanitize_key(stem) and " " not in sanitize_key(stem)


def test_keys_with_dots_and_spaces_are_sanitized(tmp_path: Path) -> None:
    data = jpeg((16, 16))
    path = write_tar(tmp_path / "x.tar", [("my photo.v2.JPEG", data), ("ok.jpg", data)])
    listing = list_source(path)
    assert _keys(listing) == ["my_photo_v2", "ok"]
    assert listing.member_str(0) == "my photo.v2.JPEG"


def test_duplicate_keys_keep_first_and_record_the_rest(tmp_path: Path) -> None:
    a, b, c = jpeg((16, 16), 1), jpeg((16, 16), 2), jpeg((16, 16), 3)
    for w, data in ((WNIDS[0], a), (WNIDS[1], b), (WNIDS[2], c)):
        (tmp_path / w).mkdir()
        (tmp_path / w / "same.JPEG").write_bytes(data)
    (tmp_path / WNIDS[2] / "unique.JPEG").write_bytes(c)
    listing = list_source(tmp_path)
    assert _keys(listing) == ["same", "unique"]
    assert listing.member_str(0) == f"{WNIDS[0]}/same.JPEG"
    assert _read_all(listing)["same"] == a
    dups = sorted(e.source for e in listing.errors)
    assert dups == [f"{WNIDS[1]}/same.JPEG", f"{WNIDS[2]}/same.JPEG"]
    assert all("duplicate key 'same'" in e.reason for e in listing.errors)


def test_duplicate_key_from_sanitizing(tmp_path: Path) -> None:
    data = jpeg((16, 16))
    path = write_tar(tmp_path / "x.tar", [("a b.JPEG", data), ("a.b.JPEG", data)])
    listing = list_source(path)
    assert _keys(listing) == ["a_b"]
    assert len(listing.errors) == 1 and "duplicate key 'a_b'" in listing.errors[0].reason


def test_sample_fixture_train_and_val(sample: Path) -> None:
    train = list_source(sample / "ILSVRC2012_img_train.tar")
    assert len(train) == 48 and train.errors == ()
    assert len({train.wnid_str(i) for i in range(len(train))}) == 6
    assert all(train.key_str(i).startswith(train.wnid_str(i) + "_") for i in range(len(train)))
    val = list_source(sample / "ILSVRC2012_img_val.tar")
    wnids = sorted({train.wnid_str(i) for i in range(len(train))})
    numbers = val_numbers(imagenet_classes(), wnids, 20)
    assert _keys(val) == [f"ILSVRC2012_val_{n:08d}" for n in numbers]


# --- hostile archives ----------------------------------------------------------------------------


def _special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.linkname = linkname
    return ti


# case -> (member name, a TarInfo for non-regular members or None for a JPEG, word in the reason)
HOSTILE: dict[str, tuple[str, tarfile.TarInfo | None, str]] = {
    "dotdot": ("../evil.JPEG", None, "'..'"),
    "dotdot-deep": ("a/../../evil.JPEG", None, "'..'"),
    "absolute": ("/tmp/evil.JPEG", None, "absolute"),
    "symlink": ("link.JPEG", _special("link.JPEG", tarfile.SYMTYPE, "/etc/passwd"), "link"),
    "hardlink": ("hard.JPEG", _special("hard.JPEG", tarfile.LNKTYPE, "ok_1.JPEG"), "link"),
    "chardev": ("chr.JPEG", _special("chr.JPEG", tarfile.CHRTYPE), "device"),
    "blockdev": ("blk.JPEG", _special("blk.JPEG", tarfile.BLKTYPE), "device"),
    "fifo": ("fifo.JPEG", _special("fifo.JPEG", tarfile.FIFOTYPE), "fifo"),
}


def _hostile_member(case: str) -> tuple[str, tuple[str, bytes] | tarfile.TarInfo, str]:
    name, info, word = HOSTILE[case]
    return name, (info if info is not None else (name, jpeg((16, 16), 9))), word


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_member_in_flat_tar(tmp_path: Path, case: str) -> None:
    name, member, word = _hostile_member(case)
    good = [("ok_1.JPEG", jpeg((16, 16), 1)), ("ok_2.JPEG", jpeg((16, 16), 2))]
    path = write_tar(tmp_path / "val.tar", [good[0], member, good[1]])
    listing = list_source(path)
    assert _keys(listing) == ["ok_1", "ok_2"]
    assert _read_all(listing) == {"ok_1": good[0][1], "ok_2": good[1][1]}
    assert len(listing.errors) == 1
    err = listing.errors[0]
    assert err.source == name
    assert repr(name) in err.reason and "val.tar" in err.reason
    assert word in err.reason and "refused" in err.reason


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_member_in_inner_class_tar(tmp_path: Path, case: str) -> None:
    name, member, word = _hostile_member(case)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for m in [*_images(WNIDS[0], 1), member, *_images(WNIDS[0], 2, seed=5)[1:]]:
            if isinstance(m, tarfile.TarInfo):
                tf.addfile(m)
            else:
                ti = tarfile.TarInfo(m[0])
                ti.size = len(m[1])
                tf.addfile(ti, io.BytesIO(m[1]))
    path = write_tar(tmp_path / "train.tar", [(f"{WNIDS[0]}.tar", buf.getvalue()),
                                              (f"{WNIDS[1]}.tar", tar_bytes(_images(WNIDS[1])))])
    listing = list_source(path)
    assert len(listing) == 2 + 3
    assert _keys(listing).count(f"{WNIDS[0]}_100") == 1
    assert _keys(listing).count(f"{WNIDS[0]}_101") == 1
    assert len(listing.errors) == 1
    err = listing.errors[0]
    assert err.source == f"{WNIDS[0]}.tar/{name}"
    assert repr(name) in err.reason and word in err.reason


def test_hostile_outer_member_is_not_recursed(tmp_path: Path) -> None:
    inner = tar_bytes(_images(WNIDS[0], 2))
    path = write_tar(tmp_path / "train.tar", [("../n01443537.tar", inner),
                                              (f"{WNIDS[0]}.tar", inner)])
    listing = list_source(path)
    assert len(listing) == 2
    assert {listing.wnid_str(i) for i in range(2)} == {WNIDS[0]}
    assert [e.source for e in listing.errors] == ["../n01443537.tar"]


def test_gzip_tar_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ILSVRC2012_img_val.tar"
    path.write_bytes(gzip.compress(tar_bytes(_val_images(2))))
    with pytest.raises(SourceFormatError, match="gzip"):
        list_source(path)


def test_gzip_inner_tar_is_recorded(tmp_path: Path) -> None:
    inner = gzip.compress(tar_bytes(_images(WNIDS[0])))
    path = write_tar(tmp_path / "train.tar", [(f"{WNIDS[0]}.tar", inner),
                                              (f"{WNIDS[1]}.tar", tar_bytes(_images(WNIDS[1])))])
    listing = list_source(path)
    assert len(listing) == 3
    assert "gzip" in _error_for(listing, f"{WNIDS[0]}.tar")


@pytest.mark.parametrize("garbage", [
    bytes(np.random.default_rng(0).integers(0, 256, 20_000, dtype=np.uint8)),
    b"this is not a tar archive at all\n" * 40,
    b"\x00" * 100,
], ids=["random", "text", "short-zeros"])
def test_garbage_named_tar_is_refused(tmp_path: Path, garbage: bytes) -> None:
    path = tmp_path / "ILSVRC2012_img_train.tar"
    path.write_bytes(garbage)
    with pytest.raises(SourceFormatError, match="ILSVRC2012_img_train.tar"):
        list_source(path)


def test_empty_tar_is_refused(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "empty.tar", [])
    with pytest.raises(SourceFormatError, match="no images"):
        list_source(path)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(InputMissingError, match="nope.tar"):
        list_source(tmp_path / "nope.tar")


def test_outer_tar_cut_inside_last_inner_tar(tmp_path: Path) -> None:
    members = [(f"{w}.tar", tar_bytes(_images(w))) for w in WNIDS]
    path = write_tar(tmp_path / "train.tar", members)
    data = path.read_bytes()
    last_start = data.rindex(members[-1][1][:100])
    path.write_bytes(data[: last_start + len(members[-1][1]) // 2])
    listing = list_source(path)
    assert sorted({listing.wnid_str(i) for i in range(len(listing))}) == list(WNIDS[:2])
    assert len(listing) == 6
    assert "truncated" in _error_for(listing, f"{WNIDS[2]}.tar")
    assert _read_all(listing) == {
        n[:-5]: d for w in WNIDS[:2] for n, d in _images(w)}


@pytest.mark.parametrize("cut", [0.3, 0.5, 0.9])
def test_inner_tar_with_cut_data(tmp_path: Path, cut: float) -> None:
    imgs = [(f"{WNIDS[0]}_{j}.JPEG", jpeg((64, 48), seed=j)) for j in range(4)]
    inner = tar_bytes(imgs)
    # Cut inside the data of the last image (not inside a header).
    last_data = inner.rindex(imgs[-1][1])
    inner_cut = inner[: last_data + int(len(imgs[-1][1]) * cut)]
    path = write_tar(tmp_path / "train.tar", [(f"{WNIDS[0]}.tar", inner_cut),
                                              (f"{WNIDS[1]}.tar", tar_bytes(_images(WNIDS[1])))])
    listing = list_source(path)
    assert _keys(listing) == sorted([n[:-5] for n, _ in imgs[:3]] + [
        n[:-5] for n, _ in _images(WNIDS[1])])
    reason = _error_for(listing, imgs[-1][0])
    assert "truncated" in reason and f"{WNIDS[0]}.tar" in reason


@pytest.mark.parametrize(("where", "into_header"), [
    ("inner", 1), ("inner", 100), ("inner", 511), ("flat", 100),
])
def test_tar_cut_inside_a_header_is_reported(tmp_path: Path, where: str,
                                             into_header: int) -> None:
    """A tar that ends mid-header has lost images: that must be an error, not silence."""
    imgs = [(f"{WNIDS[0]}_{j}.JPEG", jpeg((64, 48), seed=j)) for j in range(4)]
    inner = tar_bytes(imgs)
    header_of_last = inner.rindex(imgs[-1][0].encode())
    inner_cut = inner[: header_of_last + into_header]
    if where == "inner":
        path = write_tar(tmp_path / "train.tar", [
            (f"{WNIDS[0]}.tar", inner_cut), (f"{WNIDS[1]}.tar", tar_bytes(_images(WNIDS[1])))])
        others = 3
    else:
        path = tmp_path / "val.tar"
        path.write_bytes(inner_cut)
        others = 0
    listing = list_source(path)
    assert len(listing) == 3 + others
    assert listing.errors, "a tar cut inside a header listed 3 of 4 images with no error"


@pytest.mark.serial  # a time bound
def test_many_tiny_members_list_fast(tmp_path: Path) -> None:
    n = 20_000
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(n):
            ti = tarfile.TarInfo(f"ILSVRC2012_val_{n - i:08d}.JPEG")
            ti.size = 3
            tf.addfile(ti, io.BytesIO(b"abc"))
    path = tmp_path / "many.tar"
    path.write_bytes(buf.getvalue())
    t0 = time.perf_counter()
    listing = list_source(path)
    elapsed = time.perf_counter() - t0
    assert len(listing) == n and listing.errors == ()
    assert listing.key_str(0) == "ILSVRC2012_val_00000001"
    assert listing.key_str(n - 1) == f"ILSVRC2012_val_{n:08d}"
    assert np.all(listing.key[:-1] < listing.key[1:])
    assert np.all(listing.size == 3)
    with SourceReader(listing.containers) as reader:
        assert reader.read(0, int(listing.offset[123]), 3, listing.member_str(123)) == b"abc"
    assert elapsed < 10, f"listing 20,000 members took {elapsed:.1f} s"


def _same_listing(a: Listing, b: Listing) -> None:
    for name in ("containers", "errors", "skipped", "kind"):
        assert getattr(a, name) == getattr(b, name), name
    for name in ("container", "offset", "size", "member", "key", "wnid"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_fast_header_reader_lists_what_tarfile_lists(tmp_path: Path, fmt: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    long = "d/" + "x" * 120 + "/n01440764_7.JPEG"  # a GNU long name or a PAX path
    members = [("n01440764_1.JPEG", b"a" * 700), ("sub/n01443537_2.jpg", b"b"),
               ("notes.txt", b"c" * 513), ("../n01440764_3.JPEG", b"d"), (long, b"e" * 5),
               ("ünï/n01440764_4.png", b"f" * 1024)]
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=fmt) as tf:
        folder = tarfile.TarInfo("sub")
        folder.type = tarfile.DIRTYPE
        tf.addfile(folder)
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime = len(data), 1.5  # a fractional mtime makes PAX headers
            tf.addfile(ti, io.BytesIO(data))
    fast = list_source(path)

    def refuse(*args: object) -> None:
        raise tarscan.Fallback("test")

    monkeypatch.setattr(tarscan, "scan", refuse)
    _same_listing(fast, list_source(path))
    assert len(fast) == 4 and len(fast.errors) == 1


def test_class_tars_listed_in_parallel_as_in_series(tmp_path: Path) -> None:
    tars = [(f"{w}.tar", tar_bytes(_images(w, 4, seed=k))) for k, w in enumerate(WNIDS)]
    tars.insert(1, ("n09999999.tar", gzip.compress(b"not a tar")))
    outer = write_tar(tmp_path / "ILSVRC2012_img_train.tar", tars)
    folder = tmp_path / "train"
    folder.mkdir()
    for name, data in tars:
        (folder / name).write_bytes(data)
    for path in (outer, folder):
        serial, parallel = list_source(path, workers=1), list_source(path, workers=3)
        _same_listing(serial, parallel)
        assert len(parallel) == 12 and len(parallel.errors) == 1
