"""The Hugging Face copies (parquet, tar.gz) and webdataset shard sets convert as downloaded:
from the folder, ``data/`` or one file; with the published labels; to the same samples as
the image-net.org form; the same for any worker count or rank layout; resumable after a kill
while spooling."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from imgprep.convert.run import ConvertOptions, convert_splits
from imgprep.convert.summary import ConvertSummary
from imgprep.errors import ImgprepError, LabelError, SourceFormatError
from imgprep.inputs.fakes import FakeSummary, SampleSpec, make_fake
from imgprep.inputs.spool import SPOOL_DIR, is_finished
from imgprep.inputs.synsets import imagenet_classes
from imgprep.job.world import World
from imgprep.shards.manifest import read_manifest
from tests.support import REPO, one_line_error, published_label
from tests.support.cli import invoke
from tests.support.lfs import as_pointers
from tests.support.shards import tar_samples

SPEC = SampleSpec(classes=3, per_class=2, val=8, seed=5, test=1)  # val: every quirk
FORMS = ("hf-parquet", "hf-targz", "wds")
SPOOLED = ("hf-parquet", "hf-targz")
CLASSES = imagenet_classes()


def _needs(form: str) -> None:
    if form == "hf-parquet":
        pytest.importorskip("pyarrow")


def _convert(inp: Path, out: Path, **kw: Any) -> list[ConvertSummary]:
    summaries = convert_splits(ConvertOptions(input=inp, out=out, num_shards=2, **kw))
    assert all(s.complete and not s.errors for s in summaries), summaries
    return summaries


def _samples(out: Path, split: str) -> dict[str, dict[str, bytes]]:
    return {key: fields for _, key, fields in tar_samples(out, split)}


def _published(key: str) -> int:
    """The label every form must give ``key``: its class folder's, or the published one."""
    if key.startswith("ILSVRC2012_val_"):
        return published_label(int(key.rpartition("_")[2]))
    index = CLASSES.index(key.partition("_")[0])
    assert index is not None
    return index


class _Lazy(dict):  # type: ignore[type-arg]
    """A module's fakes or conversions, each made on first use."""

    def __init__(self, make: Any) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, form: str) -> Any:
        self[form] = self.make(form)
        return self[form]


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, FakeSummary]:
    root = tmp_path_factory.mktemp("forms")
    return _Lazy(lambda form: make_fake(form, root / form, SPEC))


