"""End-to-end tests of ``imgprep convert``: round trips through shards and label lists.

Every conversion here goes through the command line (``click.testing.CliRunner``) and is read
back independently: shards with the ``webdataset`` library and with plain ``tarfile``, label
lists the way Chainer's ``LabeledImageDataset`` reads them, images with PIL, ``mean.npy`` with
numpy. Labels are compared with the sorted-wnid index of the class each input image came from.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import math
import tarfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import webdataset as wds
from click.testing import CliRunner
from PIL import Image

import imgprep
import imgprep.convert.execute as execute
from imgprep.cli.commands import cli
from imgprep.convert.pool import PART_SHARE, part_cuts
from imgprep.inputs.synsets import imagenet_classes, imagenet_val_labels
from tests.support import encode, jpeg, nested_images, photo, tar_bytes, write_tar
from tests.support.cli import invoke

CLASSES = imagenet_classes()


# ---------------------------------------------------------------------------- helpers



def convert(src: Path, out: Path, *extra: object, workers: int = 2) -> dict[str, Any]:
    """``imgprep convert`` that must succeed; returns its JSON summary."""
    r = invoke("convert", src, "-o", out, "-j", workers, "-q", "--json", *extra)
    assert r.exit_code == 0, f"exit {r.exit_code}: {r.output}"
    summary: dict[str, Any] = json.loads(r.stdout)
    assert summary["complete"] is True
    return summary


def label_of(wnid: str) -> int:
    label = CLASSES.index(wnid)
    assert label is not None, wnid
    return label


def shard_paths(out: Path, split: str = "train") -> list[Path]:
    return sorted(out.glob(f"{split}-*.tar"))


def read_shard(path: Path) -> list[tuple[str, dict[str, bytes]]]:
    """A shard's samples in order, grouped by key with plain ``tarfile``."""
    samples: list[tuple[str, dict[str, bytes]]] = []
    with tarfile.open(path) as tf:
        for m in tf:
            key, _, ext = m.name.partition(".")
            if not samples or samples[-1][0] != key:
                samples.append((key, {}))
            f = tf.extractfile(m)
            assert f is not None, m.name
            assert ext not in samples[-1][1], f"{path.name}: {m.name} twice"
            samples[-1][1][ext] = f.read()
    return samples


