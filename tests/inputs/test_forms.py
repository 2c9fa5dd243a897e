"""Detection (``imgprep.inputs.forms``): each form recognised from the path a user would give,
its splits, label sources and what it skips; downloads in a form imgprep does not read are
refused saying what they are and the command that makes a readable form; one image gets the
same key in every form."""

from __future__ import annotations

import bz2
import gzip
import importlib
import importlib.util
import lzma
import os
import random
import re
import shutil
import zipfile
from pathlib import Path

import pytest

from imgprep.errors import InputMissingError, SourceFormatError
from imgprep.inputs import forms
from imgprep.inputs.fakes import FAKES, SampleSpec, make_fake
from imgprep.inputs.forms import FORMS, ListContext, detect, form_names, form_of, list_split
from imgprep.inputs.forms.base import TEST_REASON
from imgprep.inputs.keys import member_key, split_wnid_suffix
from imgprep.inputs.reader import SourceReader
from imgprep.inputs.ziplist import _cached
from tests.support import jpeg, write_tar
from tests.support.lfs import as_pointers

SPEC = SampleSpec(classes=3, per_class=4, val=5, test=2, seed=7)
ZIP = "imagenet-object-localization-challenge.zip"
# Two images in each split: two parquet files each, as SPEC gives, from fewer images.
HUB_SPEC = SampleSpec(classes=2, per_class=1, val=2, test=2, seed=7)


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The image-net.org train tar, the Kaggle zip and the tree that zip extracts to."""
    root = tmp_path_factory.mktemp("forms")
    found = {form: Path(make_fake(form, root / form, SPEC).inputs[0])
             for form in ("ilsvrc", "kaggle-zip")}
    with zipfile.ZipFile(found["kaggle-zip"]) as zf:
        zf.extractall(root / "kaggle")
    return {**found, "kaggle": root / "kaggle"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The Hub's two forms of the fake set, downloaded; tests that change one copy it."""
    root = tmp_path_factory.mktemp("hub")
    forms = ["hf-targz"] + (["hf-parquet"] if importlib.util.find_spec("pyarrow") else [])
    return {form: Path(make_fake(form, root / form, HUB_SPEC).inputs[0]) for form in forms}


def _clone(hub: dict[str, Path], form: str, to: Path) -> Path:
    if form == "hf-parquet":
        pytest.importorskip("pyarrow")
    shutil.copytree(hub[form], to)
    return to


def _images(found_split: object) -> dict[str, tuple[str, bytes]]:
    listing = list_split(found_split, ListContext())  # type: ignore[arg-type]
    assert listing.errors == ()
    with SourceReader(listing.containers) as reader:
        return {listing.key_str(i): (listing.wnid_str(i), reader.read_item(listing, i))
                for i in range(len(listing))}


# ---------------------------------------------------------------------------- detection


def test_the_form_list_ends_with_the_form_that_takes_anything() -> None:
    assert FORMS[-1].NAME == "ilsvrc" and form_names()[-1] == "ilsvrc"
    assert list(FAKES) == list(form_names())


def test_every_form_module_is_registered_once_under_its_own_name() -> None:
    """A module in ``forms/`` is a form in the registry (its protocol checked by mypy), or
    the protocol itself, or the refusals that run before any form."""
    folder = Path(forms.__file__).parent
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__", "base", "refusals"}
    assert sorted(f.__name__.rpartition(".")[2] for f in FORMS) == sorted(modules)
    assert len(set(form_names())) == len(FORMS)
    for name in form_names():
        assert form_of(name).NAME == name
        module, _, writer = form_of(name).FAKE.partition(":")
        assert callable(getattr(importlib.import_module(module), writer)), name


