"""ImageNet-21k as downloaded (``fall11_whole.tar``, ``winter21_whole.tar.gz``): detected by
content, its class table made from the wnids present, a validation split held out per class
by a keyed hash; the same bytes from either archive and for any worker count, the holdout
the same whatever the listing order, another holdout refused in a finished folder, resumable
after kill -9, and read back with webdataset and with plain tarfile."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import webdataset as wds

from imgprep import ConvertOptions, convert_splits, read_manifest
from imgprep.convert.holdout import FNV_OFFSET, FNV_PRIME, MASK64, held_mask, holdout_hash
from imgprep.errors import LabelError, OutputExistsError, SourceFormatError
from imgprep.inputs.fakes import SampleSpec, make_fake
from imgprep.inputs.fakes.in21k import GZIPPED, PLAIN, archive_bytes, fake_wnid
from imgprep.inputs.forms import detect
from imgprep.inputs.synsets import ClassTable, imagenet_classes
from imgprep.job.world import World
from tests.cli.test_cli import kill_and_rerun
from tests.support import jpeg
from tests.support.cli import invoke, ok

# 10 classes: each of the seven quirks, both bad images in train, held-out shares of 0 to 3.
SPEC = SampleSpec(classes=10, per_class=9, val=0, seed=5, bad=True)
HOLD = 3


def _opts(src: Path, out: Path, **kw: Any) -> ConvertOptions:
    base: dict[str, Any] = {"num_shards": 3, "max_errors": 5, "workers": 1,
                            "holdout_per_class": HOLD}
    base["transform"] = replace(ConvertOptions(input=src, out=out).transform, size=64)
    return ConvertOptions(input=src, out=out, **{**base, **kw})


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("in21k")
    make_fake("in21k", root, SPEC)
    return root


@pytest.fixture(scope="module")
def converted(fake: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The plain tar on one worker and on two, the tar.gz on one."""
    root = tmp_path_factory.mktemp("in21k-out")
    runs = {"tar-1": (PLAIN, 1), "tar-2": (PLAIN, 2), "gz-1": (GZIPPED, 1)}
    for name, (archive, workers) in runs.items():
        convert_splits(_opts(fake / archive, root / name, workers=workers))
    return {name: root / name for name in runs}


def _members(fake: Path) -> dict[str, list[str]]:
    """{wnid: image keys} of the plain archive, read with tarfile."""
    out: dict[str, list[str]] = {}
    with tarfile.open(fake / PLAIN) as outer:
        for m in outer:
            f = outer.extractfile(m)
            assert f is not None
            with tarfile.open(fileobj=f) as inner:
                out[m.name[:-4]] = [i.name.rpartition(".")[0] for i in inner]
    return out