def read_shards(out: Path, split: str = "train") -> dict[str, dict[str, bytes]]:
    """All samples of a split by key; a key in two places fails."""
    found: dict[str, dict[str, bytes]] = {}
    for p in shard_paths(out, split):
        for key, fields in read_shard(p):
            assert key not in found, f"{key} appears twice"
            found[key] = fields
    return found


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden state included) as relative path -> bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def decode(data: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def nested_tar_labels(path: Path) -> dict[str, int]:
    """{stem: label} of an ILSVRC2012_img_train.tar (outer tar of <wnid>.tar), read directly."""
    out: dict[str, int] = {}
    with tarfile.open(path) as outer:
        for m in outer:
            f = outer.extractfile(m)
            assert f is not None
            wnid = m.name.removesuffix(".tar")
            with tarfile.open(fileobj=io.BytesIO(f.read())) as inner:
                for im in inner:
                    out[Path(im.name).stem] = label_of(wnid)
    return out


def kaggle_labels(path: Path) -> dict[str, int]:
    """{stem: label} from a LOC_val_solution.csv (first token of PredictionString is the wnid)."""
    with path.open(newline="") as f:
        return {row["ImageId"]: label_of(row["PredictionString"].split()[0])
                for row in csv.DictReader(f)}


# ---------------------------------------------------------------------------- shared conversions


@pytest.fixture(scope="module")
def train_shards(sample: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("train_shards")
    s = convert(sample / "ILSVRC2012_img_train.tar", out, "--shards", "3")
    assert (s["split"], s["tasks"], s["errors"]) == ("train", 3, 0)
    return out


@pytest.fixture(scope="module")
def val_shards(sample: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("val_shards")
    s = convert(sample / "ILSVRC2012_img_val.tar", out, "--shard-size", "10",
                "--labels", sample / "ILSVRC2012_validation_ground_truth.txt",
                "--labels", sample / "map_clsloc.txt")
    assert (s["split"], s["tasks"], s["errors"]) == ("val", 2, 0)
    return out


@pytest.fixture(scope="module")
def train_list(sample: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("train_list")
    s = convert(sample / "ILSVRC2012_img_train.tar", out, "--format", "list")
    assert (s["format"], s["split"], s["errors"]) == ("list", "train", 0)
    return out


# ---------------------------------------------------------------------------- shards: round trips


def test_train_shards_read_back_with_webdataset(train_shards: Path, sample: Path) -> None:
    expected = nested_tar_labels(sample / "ILSVRC2012_img_train.tar")
    urls = [str(p) for p in shard_paths(train_shards)]
    assert len(urls) == 3

    raw = list(wds.WebDataset(urls, shardshuffle=False))
    keys = [s["__key__"] for s in raw]
    assert len(keys) == len(set(keys)) == len(expected)
    assert set(keys) == set(expected)
    for s in raw:
        assert {"jpg", "cls", "json"} <= set(s), s["__key__"]
        assert int(s["cls"]) == expected[s["__key__"]]

    decoded = list(wds.WebDataset(urls, shardshuffle=False).decode("pil"))
    assert [s["__key__"] for s in decoded] == keys
    for s in decoded:
        img, meta = s["jpg"], s["json"]
        assert (img.mode, img.size) == ("RGB", (256, 256)), s["__key__"]
        assert s["cls"] == expected[s["__key__"]]
        assert meta["label"] == s["cls"]
        assert meta["wnid"] == CLASSES.wnids[s["cls"]]
        assert meta["source"].endswith(f"{meta['wnid']}.tar/{s['__key__']}.JPEG")
        assert len(meta["original_size"]) == 2


def test_train_shards_read_back_with_tarfile(train_shards: Path, sample: Path) -> None:
    expected = nested_tar_labels(sample / "ILSVRC2012_img_train.tar")
    found = read_shards(train_shards)
    assert set(found) == set(expected)
    for key, fields in found.items():
        assert set(fields) == {"jpg", "cls", "json"}, key
        assert fields["cls"] == str(expected[key]).encode("ascii")
        img = decode(fields["jpg"])
        assert (img.format, img.mode, img.size) == ("JPEG", "RGB", (256, 256)), key


@pytest.mark.parametrize("labels", [
    ("ILSVRC2012_validation_ground_truth.txt", "map_clsloc.txt"),
    ("ILSVRC2012_validation_ground_truth.txt",),  # map_clsloc.txt found beside it
    ("val.txt",),
    ("LOC_val_solution.csv",),
])
def test_val_ground_truth_forms_give_identical_shards(
        sample: Path, val_shards: Path, tmp_path: Path, labels: tuple[str, ...]) -> None:
    args: list[object] = []
    for name in labels:
        args += ["--labels", sample / name]
    convert(sample / "ILSVRC2012_img_val.tar", tmp_path, "--shard-size", "10", *args)
    got, want = tree_bytes(tmp_path), tree_bytes(val_shards)
    manifests = [json.loads(t.pop("val.json")) for t in (got, want)]
    assert got == want
    # The manifests differ at most in how many images each ground truth lists (the devkit's
    # file is positional: it lists every image up to the last one it labels).
    listed = ("expected", "missing", "missing_first")
    for m in manifests:
        assert m["source"]["images"] == m["total_samples"]
        m["source"] = {k: v for k, v in m["source"].items() if k not in listed}
    assert manifests[0] == manifests[1]


def test_val_shards_labels_follow_ground_truth(val_shards: Path, sample: Path) -> None:
    expected = kaggle_labels(sample / "LOC_val_solution.csv")
    samples = list(wds.WebDataset([str(p) for p in shard_paths(val_shards, "val")],
                                  shardshuffle=False).decode("pil"))
    assert sorted(s["__key__"] for s in samples) == sorted(expected)
    for s in samples:
        assert s["cls"] == expected[s["__key__"]], s["__key__"]
        assert (s["jpg"].mode, s["jpg"].size) == ("RGB", (256, 256))
        assert s["json"]["wnid"] == CLASSES.wnids[s["cls"]]
    # The sample's ground truth uses several classes, so a wrong mapping cannot pass by luck.
    assert len(set(expected.values())) > 1


def test_shard_tar_headers_are_fixed(train_shards: Path, val_shards: Path) -> None:
    for p in shard_paths(train_shards) + shard_paths(val_shards, "val"):
        with tarfile.open(p) as tf:
            members = tf.getmembers()
        assert members, p
        for m in members:
            assert m.isreg(), m.name
            assert (m.mtime, m.uid, m.gid, m.mode) == (0, 0, 0, 0o644), m.name
            assert (m.uname, m.gname) == ("", ""), m.name
        # webdataset needs a sample's members next to each other, extensions in one order.
        keys = [m.name.partition(".")[0] for m in members]
        runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
        assert len(runs) == len(set(runs)), p
        assert [m.name.partition(".")[2] for m in members[:3]] == ["cls", "jpg", "json"]


@pytest.mark.parametrize(("option", "shards", "largest"), [
    (("--shards", "3"), 3, 16),
    (("--shard-size", "10"), 5, 10),
    (("--shard-size", "7"), 7, 7),
])
def test_shards_mix_classes_and_differ_by_at_most_one(
        sample: Path, tmp_path: Path, option: tuple[str, str], shards: int, largest: int) -> None:
    expected = nested_tar_labels(sample / "ILSVRC2012_img_train.tar")
    convert(sample / "ILSVRC2012_img_train.tar", tmp_path, *option, "--no-meta")
    paths = shard_paths(tmp_path)
    assert [p.name for p in paths] == [f"train-{i:06d}.tar" for i in range(shards)]
    sizes = []
    for p in paths:
        samples = read_shard(p)
        sizes.append(len(samples))
        classes = {expected[k] for k, _ in samples}
        # a seeded permutation over all classes, never one class per shard
        assert len(classes) >= 3, f"{p.name} holds classes {classes}"
        assert all(set(f) == {"jpg", "cls"} for _, f in samples)
    assert sum(sizes) == len(expected)
    assert max(sizes) - min(sizes) <= 1
    assert max(sizes) == largest


def test_seed_changes_assignment_not_content(sample: Path, train_shards: Path,
                                             tmp_path: Path) -> None:
    convert(sample / "ILSVRC2012_img_train.tar", tmp_path, "--shards", "3", "--seed", "7")
    a = {p.name: {k for k, _ in read_shard(p)} for p in shard_paths(train_shards)}
    b = {p.name: {k for k, _ in read_shard(p)} for p in shard_paths(tmp_path)}
    assert a != b
    assert read_shards(tmp_path) == read_shards(train_shards)


def test_manifest_describes_the_shards(train_shards: Path) -> None:
    m = json.loads((train_shards / "train.json").read_text("utf-8"))
    assert m["format_version"] == 1
    assert (m["split"], m["format"], m["errors"]) == ("train", "shards", 0)
    assert m["tool_version"] == imgprep.__version__
    assert m["classes"] == [[w, n] for w, n in zip(CLASSES.wnids, CLASSES.names, strict=True)]
    assert len(m["classes"]) == 1000
    files = shard_paths(train_shards)
    assert [s["name"] for s in m["shards"]] == [p.name for p in files]
    for s, p in zip(m["shards"], files, strict=True):
        data = p.read_bytes()
        assert s["bytes"] == len(data)
        assert s["sha256"] == hashlib.sha256(data).hexdigest()
        assert s["samples"] == len(read_shard(p))
    assert m["total_samples"] == sum(s["samples"] for s in m["shards"]) == 48
    opts = m["options"]
    assert (opts["num_shards"], opts["seed"], opts["meta"]) == (3, 0, True)
    assert opts["transform"]["size"] == 256 and opts["transform"]["resize"] == "center-crop"
    # mean/std: three floats in (0, 1) that match the stored pixels (JPEG moves them a little)
    # of every 4th image in key order, the sample the statistics are taken from
    found = read_shards(train_shards)
    sampled = sorted(found)[::4]
    assert m["stats_images"] == len(sampled) == 12
    pixels = np.concatenate([
        np.asarray(decode(found[k]["jpg"]), dtype=np.float64).reshape(-1, 3) / 255
        for k in sampled])
    for key, ref in (("mean", pixels.mean(axis=0)), ("std", pixels.std(axis=0))):
        assert len(m[key]) == 3 and all(isinstance(v, float) and 0 < v < 1 for v in m[key])
        np.testing.assert_allclose(m[key], ref, atol=0.01, err_msg=key)


def test_resize_short_side_keeps_aspect(sample: Path, tmp_path: Path) -> None:
    convert(sample / "ILSVRC2012_img_train.tar", tmp_path, "--resize", "short-side")
    found = read_shards(tmp_path)
    assert len(found) == 48
    shapes = set()
    for key, f in found.items():
        img = decode(f["jpg"])
        ow, oh = json.loads(f["json"])["original_size"]
        assert img.mode == "RGB" and min(img.size) == 256, key
        assert math.isclose(img.width / img.height, ow / oh, rel_tol=2 / 256), (key, img.size)
        shapes.add(img.size)
    assert len(shapes) > 1, "the sample has several aspect ratios"
    m = json.loads((tmp_path / "train.json").read_text("utf-8"))
    assert m["options"]["transform"]["resize"] == "short-side"


def test_size_128(sample: Path, train_shards: Path, tmp_path: Path) -> None:
    convert(sample / "ILSVRC2012_img_train.tar", tmp_path, "--size", "128", "--shards", "3")
    small, big = read_shards(tmp_path), read_shards(train_shards)
    assert set(small) == set(big)
    for key, f in small.items():
        assert decode(f["jpg"]).size == (128, 128), key
        assert f["cls"] == big[key]["cls"]
    m = json.loads((tmp_path / "train.json").read_text("utf-8"))
    assert m["options"]["transform"]["size"] == 128
    r = invoke("verify", tmp_path, "-q")
    assert r.exit_code == 0, r.output


# ---------------------------------------------------------------------------- label lists


def chainer_pairs(list_file: Path) -> Iterator[tuple[str, int]]:
    """Parse a label list exactly as chainer.datasets.LabeledImageDataset does."""
    with list_file.open() as f:
        for i, line in enumerate(f):
            pair = line.strip().split()
            assert len(pair) == 2, f"line {i + 1}: {line!r}"
            yield pair[0], int(pair[1])


def test_label_list_reads_like_chainer(train_list: Path, sample: Path) -> None:
    expected = nested_tar_labels(sample / "ILSVRC2012_img_train.tar")
    text = (train_list / "train.txt").read_text("utf-8")
    assert text.endswith("\n") and "\r" not in text
    lines = text.splitlines()
    assert lines == sorted(lines)
    pairs = list(chainer_pairs(train_list / "train.txt"))
    stems = [Path(rel).stem for rel, _ in pairs]
    assert len(stems) == len(set(stems)) and set(stems) == set(expected)
    for rel, label in pairs:
        assert not Path(rel).is_absolute() and ".." not in Path(rel).parts
        assert 0 <= label <= 999
        assert label == expected[Path(rel).stem], rel
        assert Path(rel).parent.name == CLASSES.wnids[label]
        img = decode((train_list / rel).read_bytes())
        assert (img.format, img.mode, img.size) == ("JPEG", "RGB", (256, 256)), rel
    images = {p.relative_to(train_list).as_posix() for p in (train_list / "train").rglob("*")
              if p.is_file()}
    assert images == {rel for rel, _ in pairs}


def test_label_list_class_table(train_list: Path) -> None:
    lines = (train_list / "classes.txt").read_text("utf-8").splitlines()
    assert len(lines) == 1000
    for i, line in enumerate(lines):
        wnid, _, name = line.partition(" ")
        assert (wnid, name) == (CLASSES.wnids[i], CLASSES.names[i])


def test_label_list_mean_npy(train_list: Path) -> None:
    mean = np.load(train_list / "mean.npy")
    assert (mean.dtype, mean.shape) == (np.float32, (3, 256, 256))
    acc = np.zeros((256, 256, 3), dtype=np.float64)
    pairs = list(chainer_pairs(train_list / "train.txt"))
    for rel, _ in pairs:
        acc += np.asarray(decode((train_list / rel).read_bytes()), dtype=np.float64)
    ref = (acc / len(pairs)).transpose(2, 0, 1)
    diff = np.abs(mean - ref)
    # mean.npy is taken before JPEG encoding: only a couple of grey levels of JPEG noise
    assert diff.mean() < 1.0 and diff.max() < 8.0, (diff.mean(), diff.max())
    m = json.loads((train_list / "train.json").read_text("utf-8"))
    assert m["format"] == "list" and m["total_samples"] == len(pairs) == 48
    assert m["list_sha256"] == hashlib.sha256((train_list / "train.txt").read_bytes()).hexdigest()
    # the manifest's per-channel mean comes from every 4th image in key order (the list order)
    sampled = np.stack([np.asarray(decode((train_list / rel).read_bytes()), dtype=np.float64)
                        for rel, _ in pairs[::4]])
    assert m["stats_images"] == 12
    np.testing.assert_allclose(m["mean"], sampled.mean(axis=(0, 1, 2)) / 255, atol=0.01)


def test_val_label_list(sample: Path, tmp_path: Path) -> None:
    convert(sample / "ILSVRC2012_img_val.tar", tmp_path, "--format", "list",
            "--labels", sample / "LOC_val_solution.csv")
    expected = kaggle_labels(sample / "LOC_val_solution.csv")
    pairs = list(chainer_pairs(tmp_path / "val.txt"))
    assert {Path(rel).stem: label for rel, label in pairs} == expected
    for rel, label in pairs:
        assert rel == f"val/{CLASSES.wnids[label]}/{Path(rel).stem}.jpg"
        assert decode((tmp_path / rel).read_bytes()).size == (256, 256)
    assert (tmp_path / "classes.txt").is_file()
    assert json.loads((tmp_path / "val.json").read_text("utf-8"))["split"] == "val"


# ---------------------------------------------------------------------------- other source forms

WNIDS = (CLASSES.wnids[0], CLASSES.wnids[333], CLASSES.wnids[666], CLASSES.wnids[999])
MODES = ("RGB", "L", "CMYK", "RGB", "RGB")


def _train_images() -> dict[str, list[tuple[str, bytes]]]:
    """4 classes x 5 small images (one grayscale, one CMYK, one PNG named .JPEG per class)."""
    out: dict[str, list[tuple[str, bytes]]] = {}
    for c, wnid in enumerate(WNIDS):
        rows = []
        for j, mode in enumerate(MODES):
            seed = 10 * c + j
            data = jpeg((170 + 10 * j, 120), seed, mode) if j != 4 \
                else encode(photo((150, 190), seed), "PNG")
            rows.append((f"{wnid}_{100 + j}", data))
        out[wnid] = rows
    return out


def _val_images() -> tuple[list[tuple[str, bytes]], dict[str, str]]:
    """The first 9 validation images, each with its published class."""
    images = [(f"ILSVRC2012_val_{i:08d}", jpeg((200, 150), 100 + i)) for i in range(1, 10)]
    published = imagenet_val_labels()
    truth = {key: CLASSES.wnids[published[i]] for i, (key, _) in enumerate(images)}
    return images, truth


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same images in every layout imgprep reads; 'val.txt' is their ground truth."""
    root = tmp_path_factory.mktemp("layouts")
    train = _train_images()
    paths: dict[str, Path] = {}
    paths["nested-tar"] = write_tar(root / "ILSVRC2012_img_train.tar", [
        (f"{w}.tar", tar_bytes([(f"{k}.JPEG", d) for k, d in rows])) for w, rows in train.items()])
    class_tars = root / "class-tars"
    class_tars.mkdir()
    for w, rows in train.items():
        write_tar(class_tars / f"{w}.tar", [(f"{k}.JPEG", d) for k, d in rows])
    paths["class-tars"] = class_tars
    tree = root / "extracted" / "train"
    for w, rows in train.items():
        (tree / w).mkdir(parents=True)
        for k, d in rows:
            (tree / w / f"{k}.JPEG").write_bytes(d)
    paths["tree"] = tree
    paths["tar-of-tree"] = write_tar(root / "tree.tar", [
        (f"train/{w}/{k}.JPEG", d) for w, rows in train.items() for k, d in rows])

    val, truth = _val_images()
    paths["val.txt"] = root / "val.txt"
    paths["val.txt"].write_text("".join(f"{k}.JPEG {label_of(truth[k])}\n" for k, _ in val))
    paths["val-tar"] = write_tar(root / "ILSVRC2012_img_val.tar",
                                 [(f"{k}.JPEG", d) for k, d in val])
    flat = root / "val-flat"
    flat.mkdir()
    for k, d in val:
        (flat / f"{k}.JPEG").write_bytes(d)
    paths["val-flat"] = flat
    val_tree = root / "val-tree"
    for k, d in val:
        (val_tree / truth[k]).mkdir(parents=True, exist_ok=True)
        (val_tree / truth[k] / f"{k}.JPEG").write_bytes(d)
    paths["val-tree"] = val_tree
    return paths


@pytest.mark.parametrize(("layout", "kind"), [
    ("nested-tar", "tar"), ("class-tars", "class-tars"), ("tree", "folder"),
    ("tar-of-tree", "tar"),
])
def test_train_layouts_give_identical_shards(layouts: dict[str, Path], tmp_path: Path,
                                             layout: str, kind: str) -> None:
    ref = tmp_path / "ref"
    convert(layouts["nested-tar"], ref, "--shards", "2", "--no-meta")
    out = tmp_path / "out"
    s = convert(layouts[layout], out, "--shards", "2", "--no-meta")
    assert (s["input_kind"], s["split"], s["samples"], s["errors"]) == (kind, "train", 20, 0)
    assert {p.name: p.read_bytes() for p in shard_paths(out)} == \
        {p.name: p.read_bytes() for p in shard_paths(ref)}
    expected = {k: label_of(w) for w, rows in _train_images().items() for k, _ in rows}
    got = {k: int(f["cls"]) for k, f in read_shards(out).items()}
    assert got == expected


@pytest.mark.parametrize(("layout", "with_truth"), [
    ("val-tar", True), ("val-flat", True), ("val-tree", False),
])
def test_val_layouts_give_identical_shards(layouts: dict[str, Path], tmp_path: Path,
                                           layout: str, with_truth: bool) -> None:
    ref = tmp_path / "ref"
    convert(layouts["val-tar"], ref, "--labels", layouts["val.txt"], "--no-meta")
    out = tmp_path / "out"
    extra: list[object] = ["--labels", layouts["val.txt"]] if with_truth else []
    s = convert(layouts[layout], out, "--no-meta", *extra)
    assert (s["split"], s["samples"]) == ("val", 9)
    assert [p.name for p in shard_paths(out, "val")] == ["val-000000.tar"]
    assert shard_paths(out, "val")[0].read_bytes() == shard_paths(ref, "val")[0].read_bytes()
    _, truth = _val_images()
    got = {k: int(f["cls"]) for k, f in read_shards(out, "val").items()}
    assert got == {k: label_of(w) for k, w in truth.items()}


def test_list_format_from_a_tree_matches_the_tar(layouts: dict[str, Path], tmp_path: Path) -> None:
    convert(layouts["nested-tar"], tmp_path / "a", "--format", "list")
    convert(layouts["tree"], tmp_path / "b", "--format", "list")
    a, b = tree_bytes(tmp_path / "a"), tree_bytes(tmp_path / "b")
    listed = {k for k in a if not k.startswith(".imgprep/")} - {"train.json"}
    assert {k: a[k] for k in listed} == {k: b[k] for k in listed}
    assert len([k for k in listed if k.endswith(".jpg")]) == 20


def test_awkward_file_names_become_safe_keys(tmp_path: Path) -> None:
    """Spaces and dots would break list lines and webdataset keys: renamed, never written raw."""
    wnid = WNIDS[1]
    names = {"with space.JPEG": "with_space", "two.dots.JPEG": "two_dots", "café.JPEG": "café",
             "low.jpg": "low", "p.png": "p"}
    src = tmp_path / "train"
    (src / wnid).mkdir(parents=True)
    for i, name in enumerate(names):
        (src / wnid / f"{wnid}_{name}").write_bytes(jpeg(seed=i))
    (src / wnid / "notes.txt").write_text("not an image\n")
    keys = {f"{wnid}_{k}" for k in names.values()}

    s = convert(src, tmp_path / "shards", "--shards", "2")
    assert (s["samples"], s["skipped_non_images"]) == (5, 1)
    samples = list(wds.WebDataset([str(p) for p in shard_paths(tmp_path / "shards")],
                                  shardshuffle=False).decode("pil"))
    assert {x["__key__"] for x in samples} == keys
    assert all(x["cls"] == label_of(wnid) and x["jpg"].size == (256, 256) for x in samples)
    for shard in shard_paths(tmp_path / "shards"):
        with tarfile.open(shard) as tf:  # non-ASCII names go through PAX headers: still fixed
            for m in tf:
                assert (m.mtime, m.uid, m.gid, m.mode, m.uname) == (0, 0, 0, 0o644, ""), m.name

    convert(src, tmp_path / "list", "--format", "list")
    pairs = list(chainer_pairs(tmp_path / "list" / "train.txt"))
    assert {Path(rel).stem for rel, _ in pairs} == keys
    assert all((tmp_path / "list" / rel).is_file() for rel, _ in pairs)


def test_custom_class_table(layouts: dict[str, Path], tmp_path: Path) -> None:
    table = tmp_path / "classes.txt"
    # file order is not label order: labels are positions in the sorted wnid list
    table.write_text("".join(f"{w} class {w}\n" for w in reversed(WNIDS)))
    convert(layouts["nested-tar"], tmp_path / "out", "--format", "list", "--classes", table)
    pairs = list(chainer_pairs(tmp_path / "out" / "train.txt"))
    assert len(pairs) == 20
    for rel, label in pairs:
        assert WNIDS[label] == Path(rel).parent.name
    assert (tmp_path / "out" / "classes.txt").read_text().splitlines() == [
        f"{w} class {w}" for w in WNIDS]
    m = json.loads((tmp_path / "out" / "train.json").read_text("utf-8"))
    assert [c[0] for c in m["classes"]] == list(WNIDS)


def _exif_oriented(tar_path: Path) -> dict[str, tuple[int, int]]:
    """{stem: (w, h)} of the images in a nested tar that carry EXIF orientation 6 or 8."""
    found: dict[str, tuple[int, int]] = {}
    for stem, data in nested_images(tar_path):
        with Image.open(io.BytesIO(data)) as img:
            if img.getexif().get(0x0112) in (6, 8):
                found[stem] = img.size
    return found


def test_exif_transpose_option(sample: Path, tmp_path: Path) -> None:
    src = sample / "ILSVRC2012_img_train.tar"
    rotated = _exif_oriented(src)
    assert rotated, "the sample has an EXIF-rotated image"
    for flag in ("--no-exif-transpose", "--exif-transpose"):
        out = tmp_path / flag
        convert(src, out, "--resize", "short-side", flag)
        found = read_shards(out)
        for key, (w, h) in rotated.items():
            if w == h:
                continue
            img = decode(found[key]["jpg"])
            wide = img.width > img.height
            # torchvision/timm/Chainer ignore EXIF: by default the stored pixels are not turned
            assert wide == ((w > h) if flag == "--no-exif-transpose" else (h > w)), (flag, key)


# ---------------------------------------------------------------------------- determinism


WORKER_ARGS = ("--shard-size", "5", "--max-errors", "5")


@pytest.fixture(scope="module")
def one_worker(bad_sample: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> tuple[dict[str, Any], Path]:
    """``bad_sample``'s train tar converted on one worker: its summary and folder."""
    out = tmp_path_factory.mktemp("one_worker")
    return convert(bad_sample / "ILSVRC2012_img_train.tar", out, *WORKER_ARGS, workers=1), out


@pytest.mark.parametrize("workers", [2, 3])
def test_shards_do_not_depend_on_worker_count(bad_sample: Path, one_worker: tuple[
        dict[str, Any], Path], tmp_path: Path, workers: int) -> None:
    src = bad_sample / "ILSVRC2012_img_train.tar"
    one, one_out = one_worker
    many = convert(src, tmp_path / "many", *WORKER_ARGS, workers=workers)
    assert one["tasks"] == many["tasks"] == 5
    assert one["errors"] == many["errors"] >= 1
    a, b = tree_bytes(one_out), tree_bytes(tmp_path / "many")
    assert {"train.json", "train-errors.jsonl", "train-000004.tar"} <= set(a)
    assert a == b


@pytest.mark.parametrize("fmt", ["shards", "list"])
def test_one_task_split_over_workers_gives_the_same_bytes(
        bad_sample: Path, tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fewer tasks than workers: the task is converted in parts and assembled in order."""
    src = bad_sample / "ILSVRC2012_img_train.tar"
    args = ("--format", fmt, "--max-errors", "5", "--size", "64")
    one = convert(src, tmp_path / "one", *args, workers=1)
    monkeypatch.setattr(execute, "PART_MIN", 1)  # many small parts, out of order
    many = convert(src, tmp_path / "many", *args, workers=3)
    assert one["tasks"] == many["tasks"] == 1
    assert one["errors"] == many["errors"] >= 1
    assert many["samples"] == one["samples"] > 0
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "many")


@pytest.mark.parametrize(("sizes", "workers"), [
    ([1000], 2), ([300, 5, 700], 4), ([0, 3], 2), ([17], 16), ([1250] * 3, 8)])
def test_part_cuts_cover_each_task_and_shrink_towards_the_end(sizes: list[int],
                                                              workers: int) -> None:
    cuts = part_cuts(sizes, workers, execute.PART_MIN)
    steps = []
    for n, c in zip(sizes, cuts, strict=True):
        assert c[0] == 0 and c[-1] == n and len(c) >= 2
        parts = [b - a for a, b in itertools.pairwise(c)]
        assert all(p >= execute.PART_MIN for p in parts[:-1])  # all but the remainder
        assert all(a >= b for a, b in itertools.pairwise(parts[:-1]))  # never growing
        steps += parts
    share = PART_SHARE * workers
    assert max(steps) <= max(execute.PART_MIN, math.ceil(sum(sizes) / share))
    if sum(sizes) >= 1000:  # the last parts are small, so the workers end together
        assert steps[-2] == execute.PART_MIN and steps[0] > 4 * execute.PART_MIN


def test_a_failed_part_leaves_no_partial_shard_and_a_rerun_matches(
        bad_sample: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from imgprep.convert.image import convert_image
    from imgprep.fsutil import TMP_PREFIX

    src = bad_sample / "ILSVRC2012_img_train.tar"
    args = ("--max-errors", "5", "--size", "64")
    one = convert(src, tmp_path / "one", *args, workers=1)
    calls = []

    def flaky(data: bytes, opts: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:  # in a worker, after a part or two went through
            raise RuntimeError("boom")
        return convert_image(data, opts, **kw)

    monkeypatch.setattr(execute, "PART_MIN", 1)
    monkeypatch.setattr(execute.image, "convert_image", flaky)
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", str(tmp_path / "many"), "-j", "3",
                                 "-q", "--json", *args])
    assert r.exit_code != 0 and "boom" in str(r.exception) + r.output
    assert not [p for p in (tmp_path / "many").rglob(f"{TMP_PREFIX}*")]
    monkeypatch.undo()
    monkeypatch.setattr(execute, "PART_MIN", 1)
    again = convert(src, tmp_path / "many", *args, workers=3)
    assert again["samples"] == one["samples"]
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "many")


@pytest.fixture(scope="module")
def two_chunk_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A nested train tar of 1100 small images: more than one label-list chunk (1000)."""
    root = tmp_path_factory.mktemp("two_chunks")
    pool = [jpeg((64 + 8 * i, 48 + 4 * i), seed=i) for i in range(11)]
    return write_tar(root / "ILSVRC2012_img_train.tar", [
        (f"{w}.tar", tar_bytes([(f"{w}_{j}.JPEG", pool[(c + j) % len(pool)])
                               for j in range(275)]))
        for c, w in enumerate(WNIDS)])


@pytest.mark.slow
def test_label_list_does_not_depend_on_worker_count(two_chunk_source: Path,
                                                    tmp_path: Path) -> None:
    one = convert(two_chunk_source, tmp_path / "one", "--format", "list", "--size", "64",
                  workers=1)
    two = convert(two_chunk_source, tmp_path / "two", "--format", "list", "--size", "64",
                  workers=2)
    assert one["tasks"] == two["tasks"] == 2
    a, b = tree_bytes(tmp_path / "one"), tree_bytes(tmp_path / "two")
    assert len([k for k in a if k.endswith(".jpg")]) == 1100
    assert {"train.txt", "mean.npy", "classes.txt", "train.json"} <= set(a)
    assert np.load(tmp_path / "one" / "mean.npy").shape == (3, 64, 64)
    assert a == b


# ---------------------------------------------------------------------------- real data


def _is_gray(path: Path) -> bool:
    with Image.open(path) as img:
        return img.mode == "L"


@pytest.mark.realdata
@pytest.mark.slow
def test_real_images_flat_tar(real_data: Path, tmp_path: Path) -> None:
    files = sorted((real_data / "images").glob("*.JPEG"))
    assert len(files) == 1000
    gray = [p for p in files if _is_gray(p)]
    assert len(gray) == 23
    # all 1000 (~3 s on 2 cores): ICC profiles, EXIF, 4:4:0 chroma, 68 px and 2400 px sides
    src = write_tar(tmp_path / "real.tar", [(f"images/{p.name}", p.read_bytes()) for p in files])
    s = convert(src, tmp_path / "out", "--shard-size", "50")
    assert (s["samples"], s["errors"], s["tasks"]) == (1000, 0, 20)
    r = invoke("verify", tmp_path / "out", "-q")
    assert r.exit_code == 0, r.output
    found = read_shards(tmp_path / "out")
    assert set(found) == {p.stem for p in files}
    labels = {key: int(f["cls"]) for key, f in found.items()}
    for key, label in labels.items():
        assert label == label_of(key.partition("_")[0]), key
    assert sorted(labels.values()) == list(range(1000))
    for p in gray:
        assert json.loads(found[p.stem]["json"])["original_mode"] == "L"
    assert "n03992509_potter's_wheel" in found


@pytest.mark.realdata
def test_real_originals_nested_tar(real_data: Path, tmp_path: Path) -> None:
    train = real_data / "originals" / "train"
    src = write_tar(tmp_path / "ILSVRC2012_img_train.tar", [
        (f"{d.name}.tar", tar_bytes([(p.name, p.read_bytes()) for p in sorted(d.iterdir())]))
        for d in sorted(train.iterdir())])
    s = convert(src, tmp_path / "out", "--shards", "2")
    assert (s["samples"], s["errors"]) == (13, 0)
    assert not (tmp_path / "out" / "train-errors.jsonl").exists()
    r = invoke("verify", tmp_path / "out", "-q")
    assert r.exit_code == 0, r.output
    found = read_shards(tmp_path / "out")
    assert set(found) == {p.stem for p in train.rglob("*.JPEG")}
    for key, f in found.items():
        assert int(f["cls"]) == label_of(key.partition("_")[0]), key
        assert decode(f["jpg"]).size == (256, 256)
    meta = {k: json.loads(f["json"]) for k, f in found.items()}
    assert meta["n02105855_2933"]["original_format"] == "PNG"
    assert meta["n02105855_2933"]["original_mode"] == "RGBA"
    # the grayscale originals (their README names n15075141_25601, but it is RGB) convert too
    gray = {p.stem for p in train.rglob("*.JPEG") if _is_gray(p)}
    assert gray == {"n15075141_13104", "n15075141_38508"}
    for k in gray:
        assert meta[k]["original_mode"] == "L"
        assert decode(found[k]["jpg"]).mode == "RGB"
    assert Counter(m["wnid"] for m in meta.values())["n02110063"] == 3


def test_labels_of_every_layout_match_the_per_image_rule(layouts: dict[str, Path]) -> None:
    """The columnar labelling (one lookup per distinct wnid) gives, image by image, the
    class its folder or tar names, else its name's wnid, else its published label."""
    from imgprep.inputs.labels import label_listing
    from imgprep.inputs.sources import list_source
    from imgprep.inputs.synsets import imagenet_val_labels, load_class_table, val_number

    classes = load_class_table(None)
    for name, path in layouts.items():
        if name.endswith(".txt"):
            continue
        listing = list_source(path)
        want = []
        for i in range(len(listing)):
            key, wnid = listing.key_str(i), listing.wnid_str(i) or listing.key_str(i)[:9]
            n = val_number(key)
            want.append(int(imagenet_val_labels()[n - 1]) if n else classes.index(wnid))
        assert label_listing(listing, classes).labels.tolist() == want, name


def test_sample_metadata_bytes_are_json_dumps_sorted(layouts: dict[str, Path]) -> None:
    """The directly formatted ``.json`` member is byte for byte json.dumps(sort_keys=True)."""
    from types import SimpleNamespace

    from imgprep.convert.options import ConvertOptions
    from imgprep.convert.samples import sample_meta
    from imgprep.convert.tasks import make_plan

    plan = make_plan(ConvertOptions(input=layouts["nested-tar"], out=layouts["nested-tar"].parent))
    for source in ("a/b.JPEG", 'q"uo\\te\u00e9\u2028\U0001f600.jpg'):
        lst = plan.listing
        member = np.array([source.encode("utf-8")] * len(lst))
        fake = SimpleNamespace(listing=SimpleNamespace(member_str=lambda i, m=member: bytes(
            m[i]).decode("utf-8")), labels=plan.labels, classes=plan.classes, labelled=True)
        conv = SimpleNamespace(original_size=(500, 375), original_mode="CMYK",
                               original_format="JPEG")
        label = int(plan.labels[0])
        want = json.dumps({"wnid": plan.classes.wnids[label], "label": label,
                           "source": source, "original_size": [500, 375],
                           "original_mode": "CMYK", "original_format": "JPEG"},
                          sort_keys=True).encode()
        assert sample_meta(fake, 0, conv) == want  # type: ignore[arg-type]
        fake.labelled = False  # an unlabelled split: no label, no wnid
        assert sample_meta(fake, 0, conv) == json.dumps(  # type: ignore[arg-type]
            {"source": source, "original_size": [500, 375], "original_mode": "CMYK",
             "original_format": "JPEG"}, sort_keys=True).encode()


@pytest.mark.parametrize("cores", [1, 8], ids=["reads-in-line", "reads-ahead"])
def test_reading_ahead_or_not_gives_the_same_bytes_and_errors(
        bad_sample: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int) -> None:
    """With cores to spare each worker reads ahead on a thread; the output, damaged
    images' error records included, is the same bytes as when it reads in line."""
    src = bad_sample / "ILSVRC2012_img_train.tar"
    args = ("--max-errors", "5", "--size", "64")
    want = convert(src, tmp_path / "ref", *args, workers=1)
    monkeypatch.setattr(imgprep.World, "cores_per_rank", lambda self: cores)
    monkeypatch.setattr(execute, "CHUNK", 3)  # chunks end inside the input, and on errors
    for workers in (1, 2):
        got = convert(src, tmp_path / f"w{workers}", *args, workers=workers)
        assert (got["samples"], got["errors"]) == (want["samples"], want["errors"])
        assert got["errors"] > 0
        assert tree_bytes(tmp_path / f"w{workers}") == tree_bytes(tmp_path / "ref")