def test_kaggle_zip_is_detected_with_its_splits_labels_and_skips(fakes: dict[str, Path]) -> None:
    found = detect(fakes["kaggle-zip"])
    assert found.form == "kaggle-zip"
    assert [(s.split, s.images, s.by_default, s.labelled) for s in found.splits] == [
        ("train", 12, True, True), ("val", 5, True, True), ("test", 2, False, False)]
    train, val, test = found.splits
    assert train.prefix == "ILSVRC/Data/CLS-LOC/train/" and train.path == fakes["kaggle-zip"]
    assert [str(t) for t in val.truth] == [f"{fakes['kaggle-zip']}/LOC_val_solution.csv"]
    assert [str(s) for s in found.skipped] == [
        "ILSVRC/Data/CLS-LOC/test: 2 images without labels; --split test converts them as an "
        "unlabelled split",
        "ILSVRC/Annotations: 11 files: bounding boxes (XML), not images",
        "ILSVRC/ImageSets: 3 files: image lists, not images",
        "LOC_train_solution.csv, LOC_sample_submission.csv: bounding boxes and a sample "
        "submission, not labels"]
    assert test.split == "test"


def test_the_folder_the_kaggle_zip_was_downloaded_into_reads_the_zip(
        fakes: dict[str, Path], tmp_path: Path) -> None:
    folder = fakes["kaggle-zip"].parent
    found = detect(folder)
    assert found.form == "kaggle-zip" and found.root == fakes["kaggle-zip"]
    assert [s.path for s in found.splits] == [fakes["kaggle-zip"]] * 3
    both = tmp_path / "both"  # the zip and the tree it was extracted to: the tree is read
    both.mkdir()
    (both / fakes["kaggle-zip"].name).symlink_to(fakes["kaggle-zip"])
    (both / "ILSVRC").symlink_to(fakes["kaggle"] / "ILSVRC")
    assert detect(both).form == "kaggle"


@pytest.mark.parametrize("where", ["", "ILSVRC", "ILSVRC/Data", "ILSVRC/Data/CLS-LOC"])
def test_the_extracted_kaggle_tree_is_detected_from_any_level(fakes: dict[str, Path],
                                                              where: str) -> None:
    found = detect(fakes["kaggle"] / where if where else fakes["kaggle"])
    assert found.form == "kaggle"
    assert [s.split for s in found.splits] == ["train", "val", "test"]
    assert found.splits[1].truth == (fakes["kaggle"] / "LOC_val_solution.csv",)
    assert f"ILSVRC/Data/CLS-LOC/test: 2 {TEST_REASON}" in map(str, found.skipped)
    assert any(s.what == "ILSVRC/Annotations" for s in found.skipped)


def test_zip_tree_and_tars_list_the_same_keys_classes_and_bytes(fakes: dict[str, Path]) -> None:
    tars = fakes["ilsvrc"].parent
    expected = {"train": _images(detect(tars / "ILSVRC2012_img_train.tar").splits[0]),
                "val": _images(detect(tars / "ILSVRC2012_img_val.tar").splits[0])}
    for form in ("kaggle", "kaggle-zip"):
        found = detect(fakes[form])
        for split in ("train", "val"):
            got = _images(found.split(split))
            assert got == expected[split], (form, split)
    assert len(expected["train"]) == 12 and all(w for w, _ in expected["train"].values())


def test_the_image_net_org_forms_are_the_last_resort(fakes: dict[str, Path],
                                                     tmp_path: Path) -> None:
    found = detect(fakes["ilsvrc"])
    assert found.form == "ilsvrc" and [s.split for s in found.splits] == [None]
    root = tmp_path / "root"
    (root / "train" / "n01440764").mkdir(parents=True)
    (root / "val").mkdir()
    (root / "test").mkdir()
    found = detect(root)  # test/: only with --split test, unlabelled
    assert [(s.split, s.by_default, s.labelled) for s in found.splits] == [
        ("train", True, True), ("val", True, True), ("test", False, False)]
    assert [s.what for s in found.skipped] == [str(root / "test")]