@pytest.fixture(scope="module")
def reference(fakes: dict[str, FakeSummary],
              tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image-net.org form of the same fake set, converted."""
    src = Path(fakes["ilsvrc"].out)
    out = tmp_path_factory.mktemp("reference")
    _convert(src / "ILSVRC2012_img_train.tar", out)
    _convert(src / "ILSVRC2012_img_val.tar", out, labels=(src / "LOC_val_solution.csv",))
    return out


@pytest.fixture(scope="module")
def converted(fakes: dict[str, FakeSummary],
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each form converted once from the folder it was downloaded into, on 2 workers."""
    def make(form: str) -> Path:
        out = tmp_path_factory.mktemp(form)
        _convert(Path(fakes[form].inputs[0]), out, workers=2)
        return out

    return _Lazy(make)


@pytest.mark.parametrize("form", FORMS)
def test_the_download_folder_converts_train_and_val_with_the_published_labels(
        form: str, fakes: dict[str, FakeSummary], converted: dict[str, Path]) -> None:
    _needs(form)
    out = converted[form]
    train, val = _samples(out, "train"), _samples(out, "val")
    assert len(train) == SPEC.classes * SPEC.per_class and len(val) == SPEC.val
    for key, fields in {**train, **val}.items():
        assert int(fields["cls"]) == _published(key), key
    assert not (out / "test.json").exists()  # the test split is skipped by default
    assert not (out / ".imgprep" / "train" / SPOOL_DIR).exists()  # removed with the manifest
    source = read_manifest(out, "train").source
    assert source is not None and source.kind == form


@pytest.mark.parametrize("form", FORMS)
def test_one_key_gives_the_image_net_org_forms_jpg_and_cls(
        form: str, converted: dict[str, Path], reference: Path) -> None:
    _needs(form)
    for split in ("train", "val"):
        ours, theirs = _samples(converted[form], split), _samples(reference, split)
        assert ours.keys() == theirs.keys()
        for key in ours:
            assert ours[key]["jpg"] == theirs[key]["jpg"], key
            assert ours[key]["cls"] == theirs[key]["cls"], key


@pytest.mark.parametrize("form", FORMS)
def test_data_folder_and_single_files_convert_too(form: str, fakes: dict[str, FakeSummary],
                                                  tmp_path: Path) -> None:
    _needs(form)
    root = Path(fakes[form].inputs[0])
    inner = root / "data" if (root / "data").is_dir() else root
    _convert(inner, tmp_path / "data")
    assert len(_samples(tmp_path / "data", "train")) == SPEC.classes * SPEC.per_class
    assert len(_samples(tmp_path / "data", "val")) == SPEC.val
    one = sorted(p for p in inner.iterdir() if "val" in p.name)[0]
    (summary,) = _convert(one, tmp_path / "one")
    assert summary.split == "val" and summary.samples > 0
    for key, fields in _samples(tmp_path / "one", "val").items():
        assert int(fields["cls"]) == _published(key)


@pytest.mark.slow
@pytest.mark.parametrize("form", SPOOLED)
def test_one_or_two_workers_give_the_same_bytes(form: str, fakes: dict[str, FakeSummary],
                                                converted: dict[str, Path],
                                                tmp_path: Path) -> None:
    _needs(form)
    _convert(Path(fakes[form].inputs[0]), tmp_path, workers=1)
    for name in sorted(p.name for p in converted[form].glob("*")
                       if p.is_file() and p.name != "val-errors.jsonl"):
        assert (tmp_path / name).read_bytes() == (converted[form] / name).read_bytes(), name


@pytest.mark.slow
@pytest.mark.parametrize("form", SPOOLED)
def test_partition_ranks_share_the_spool_and_give_the_single_process_bytes(
        form: str, fakes: dict[str, FakeSummary], converted: dict[str, Path],
        tmp_path: Path) -> None:
    _needs(form)
    opts = ConvertOptions(input=Path(fakes[form].inputs[0]), out=tmp_path, num_shards=2,
                          mode="partition", split="train")
    for rank in (1, 0):
        world = World(rank=rank, world_size=2, local_rank=0, local_world_size=1, node_rank=rank,
                      num_nodes=2, launcher="test")
        (summary,) = convert_splits(replace(opts, out=tmp_path / f"node{rank}"), world)
        assert summary.complete
        folder = tmp_path / f"node{rank}"
        for shard in read_manifest(folder, "train").shards:
            assert (folder / shard.name).read_bytes() == \
                (converted[form] / shard.name).read_bytes()
        assert not (folder / ".imgprep" / "train" / SPOOL_DIR).exists()


_SLOW_SPOOL = """
import sys, time
from pathlib import Path
from imgprep.inputs import spool
from imgprep.convert.run import ConvertOptions, convert_splits
from imgprep.convert.summary import ConvertSummary
real, seen = spool.write_spool, []
def slow(path, items, stamp=b"", private=False):
    seen.append(path)
    if len(seen) == 2:
        def stalled():
            yield from items
            time.sleep(60)
        return real(path, stalled(), stamp, private)
    return real(path, items, stamp, private)
spool.write_spool = slow
convert_splits(ConvertOptions(input=Path(sys.argv[1]), out=Path(sys.argv[2]), num_shards=2,
                              workers=1, split="train"))
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("form", SPOOLED)
def test_a_kill_while_spooling_keeps_the_finished_spool_files(
        form: str, fakes: dict[str, FakeSummary], converted: dict[str, Path],
        tmp_path: Path) -> None:
    _needs(form)
    src, out = Path(fakes[form].inputs[0]), tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", _SLOW_SPOOL, str(src), str(out)], env=env)
    folder = out / ".imgprep" / "train" / SPOOL_DIR
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (list(folder.glob(".tmp-*"))
                                               and list(folder.glob("0*.spool"))):
        assert child.poll() is None, "the conversion ended before it was killed"
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    finished = [p for p in folder.glob("0*.spool") if is_finished(p)]
    assert len(finished) == 1 and list(folder.glob(".tmp-*"))
    seen: list[Path] = []
    from imgprep.inputs import spool

    real = spool.write_spool
    try:
        spool.write_spool = lambda path, items, stamp=b"", private=False: seen.append(path) or \
            real(path, items, stamp, private)  # type: ignore[assignment, func-returns-value]
        _convert(src, out, split="train")
    finally:
        spool.write_spool = real
    assert finished[0] not in seen  # kept: only the one cut short and the rest are spooled
    assert len(seen) == len(list(Path(src).rglob("train*"))) - 1
    for shard in read_manifest(out, "train").shards:
        assert (out / shard.name).read_bytes() == (converted[form] / shard.name).read_bytes()


def test_an_imagenette_parquet_is_refused_not_read_as_imagenet(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    from imgprep.inputs.fakes.parquet import write_split

    names = ["tench", "English springer", "cassette player", "chain saw", "church",
             "French horn", "garbage truck", "gas pump", "golf ball", "parachute"]
    rows = [(f"n01440764_{i}.JPEG", b"x", i % 10) for i in range(5)]
    write_split(tmp_path / "imagenette" / "data", "train", rows, names, files=1)
    with pytest.raises(LabelError, match="names 10 classes"):
        convert_splits(ConvertOptions(input=tmp_path / "imagenette", out=tmp_path / "out"))
    assert not (tmp_path / "out" / "train.json").exists()


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "convert"])
def test_a_parquet_clone_without_its_lfs_objects_is_refused_as_one(
        fakes: dict[str, FakeSummary], tmp_path: Path, dry: bool) -> None:
    """``git clone`` of ILSVRC/imagenet-1k without git-lfs: data/*.parquet are pointers. One
    line names them and ``git lfs pull``; not a damaged file to download again."""
    _needs("hf-parquet")
    clone = tmp_path / "imagenet-1k"
    shutil.copytree(Path(fakes["hf-parquet"].inputs[0]), clone)
    files = as_pointers(sorted((clone / "data").glob("*.parquet")))
    out = tmp_path / "out"
    said = one_line_error(invoke("convert", clone, "-o", out, *(["--dry-run"] if dry else [])),
                          3, f"{clone / 'data'}: all {len(files)} parquet files are Git LFS "
                          f"pointer files, not the data ({files[0]}: oid sha256:",
                          f"fetch them with `git lfs pull` in the clone (`git -C {clone} lfs "
                          "pull`)")
    assert "damaged" not in said and "download it again" not in said
    assert not out.exists()


def test_a_truncated_tar_gz_is_refused_naming_the_member(fakes: dict[str, FakeSummary],
                                                        tmp_path: Path) -> None:
    archive = Path(fakes["hf-targz"].out) / "data" / "val_images.tar.gz"
    cut = tmp_path / "val_images.tar.gz"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size * 2 // 3])
    with pytest.raises(SourceFormatError, match=r"val_images.tar.gz: .*(cut short|damaged).*"
                       r"member 'ILSVRC2012_val_\d{8}_n\d{8}.JPEG'.*re-download"):
        convert_splits(ConvertOptions(input=cut, out=tmp_path / "out"))
    assert not (tmp_path / "out" / "val.json").exists()


def test_a_wds_sample_whose_cls_and_json_disagree_is_refused(
        fakes: dict[str, FakeSummary], tmp_path: Path) -> None:
    from imgprep.inputs.fakes.wds import shard_bytes

    sample = ("n01440764_7", b"\xff\xd8x", 0, "n01440764_7.JPEG", "tench")
    bad = tmp_path / "in" / "imagenet1k-train-0000.tar"
    bad.parent.mkdir()
    bad.write_bytes(shard_bytes([sample]).replace(b'"label": 0', b'"label": 5'))
    with pytest.raises(ImgprepError, match=r"1 samples whose .cls and .json name other classes "
                       r"\(imagenet1k-train-0000.tar/n01440764_7: .cls 0, .json label 5"):
        convert_splits(ConvertOptions(input=tmp_path / "in", out=tmp_path / "out"))


@pytest.mark.parametrize("form", FORMS)
def test_a_dry_run_names_the_form_and_the_staging_copys_cost(
        form: str, fakes: dict[str, FakeSummary], tmp_path: Path) -> None:
    _needs(form)
    from imgprep.convert.dryrun import dry_run

    root = Path(fakes[form].inputs[0])
    report = dry_run(ConvertOptions(input=root, out=tmp_path / "out"))
    assert report.form == form and not (tmp_path / "out").exists()
    by_split = {s.split: s for s in report.splits}
    assert sorted(by_split) == ["train", "val"]
    files = {"train": "train*", "val": "val*"}
    for split, pattern in files.items():
        size = sum(p.stat().st_size for p in root.rglob(pattern) if p.is_file())
        assert by_split[split].spool_bytes == (size if form in SPOOLED else 0), split
    if form == "hf-parquet":  # the footers give the counts without reading a row
        assert by_split["train"].images == SPEC.classes * SPEC.per_class
    if form == "hf-targz":  # the gzip streams are read once, to their ends, and counted
        assert by_split["train"].images == SPEC.classes * SPEC.per_class


def test_overwrite_removes_a_staging_copy_left_by_a_killed_run(
        fakes: dict[str, FakeSummary], tmp_path: Path) -> None:
    src = Path(fakes["wds"].inputs[0])
    _convert(src, tmp_path, split="train")
    spool = tmp_path / ".imgprep" / "train" / SPOOL_DIR
    spool.mkdir()
    (spool / "00000-x.spool").write_bytes(b"left by a run killed while spooling")
    _convert(src, tmp_path, split="train", seed=1, overwrite=True)
    assert not spool.exists()
