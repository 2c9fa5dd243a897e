"""What a convert run may do to its output folder (``imgprep.convert.outdir``): which files
belong to a split, a rerun that differs from the finished split refused with the difference
named (or, with ``--overwrite``, the old split handed back for removal), and ``remove_split``
taking exactly that split's files, manifest first, and saying so."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from imgprep.convert.outdir import Wanted, check_folder, remove_split, split_owns
from imgprep.errors import OutputExistsError
from imgprep.sections import ManifestOptions, SourceSection
from imgprep.shards.manifest import index_name, read_manifest


@pytest.mark.parametrize("name,fmt,owned", [
    ("train-000000.tar", None, True),
    ("train-000123.tar", "shards", True),
    ("train-000123.idx", "shards", True),  # a shard's DALI index
    ("train-000000.tar", "list", False),
    ("train.json", None, True),
    ("train.json", "list", True),
    ("train-errors.jsonl", "shards", True),
    (index_name("train"), "shards", True),
    (index_name("train"), "list", False),
    ("train.txt", "list", True),
    ("train.txt", "shards", False),
    ("mean.npy", "list", True),
    ("classes.txt", None, False),  # shared by a folder's label lists
    ("val-000000.tar", None, False),
    ("val.json", None, False),
    ("train-00000.tar", None, False),
    ("train-000000.tar.bak", None, False),
    ("train-abc.tar", None, False),
    ("notes.txt", None, False),
])
def test_split_owns_only_its_own_names(name: str, fmt: str | None, owned: bool) -> None:
    assert split_owns("train", name, fmt) is owned


def test_mean_npy_belongs_to_the_train_list_only() -> None:
    assert split_owns("train", "mean.npy") and not split_owns("val", "mean.npy")
    assert not split_owns("train", "mean.npy", "shards")


def wanted_like(folder: Path, split: str = "train") -> Wanted:
    """What a rerun identical to the finished ``split`` in ``folder`` would write."""
    m = read_manifest(folder, split)
    assert m.source is not None
    return Wanted(out=folder, split=split, format=m.format, options=m.options,
                  classes=m.classes, source=m.source, tool_version=m.tool_version,
                  transform_version=m.transform_version)


def fingerprinted(want: Wanted, fingerprint: str, **options: object) -> Wanted:
    """``want`` with another fingerprint (and ``options`` changed)."""
    return replace(want, options=replace(want.options, fingerprint=fingerprint, **options))


@pytest.fixture
def shards(converted: dict[str, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(converted["shards"], tmp_path / "shards"))


def test_the_same_run_again_is_not_refused(shards: Path) -> None:
    assert check_folder(wanted_like(shards), overwrite=False) is None
    assert check_folder(wanted_like(shards), overwrite=True) is None  # resumes, never removes
    assert check_folder(replace(wanted_like(shards), split="val"), overwrite=False) is None


def test_a_differing_rerun_is_refused_naming_each_difference(shards: Path) -> None:
    before = sorted((p.relative_to(shards), p.stat().st_mtime_ns) for p in shards.rglob("*"))
    same = wanted_like(shards)
    other = replace(fingerprinted(same, "0" * 64, num_shards=4, seed=2),
                    source=replace(same.source, images=49))
    with pytest.raises(OutputExistsError) as e:
        check_folder(other, overwrite=False)
    msg = str(e.value)
    for part in (f"{shards} already holds a finished train split", "train.json",
                 "shards, 48 samples from ILSVRC2012_img_train.tar (48 images)",
                 "--shards: 3 there, 4 now", "--seed: 0 there, 2 now",
                 "input: ILSVRC2012_img_train.tar (48 images) there, "
                 "ILSVRC2012_img_train.tar (49 images) now", "--overwrite", "another --out"):
        assert part in msg, (part, msg)
    assert "--size" not in msg.split("this run differs: ")[1]  # what did not change is not named
    assert sorted((p.relative_to(shards), p.stat().st_mtime_ns)  # nothing touched
                  for p in shards.rglob("*")) == before


def test_another_format_or_only_other_labels_are_named_too(shards: Path) -> None:
    same = wanted_like(shards)
    with pytest.raises(OutputExistsError, match="--format: the folder holds shards, this run "
                                                "writes list"):
        check_folder(replace(fingerprinted(same, "1" * 64), format="list"), overwrite=False)
    with pytest.raises(OutputExistsError, match="the images or their labels"):
        check_folder(fingerprinted(same, "2" * 64), overwrite=False)


def test_overwrite_hands_back_the_split_it_replaces(shards: Path) -> None:
    old = check_folder(fingerprinted(wanted_like(shards), "0" * 64), overwrite=True)
    assert old is not None and old == read_manifest(shards, "train")


def test_an_unreadable_manifest_is_refused_or_replaced_whole(shards: Path) -> None:
    (shards / "train.json").write_text("{ not json")
    with pytest.raises(OutputExistsError, match="train.json is there but cannot be read"):
        check_folder(wanted_like_unread(shards), overwrite=False)
    old = check_folder(wanted_like_unread(shards), overwrite=True)
    assert old is not None and old.format == "?"  # both formats' files go


def wanted_like_unread(folder: Path) -> Wanted:
    return Wanted(out=folder, split="train", format="shards",
                  options=ManifestOptions(format="shards", split="train", fingerprint="0" * 64),
                  classes=[], source=SourceSection(kind="tar", name="x", images=1),
                  tool_version="0", transform_version=2)


def test_remove_split_takes_that_split_alone_manifest_first(shards: Path) -> None:
    others = {"val-000000.tar": b"v", "val.json": b"{}", "val-errors.jsonl": b"",
              "classes.txt": b"n01440764\n", "notes.txt": b"mine", ".tmp-val-000001.tar": b"t"}
    for name, data in others.items():
        (shards / name).write_bytes(data)
    (shards / "train-errors.jsonl").write_text("")
    (shards / ".imgprep" / "val").mkdir(parents=True)
    (shards / ".imgprep" / "val" / "val-000000.json").write_text("{}")
    old = read_manifest(shards, "train")
    data_files = sorted(p.name for p in shards.iterdir() if p.is_file()
                        and split_owns("train", p.name, "shards")
                        and p.name not in ("train.json", "train-errors.jsonl"))
    assert {s.name for s in old.shards} | {index_name("train")} <= set(data_files)

    line = remove_split(shards, old, "train")

    left = sorted(p.name for p in shards.iterdir() if p.is_file())
    assert left == sorted(others)
    assert list((shards / ".imgprep" / "train").iterdir()) == []
    assert (shards / ".imgprep" / "val" / "val-000000.json").is_file()
    assert line == (f"--overwrite: removed the finished train split in {shards} (shards, 48 "
                    f"samples from ILSVRC2012_img_train.tar (48 images), --size 256; "
                    f"{len(data_files)} files) before converting; {shards} holds no train split "
                    "until this run finishes")


def test_remove_split_of_a_label_list_keeps_what_it_did_not_write(converted: dict[str, Path],
                                                                  tmp_path: Path) -> None:
    out = Path(shutil.copytree(converted["list"], tmp_path / "list"))
    images = sorted(p for p in (out / "train").rglob("*.jpg"))
    assert len(images) == 48
    stray = images[0].parent / "keep-me.txt"
    stray.write_text("a user's file")
    old = read_manifest(out, "train")
    line = remove_split(out, old, "train")
    assert not any(p.exists() for p in images)
    assert stray.read_text() == "a user's file"  # only images its records name go
    for gone in ("train.json", "train.txt", "mean.npy", "classes.txt"):
        assert not (out / gone).exists(), gone
    assert "removed the finished train split" in line and "list, 48 samples" in line