def test_a_named_form_is_used_or_refused(fakes: dict[str, Path]) -> None:
    assert detect(fakes["kaggle"], "kaggle").form == "kaggle"
    with pytest.raises(SourceFormatError, match=r"is not in the kaggle-zip form: it is Kaggle "
                       r".* \(--form kaggle\); leave --form out to detect its form"):
        detect(fakes["kaggle"], "kaggle-zip")
    with pytest.raises(SourceFormatError, match=r"--form nope is not a known form; pass one of"):
        detect(fakes["kaggle"], "nope")


def test_a_missing_input_names_the_forms_without_a_non_existent_option(tmp_path: Path) -> None:
    with pytest.raises(InputMissingError) as e:
        detect(tmp_path / "nothing")
    assert "--input" not in str(e.value) and "as INPUT" in str(e.value)


def test_a_zip_that_is_not_kaggles_is_refused_with_what_works(tmp_path: Path) -> None:
    path = tmp_path / "mine.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("pics/a.JPEG", jpeg((20, 20)))
    _cached.cache_clear()
    with pytest.raises(SourceFormatError, match=r"is a zip archive, but not Kaggle's ImageNet: "
                       r"no image is under ILSVRC/Data/CLS-LOC/ \(first images: pics/a.JPEG\); "
                       r"extract it \(unzip mine.zip -d DIR\) and convert DIR"):
        detect(path)


def test_a_kaggle_zip_under_one_top_folder_is_found(tmp_path: Path) -> None:
    path = tmp_path / "k.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("imagenet/LOC_val_solution.csv", "ImageId,PredictionString\n")
        zf.writestr("imagenet/ILSVRC/Data/CLS-LOC/train/n01440764/n01440764_1.JPEG", b"x")
    _cached.cache_clear()
    found = detect(path)
    assert [s.prefix for s in found.splits] == ["imagenet/ILSVRC/Data/CLS-LOC/train/"]


# ---------------------------------------------------------------------------- refusals