def _read(out: Path, split: str) -> dict[str, int]:
    """{key: label} of a split's shards, read with plain tarfile."""
    got: dict[str, int] = {}
    for shard in sorted(out.glob(f"{split}-*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf:
                if m.name.endswith(".cls"):
                    f = tf.extractfile(m)
                    assert f is not None
                    got[m.name[:-4]] = int(f.read())
    return got


def test_both_archives_are_detected_as_in21k_and_ilsvrc_is_not(fake: Path,
                                                               tmp_path: Path) -> None:
    for archive in (PLAIN, GZIPPED):
        found = detect(fake / archive)
        assert found.form == "in21k" and found.splits[0].own_classes
    assert (found.splits[0].spool_bytes > 0) is True  # the .tar.gz is staged once
    make_fake("ilsvrc", tmp_path / "ilsvrc", SampleSpec(classes=3, per_class=2, val=0))
    train = tmp_path / "ilsvrc" / "ILSVRC2012_img_train.tar"
    assert detect(train).form == "ilsvrc"
    with pytest.raises(SourceFormatError, match="not in the in21k form"):
        detect(train, "in21k")
    gzipped = tmp_path / "train.tar.gz"  # a class tar of ILSVRC2012 first: not ImageNet-21k
    gzipped.write_bytes(gzip.compress(train.read_bytes()))
    assert detect(gzipped).form != "in21k"


def test_class_table_is_the_sorted_wnids_present(fake: Path, converted: dict[str, Path]) -> None:
    wnids = sorted(_members(fake))
    known = imagenet_classes()
    assert any(known.index(w) is None for w in wnids) and any(known.index(w) for w in wnids)
    for split in ("train", "val"):
        m = read_manifest(converted["tar-1"], split)
        assert [w for w, _ in m.classes] == wnids


def test_labels_read_back_are_each_images_class_and_the_holdout_is_per_class(
        fake: Path, converted: dict[str, Path]) -> None:
    members = _members(fake)
    wnids = sorted(members)
    train, val = _read(converted["tar-1"], "train"), _read(converted["tar-1"], "val")
    assert not set(train) & set(val)
    assert read_manifest(converted["tar-1"], "train").errors == 2  # truncated, empty: logged
    for key, label in {**train, **val}.items():
        assert wnids[label] == key.partition("_")[0]
    log = (converted["tar-1"] / "train-errors.jsonl").read_text("utf-8").splitlines()
    failed = {json.loads(line)["key"] for line in log}
    for wnid, keys in members.items():
        n = len(keys)
        held = [k for k in keys if k in val]
        assert len(held) == min(HOLD, n // 2), wnid
        assert set(keys) - set(held) - failed == {k for k in keys if k in train}
    held = read_manifest(converted["tar-1"], "val").options.holdout
    assert held is not None and held.per_class == HOLD and held.seed == 0
    assert held.images == len(val) == read_manifest(converted["tar-1"], "val").total_samples
    assert read_manifest(converted["tar-1"], "train").options.holdout == held


def _outputs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())
            if p.suffix in (".tar", ".json", ".bin", ".idx")}


def test_one_and_two_workers_write_the_same_bytes(converted: dict[str, Path]) -> None:
    one, two = _outputs(converted["tar-1"]), _outputs(converted["tar-2"])
    assert one == two and "val.json" in one and "train.json" in one


def test_the_tar_gz_gives_the_same_shards_as_the_tar(converted: dict[str, Path]) -> None:
    tar, gz = _outputs(converted["tar-1"]), _outputs(converted["gz-1"])
    shards = [n for n in tar if n.endswith(".tar")]
    assert shards and all(tar[n] == gz[n] for n in shards)
    assert not (converted["gz-1"] / ".imgprep" / "train" / "spool").exists()  # removed


def test_shards_read_back_with_webdataset(converted: dict[str, Path]) -> None:
    out = converted["gz-1"]
    classes = [w for w, _ in read_manifest(out, "val").classes]
    urls = [str(p) for p in sorted(out.glob("val-*.tar"))]
    for s in wds.WebDataset(urls, shardshuffle=False).decode("pil"):
        assert s["jpg"].size == (64, 64) and s["json"]["wnid"] == classes[s["cls"]]
        assert s["json"]["source"] == f"{s['json']['wnid']}.tar/{s['__key__']}.JPEG"


@pytest.mark.parametrize("archive", [PLAIN, GZIPPED])
def test_ranks_sharing_a_folder_write_what_one_process_writes(
        fake: Path, converted: dict[str, Path], tmp_path: Path, archive: str) -> None:
    size = 3
    worlds = [World(rank=r, world_size=size, local_rank=r, local_world_size=size, node_rank=0,
                    num_nodes=1, launcher="test") for r in range(size)]
    o = _opts(fake / archive, tmp_path)
    for world in reversed(worlds):  # rank 0, which writes the manifests, last
        convert_splits(o, world)
    single = _outputs(converted["tar-1" if archive == PLAIN else "gz-1"])
    assert _outputs(tmp_path) == single


def _reference_hash(seed: int, wnid: str, key: str) -> int:
    """The holdout hash written plainly: FNV-1a 64 from a seeded basis, SplitMix64 last."""
    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    h = FNV_OFFSET ^ mix(seed & MASK64)
    for byte in f"{wnid}/{key}".encode():
        h = ((h ^ byte) * FNV_PRIME) & MASK64
    return mix(h)


def test_the_holdout_hash_is_the_documented_one() -> None:
    wnids = np.asarray([b"n00004475", b"n01440764", b"n9"], dtype="S9")
    keys = np.asarray([b"n00004475_1", b"n01440764_10026", b"x"])
    for seed in (0, 7, -1):
        got = holdout_hash(seed, wnids, keys).tolist()
        assert got == [_reference_hash(seed, w.decode(), k.decode())
                       for w, k in zip(wnids.tolist(), keys.tolist(), strict=True)]


def test_the_holdout_does_not_depend_on_listing_order() -> None:
    rng = np.random.default_rng(0)
    classes = ClassTable(("n00000001", "n00000002", "n00000003"), ("a", "b", "c"))
    labels = np.repeat(np.arange(3), [1, 7, 40]).astype(np.int16)
    keys = np.asarray([f"{classes.wnids[c]}_{i}".encode() for i, c in enumerate(labels)])

    def held(order: np.ndarray) -> set[bytes]:
        plan = SimpleNamespace(listing=SimpleNamespace(key=keys[order]), labels=labels[order],
                               classes=classes)
        return set(keys[order][held_mask(plan, 5, 3)].tolist())  # type: ignore[arg-type]

    first = held(np.arange(len(keys)))
    assert len(first) == 0 + 3 + 5
    for _ in range(3):
        assert held(rng.permutation(len(keys))) == first


def test_another_holdout_in_a_finished_folder_is_refused(fake: Path,
                                                        converted: dict[str, Path]) -> None:
    out = converted["tar-1"]
    with pytest.raises(OutputExistsError) as e:
        convert_splits(_opts(fake / PLAIN, out, holdout_per_class=HOLD + 1))
    assert f"--holdout-per-class: {HOLD} there, {HOLD + 1} now" in str(e.value)
    assert "another --out" in str(e.value)
    with pytest.raises(OutputExistsError, match="--holdout-seed: 0 there, 9 now"):
        convert_splits(_opts(fake / PLAIN, out, holdout_seed=9))
    again = convert_splits(_opts(fake / PLAIN, out))  # the same settings: complete
    assert [s.split for s in again] == ["val", "train"]


def test_what_listing_refuses_is_reported_once_with_the_train_split(
        fake: Path, tmp_path: Path) -> None:
    src = tmp_path / PLAIN
    with tarfile.open(fake / PLAIN) as old, tarfile.open(src, "w") as new:
        for m in old:
            new.addfile(m, old.extractfile(m))
        garbage = b"this is no tar\n" * 300
        info = tarfile.TarInfo("n00000001.tar")
        info.size = len(garbage)
        new.addfile(info, io.BytesIO(garbage))
    convert_splits(_opts(src, tmp_path / "out"))
    logs = {split: (tmp_path / "out" / f"{split}-errors.jsonl") for split in ("train", "val")}
    train = [json.loads(line) for line in logs["train"].read_text("utf-8").splitlines()]
    assert any("n00000001.tar" in e["source"] for e in train)
    val = logs["val"].read_text("utf-8") if logs["val"].exists() else ""
    assert "n00000001.tar" not in val


def test_a_given_class_table_without_a_wnid_is_refused_naming_the_image(
        fake: Path, tmp_path: Path) -> None:
    wnids = sorted(_members(fake))
    table = tmp_path / "classes.txt"
    table.write_text("".join(f"{w}\n" for w in wnids[1:]))
    with pytest.raises(LabelError, match=rf"{wnids[0]}.tar/{wnids[0]}_\d+.JPEG .*--classes"):
        convert_splits(_opts(fake / PLAIN, tmp_path / "out", classes=table))


def test_make_sample_writes_both_archives(tmp_path: Path) -> None:
    s = ok(invoke("make-sample", tmp_path / "s", "--form", "in21k", "--classes", "4",
                  "--per-class", "7", "--json"))
    assert s["inputs"] == [str(tmp_path / "s" / GZIPPED), str(tmp_path / "s" / PLAIN)]
    assert s["val_images"] == 0 and len(s["classes"]) == 4
    assert any(imagenet_classes().index(w) is None for w in s["classes"])


def test_dry_run_names_both_splits_and_writes_nothing(fake: Path, tmp_path: Path) -> None:
    for archive in (PLAIN, GZIPPED):
        r = ok(invoke("convert", fake / archive, "-o", tmp_path / "out", "--dry-run", "--json",
                      "--holdout-per-class", HOLD))
        assert r["form"] == "in21k" and [s["split"] for s in r["splits"]] == ["val", "train"]
        staged = [s["spool_bytes"] for s in r["splits"]]
        assert staged == ([0, 0] if archive == PLAIN else [0, (fake / GZIPPED).stat().st_size])
    assert not (tmp_path / "out").exists()


def test_a_cut_short_tar_gz_is_refused_naming_it(fake: Path, tmp_path: Path) -> None:
    data = (fake / GZIPPED).read_bytes()
    cut = tmp_path / GZIPPED
    cut.write_bytes(data[:len(data) // 2])
    assert detect(cut).form == "in21k"
    with pytest.raises(SourceFormatError, match=rf"{cut}: .*cut short.*re-download it"):
        convert_splits(_opts(cut, tmp_path / "out"))


def test_the_hubs_tar_gz_is_not_taken_for_in21k(tmp_path: Path) -> None:
    make_fake("hf-targz", tmp_path / "hub", SampleSpec(classes=2, per_class=2, val=0))
    archive = tmp_path / "hub" / "data" / "train_images_0.tar.gz"
    assert detect(archive).form == "hf-targz"


def test_the_ilsvrc_train_tar_takes_a_holdout_too(tmp_path: Path) -> None:
    make_fake("ilsvrc", tmp_path / "src", SampleSpec(classes=3, per_class=4, val=0))
    train = tmp_path / "src" / "ILSVRC2012_img_train.tar"
    val, rest = convert_splits(_opts(train, tmp_path / "out", holdout_per_class=1))
    assert (val.split, val.samples, rest.split, rest.samples) == ("val", 3, "train", 9)
    assert len(read_manifest(tmp_path / "out", "val").classes) == 1000
    val_tar = tmp_path / "src" / "ILSVRC2012_img_val.tar"
    make_fake("ilsvrc", tmp_path / "src", SampleSpec(classes=3, per_class=4, val=3))
    with pytest.raises(SourceFormatError, match="gives a val split; pass --split train"):
        convert_splits(_opts(val_tar, tmp_path / "out2"))


def _pooled_archive(root: Path, classes: int, per_class: int) -> Path:
    """ImageNet-21k's tar.gz of ``classes`` synsets (every other one outside ILSVRC2012) of
    ``per_class`` images each, cycled from a few small JPEGs: many tasks, made cheaply."""
    pool = [jpeg((96, 72), seed=i) for i in range(8)]
    wnids = imagenet_classes().wnids[::80][:classes]
    members = {fake_wnid(w, c): [(f"{fake_wnid(w, c)}_{j}.JPEG", pool[(c * 3 + j) % len(pool)])
                                 for j in range(per_class)] for c, w in enumerate(wnids)}
    root.mkdir(parents=True)
    with gzip.GzipFile(root / GZIPPED, "wb", mtime=0) as gz:
        gz.write(archive_bytes(members))
    return root / GZIPPED


@pytest.mark.slow
def test_a_killed_conversion_resumes_to_the_same_bytes(tmp_path: Path) -> None:
    """Killed once its first task is recorded (the tar.gz staged, the holdout made), the
    same command finishes to the bytes of a run never killed."""
    src = _pooled_archive(tmp_path / "src", classes=12, per_class=25)
    args = ("-j", "2", "-q", "--json", "--shard-size", "10", "--size", "32",
            "--holdout-per-class", "4")
    ok(invoke("convert", src, "-o", tmp_path / "ref", *args))
    out = tmp_path / "out"
    kill, s = kill_and_rerun(("convert", src, "-o", out, *args), out, tmp_path / "ref")
    resumed = sum(split["tasks_resumed"] for split in s["splits"])
    assert s["complete"] and resumed >= kill.records_before and resumed > 0, kill