def _other(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(("name", "make", "said", "command"), [
    ("train.tar.zst", lambda: b"\x28\xb5\x2f\xfd" + bytes(60), "zstd-compressed",
     "zstd -d {p} -o {d}/train.tar"),
    ("train.tar.bz2", lambda: bz2.compress(b"x" * 100), "bzip2-compressed", "bunzip2 -k {p}"),
    ("train.tar.xz", lambda: lzma.compress(b"x" * 100), "xz-compressed", "unxz -k {p}"),
    ("train.7z", lambda: b"7z\xbc\xaf\x27\x1c" + bytes(60), "a 7-Zip archive",
     "7z x {p} -oDIR"),
    ("train.rar", lambda: b"Rar!\x1a\x07\x01\x00" + bytes(60), "a RAR archive",
     "unrar x {p} DIR/"),
])
def test_other_compressions_are_named_with_the_command_that_makes_them_readable(
        tmp_path: Path, name: str, make: object, said: str, command: str) -> None:
    path = _other(tmp_path / name, make())  # type: ignore[operator]
    with pytest.raises(SourceFormatError) as e:
        detect(path)
    msg = str(e.value)
    assert f"{path} is {said}, which imgprep does not read in place" in msg
    assert command.format(p=path, d=tmp_path) in msg
    assert "check the download" not in msg and "--input" not in msg


@pytest.mark.parametrize(("name", "expected"), [
    ("imagenet.zip.001", r"part 1 of a split archive \(imagenet.zip.001, imagenet.zip.002 …\): "
                         r"join the parts first: cat imagenet.zip.\[0-9\]\[0-9\]\[0-9\] > "
                         r"imagenet.zip \(the parts in order\), then convert imagenet.zip"),
    ("imagenet.7z.002", r"part 2 of a split archive .*7z x imagenet.7z.002"),
    ("imagenet.z01", r"part 1 of a split zip archive \(zip -s; the last part is imagenet.zip\): "
                     r"join the parts first \(zip -s 0 imagenet.zip --out joined.zip\)"),
])
def test_parts_of_split_archives_are_refused_naming_the_join(tmp_path: Path, name: str,
                                                             expected: str) -> None:
    path = _other(tmp_path / name, b"PK\x03\x04" + bytes(100))
    with pytest.raises(SourceFormatError, match=expected):
        detect(path)


def test_the_devkit_given_as_input_points_to_labels(tmp_path: Path) -> None:
    devkit = tmp_path / "ILSVRC2012_devkit_t12.tar.gz"
    devkit.write_bytes(gzip.compress(b"not read"))
    with pytest.raises(SourceFormatError, match=r"is the ILSVRC2012 devkit: validation ground "
                                                r"truth, not images; .*--labels .*devkit_t12"):
        detect(devkit)


def test_a_web_page_saved_as_the_archive_is_named(tmp_path: Path) -> None:
    path = _other(tmp_path / "ILSVRC2012_img_train.tar", b"<!DOCTYPE html><html>Sign in")
    with pytest.raises(SourceFormatError, match="is a text or web page .* not ImageNet data: "
                       "the download link returned a page"):
        detect(path)


LFS = (b"version https://git-lfs.github.com/spec/v1\n"
       b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
       b"size 146800000\n")
NAMES = ("train-00000-of-00294.parquet", ZIP, "ILSVRC2012_img_val.tar", "val_images.tar.gz",
         "downloaded")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("form", [None, "hf-parquet", "kaggle-zip"])
def test_a_git_lfs_pointer_is_named_whatever_it_is_called(tmp_path: Path, name: str,
                                                          form: str | None) -> None:
    path = _other(tmp_path / name, LFS)
    with pytest.raises(SourceFormatError, match=rf"{name} is a Git LFS pointer file \(oid "
                       r"sha256:4d7a2146\w+, size 146800000\), not the data: .* `git lfs pull "
                       rf"--include {name}`"):
        detect(path, form)


@pytest.mark.parametrize(("form", "files_are"), [("hf-parquet", "parquet files"),
                                               ("hf-targz", "tar.gz archives")])
@pytest.mark.parametrize("given", ["the clone", "its data folder"])
def test_a_hub_clone_without_its_lfs_objects_is_named_as_one(
        hub: dict[str, Path], tmp_path: Path, form: str, files_are: str, given: str) -> None:
    """Not "damaged or cut short" file by file: the pointers, one of them named, and the
    command that fetches the objects."""
    clone = _clone(hub, form, tmp_path / "clone")
    files = as_pointers(sorted((clone / "data").iterdir()))
    path = clone if given == "the clone" else clone / "data"
    for asked in (None, form):
        with pytest.raises(SourceFormatError) as refused:
            detect(path, asked)
        said = str(refused.value)
        assert said.startswith(f"{clone / 'data'}: all {len(files)} {files_are} are Git LFS "
                               f"pointer files, not the data ({files[0]}: oid sha256:")
        assert (f"the clone was made without its LFS objects; fetch them with `git lfs pull` "
                f"in the clone (`git -C {path} lfs pull`), then convert it again") in said


def test_a_hub_clone_with_some_lfs_objects_fetched_names_the_pointers_left(
        hub: dict[str, Path], tmp_path: Path) -> None:
    clone = _clone(hub, "hf-parquet", tmp_path / "clone")
    files = sorted((clone / "data").iterdir())
    as_pointers(files[2:4])
    with pytest.raises(SourceFormatError, match=rf": 2 of the {len(files)} parquet files are "
                       rf"Git LFS pointer files, not the data \({re.escape(str(files[2]))}: "
                       "oid sha256:"):
        detect(clone)


@pytest.mark.parametrize("name", NAMES)
def test_an_empty_file_is_named_whatever_it_is_called(tmp_path: Path, name: str) -> None:
    path = _other(tmp_path / name, b"")
    with pytest.raises(SourceFormatError, match=rf"{name} is empty \(0 bytes\): the download "
                       "or copy wrote nothing; download it again"):
        detect(path)


@pytest.mark.parametrize("name", NAMES)
def test_a_web_page_is_named_whatever_it_is_called(tmp_path: Path, name: str) -> None:
    path = _other(tmp_path / name, b"\n  <html><head><title>Quota exceeded</title>")
    with pytest.raises(SourceFormatError, match=rf"{name} is a text or web page"):
        detect(path, "hf-parquet")


def test_a_named_form_the_file_is_not_says_what_the_file_is(fakes: dict[str, Path],
                                                            tmp_path: Path) -> None:
    zipped = fakes["kaggle-zip"] / ZIP if fakes["kaggle-zip"].is_dir() else fakes["kaggle-zip"]
    with pytest.raises(SourceFormatError, match=rf"{ZIP} is not in the hf-parquet form: it is "
                       r"Kaggle .* \(--form kaggle-zip\); leave --form out"):
        detect(zipped, "hf-parquet")
    tar = write_tar(tmp_path / "x.tar", [("n01440764_1.JPEG", jpeg((20, 20)))])
    with pytest.raises(SourceFormatError, match=r"x.tar is not in the hf-parquet form: it is a "
                       r"tar of ILSVRC2012 images .* \(--form ilsvrc\)"):
        detect(tar, "hf-parquet")
    other = _other(tmp_path / "x.bin", b"\x00\x01 not a known header" * 4)
    with pytest.raises(SourceFormatError, match=r"x.bin is not in the wds form: it is in no "
                       r"form imgprep reads \(it starts b'\\x00\\x01 not a known h'\)"):
        detect(other, "wds")


def test_a_plain_tar_is_not_refused(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "x.tar", [("n01440764_1.JPEG", jpeg((20, 20)))])
    assert detect(path).form == "ilsvrc"
    assert os.path.exists(path)


# ---------------------------------------------------------------------------- keys


@pytest.mark.parametrize(("name", "key"), [
    ("ILSVRC/Data/CLS-LOC/train/n01440764/n01440764_10026.JPEG", "n01440764_10026"),
    ("n01440764.tar/n01440764_10026.JPEG", "n01440764_10026"),
    ("val/ILSVRC2012_val_00000001.JPEG", "ILSVRC2012_val_00000001"),
    ("a b/c.d.jpg", "c_d"),
    (".hidden.JPEG", "_hidden"),
])
def test_one_image_has_one_key_whatever_the_folder(name: str, key: str) -> None:
    assert member_key(name) == key


def test_a_wnid_suffix_is_split_off_only_when_it_is_a_wnid() -> None:
    assert split_wnid_suffix("n01440764_10026_n01440764") == ("n01440764_10026", "n01440764")
    assert split_wnid_suffix("ILSVRC2012_val_00000001_n01751748") == (
        "ILSVRC2012_val_00000001", "n01751748")
    assert split_wnid_suffix("n01440764_10026") == ("n01440764_10026", "")


@pytest.mark.parametrize("seed", range(40))
def test_binary_data_starting_like_a_page_is_not_called_one(tmp_path: Path, seed: int) -> None:
    """Random bytes that happen to begin with ``{`` or ``<html`` are not named a web page."""
    rng = random.Random(seed)
    start = (b"{", b" {", b"<html", b"\n<?xml")[seed % 4]
    path = _other(tmp_path / "ILSVRC2012_img_train.tar", start + rng.randbytes(4000))
    try:
        detect(path)  # detected by its name; the listing then says it is no tar
    except SourceFormatError as e:
        assert "web page" not in str(e)


@pytest.mark.parametrize("body", [
    b'{"error": "quota exceeded", "code": 429}',
    "<html><body>Connexion requise — réessayez plus tard</body></html>".encode(),
    b"<?xml version='1.0'?><Error><Code>AccessDenied</Code></Error>",
])
def test_text_pages_in_utf8_are_named(tmp_path: Path, body: bytes) -> None:
    path = _other(tmp_path / "ILSVRC2012_img_train.tar", body)
    with pytest.raises(SourceFormatError, match="is a text or web page"):
        detect(path)
