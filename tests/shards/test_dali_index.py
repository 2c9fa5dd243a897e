"""DALI index files: every shard has one beside it (``<shard stem>.idx``), byte for byte what
DALI's own ``wds2idx`` writes; DALI's ``readers.webdataset`` reads a conversion through them
without scanning a tar; ``imgprep index --dali`` rebuilds them identically; verify names a
missing or wrong one with the fix; staged nodes hold those of their shards (replicate,
partition, fan-out), made on the node; the output-folder rules know their names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from imgprep.cli.commands import cli
from imgprep.convert.options import ConvertOptions
from imgprep.convert.run import convert
from imgprep.errors import ManifestError, ShardError
from imgprep.job.world import World
from imgprep.shards.dali import VERSION, encode_idx, idx_name, reader_paths
from imgprep.shards.folder import split_owns, unfinished_split
from imgprep.shards.layout import Layout, sample_keys, scan_layout
from imgprep.shards.manifest import read_manifest, write_manifest
from imgprep.shards.verify import verify
from imgprep.shards.writers import ShardWriter
from imgprep.stage.options import StageOptions
from imgprep.stage.run import stage_to_node
from tests.support import clean_env, convert_sample, fanout_nodes, is_launcher_var
from tests.support.shards import tar_samples

TIMEOUT = 120  # a fan-out run: two processes on two shared cores, each importing torch


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process staging detects a single process, whatever launched pytest."""
    for name in list(os.environ):
        if is_launcher_var(name):
            monkeypatch.delenv(name)


@pytest.fixture
def folder(converted: dict[str, Path], tmp_path: Path) -> Path:
    """A writable copy of the converted train split (3 shards, with their DALI indexes)."""
    return Path(shutil.copytree(converted["shards"], tmp_path / "out",
                                ignore=shutil.ignore_patterns(".imgprep")))


def idx_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.idx"))}


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


# ---------------------------------------------------------------------------- the format


def test_convert_writes_what_dali_wds2idx_writes(converted: dict[str, Path],
                                                 tmp_path: Path) -> None:
    wds2idx = pytest.importorskip("wds2idx", reason="DALI's wds2idx comes with nvidia-dali")
    folder = converted["shards"]
    m = read_manifest(folder, "train")
    assert m.index is not None and m.index.dali == VERSION == "v1.2"
    assert sorted(idx_files(folder)) == [idx_name(s.name) for s in m.shards]
    for s in m.shards:
        ref = tmp_path / idx_name(s.name)
        with wds2idx.IndexCreator(str(folder / s.name), str(ref), verbose=False) as ic:
            ic.create_index()
        assert (folder / idx_name(s.name)).read_bytes() == ref.read_bytes(), s.name
    first = (folder / idx_name(m.shards[0].name)).read_text().splitlines()
    assert first[0] == f"v1.2 {m.shards[0].samples}" and len(first) == m.shards[0].samples + 1


def test_an_idx_names_a_shard_up_to_its_first_dot() -> None:
    assert idx_name("train-000000.tar") == "train-000000.idx"
    assert idx_name("val-000123.tar") == "val-000123.idx"


def test_a_shard_without_samples_gets_an_index_of_none() -> None:
    empty = Layout(("cls",), np.zeros(0, np.uint8), np.zeros(0, np.uint64),
                   np.zeros(0, np.uint32), np.zeros(0, np.uint8), ())
    assert encode_idx(empty) == b"v1.2 0\n"
    with pytest.raises(ValueError, match="keys"):
        encode_idx(replace(empty, keys=None))


def test_keys_come_from_one_header_a_sample_also_for_long_and_non_ascii_names(
        tmp_path: Path) -> None:
    keys = ("k" * 150, "ключ_ü", "plain")
    path = tmp_path / "train-000000.tar"
    with ShardWriter(path) as w:
        for k in keys:
            w.add(k, {"cls": b"1", "jpg": bytes(700), "json": b"{}"})
    written, scanned = w.layout(), scan_layout(path)
    assert written.keys == scanned.keys == keys
    assert sample_keys(path, replace(scanned, keys=None)) == keys
    assert encode_idx(written) == encode_idx(scanned)
    assert encode_idx(written).decode().splitlines()[2].endswith(" ключ_ü.json")
    shifted = replace(scanned, offset=scanned.offset + np.uint64(512), keys=None)
    with pytest.raises(ShardError, match=str(path)):
        sample_keys(path, shifted)


# ---------------------------------------------------------------------------- DALI reads them


def dali_read(paths: list[str], index_paths: list[str] | None
              ) -> list[tuple[str, int, str, bytes, bytes]]:
    """Every sample of one epoch as DALI's readers.webdataset gives it on the CPU:
    (shard path, offset, member name, jpg bytes, cls bytes), in reading order."""
    from nvidia.dali import fn, pipeline_def

    batch = 16

    @pipeline_def(batch_size=batch, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe() -> tuple[Any, Any]:
        more = {} if index_paths is None else {"index_paths": index_paths}
        jpg, cls = fn.readers.webdataset(paths=paths, ext=["jpg", "cls"], name="reader", **more)
        return jpg, cls

    p = pipe()
    p.build()
    total = p.epoch_size("reader")
    got = []
    for _ in range(-(-total // batch)):
        jpgs, clss = p.run()
        for i in range(len(jpgs)):
            shard, offset, name = jpgs[i].source_info().rsplit(":", 2)
            got.append((shard, int(offset), name, np.asarray(jpgs[i]).tobytes(),
                        np.asarray(clss[i]).tobytes()))
    return got[:total]


def test_dali_reads_every_sample_through_the_idx_files_without_scanning_a_tar(
        converted: dict[str, Path], capfd: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("nvidia.dali", reason="nvidia-dali is the dali extra")
    folder = converted["shards"]
    paths, index_paths = reader_paths(folder, "train")
    assert index_paths == [str(folder / idx_name(Path(p).name)) for p in paths]
    capfd.readouterr()
    got = dali_read(paths, index_paths)
    out, err = capfd.readouterr()
    assert "Index file not provided" not in out + err
    want = tar_samples(folder)
    assert len(got) == len(want) == read_manifest(folder, "train").total_samples
    for (shard, _, name, jpg, cls), (want_shard, key, fields) in zip(got, want, strict=True):
        assert (Path(shard).name, name) == (want_shard, f"{key}.jpg")
        assert (jpg, cls) == (fields["jpg"], fields["cls"]), name
    dali_read(paths, None)  # the same reader without them warns: the capture would see it
    assert "Index file not provided" in "".join(capfd.readouterr())


# ---------------------------------------------------------------------------- index, verify


def test_index_dali_rebuilds_them_byte_identical(folder: Path) -> None:
    before, manifest = idx_files(folder), (folder / "train.json").read_bytes()
    m = read_manifest(folder, "train")
    assert m.index is not None
    for name in before:
        (folder / name).unlink()
    write_manifest(folder, replace(m, index=replace(m.index, dali=None)))  # an older conversion
    assert "dali" not in json.loads((folder / "train.json").read_text())["index"]
    assert verify(folder, decode=False).ok  # none named, none checked
    res = invoke("index", str(folder), "--dali")
    assert res.exit_code == 0, res.output
    assert "a DALI index (v1.2) beside each shard" in res.output
    assert idx_files(folder) == before
    assert (folder / "train.json").read_bytes() == manifest
    (folder / "train-000001.idx").unlink()
    assert invoke("index", str(folder), "-q").exit_code == 0  # the manifest names them
    assert idx_files(folder) == before


def _drop(p: Path) -> None:
    p.unlink()


def _move_a_member(p: Path) -> None:
    lines = p.read_text().splitlines(keepends=True)
    head, rest = lines[2].split(" ", 2)[:2], lines[2].split(" ", 2)[2]
    lines[2] = f"{head[0]} {int(head[1]) + 512} {rest}"
    p.write_text("".join(lines))


def _rename_a_sample(p: Path) -> None:
    p.write_text(p.read_text().replace("_", "-", 3))


def _another_shards(p: Path) -> None:
    p.write_bytes((p.parent / "train-000000.idx").read_bytes())


@pytest.mark.parametrize("damage", [_drop, _move_a_member, _rename_a_sample, _another_shards],
                         ids=["missing", "offset", "name", "other-shard"])
def test_verify_names_a_missing_or_wrong_idx_and_the_fix(folder: Path,
                                                        damage: Callable[[Path], None]) -> None:
    before = idx_files(folder)
    damage(folder / "train-000001.idx")
    rep = verify(folder, decode=False)
    assert len(rep.problems) == 1, rep.problems
    assert "train-000001.idx" in rep.problems[0]
    assert f"imgprep index {folder} --dali" in rep.problems[0]
    assert invoke("index", str(folder), "--dali", "-q").exit_code == 0
    assert idx_files(folder) == before
    assert verify(folder, decode=False).ok


# ---------------------------------------------------------------------------- the folder rules


def test_output_folder_rules_know_the_idx_files(tmp_path: Path) -> None:
    assert split_owns("train", "train-000000.idx")
    assert split_owns("train", "train-000000.idx", "shards")
    assert not split_owns("train", "train-000000.idx", "list")
    assert not split_owns("val", "train-000000.idx")
    (tmp_path / ".tmp-train-000003.idx").write_bytes(b"v1.2")  # a write a kill cut short
    u = unfinished_split(tmp_path, "train")
    assert u is not None and "1 temporary file" in u.seen
    assert unfinished_split(tmp_path, "val") is None


@pytest.mark.slow
def test_overwrite_with_fewer_shards_leaves_no_idx_of_a_shard_gone(sample: Path,
                                                                  tmp_path: Path) -> None:
    out = convert_sample(sample, tmp_path / "out", train_shards=3)
    assert sorted(idx_files(out)) == [f"train-00000{k}.idx" for k in range(3)]
    s = convert(ConvertOptions(input=sample / "ILSVRC2012_img_train.tar", out=out, num_shards=2,
                               workers=2, overwrite=True))
    assert s.complete
    assert sorted(idx_files(out)) == ["train-000000.idx", "train-000001.idx"]
    assert verify(out, decode=False).ok


# ---------------------------------------------------------------------------- staged nodes


@pytest.mark.parametrize(("mode", "nodes"), [("replicate", 1), ("replicate", 2),
                                             ("partition", 2)])
def test_staged_nodes_hold_the_idx_files_of_their_shards(converted: dict[str, Path],
                                                        tmp_path: Path, mode: str,
                                                        nodes: int) -> None:
    src = converted["shards"]
    for k in range(nodes):
        dst = tmp_path / f"node{k}"
        stage_to_node(StageOptions(src=src, dst=dst, mode=mode), World().with_nodes(nodes, k))
        m = read_manifest(dst, "train")
        assert m.index is not None and m.index.dali == VERSION
        names = [idx_name(s.name) for s in m.shards]
        assert sorted(idx_files(dst)) == sorted(names)
        assert all((dst / n).read_bytes() == (src / n).read_bytes() for n in names)
        assert verify(dst, decode=False).ok


def test_restaging_another_plan_keeps_only_the_idx_files_of_its_shards(
        converted: dict[str, Path], tmp_path: Path) -> None:
    src, dst = converted["shards"], tmp_path / "node"
    part = StageOptions(src=src, dst=dst, mode="partition")
    stage_to_node(part, World().with_nodes(2, 1))
    mine = sorted(idx_files(dst))
    assert 0 < len(mine) < 3
    stage_to_node(StageOptions(src=src, dst=dst), World())
    assert len(idx_files(dst)) == 3
    stage_to_node(part, World().with_nodes(2, 1))
    assert sorted(idx_files(dst)) == mine
    bare = Path(shutil.copytree(src, tmp_path / "bare", ignore=shutil.ignore_patterns(".imgprep")))
    m = read_manifest(bare, "train")
    assert m.index is not None
    write_manifest(bare, replace(m, index=replace(m.index, dali=None)))
    stage_to_node(StageOptions(src=bare, dst=dst), World())
    assert idx_files(dst) == {}  # a source without them: the node holds none either


@pytest.mark.slow
def test_fanout_nodes_make_the_idx_files_without_fetching_them(converted: dict[str, Path],
                                                              tmp_path: Path) -> None:
    src = Path(shutil.copytree(converted["shards"], tmp_path / "src",
                               ignore=shutil.ignore_patterns(".imgprep")))
    want = idx_files(src)
    for name in want:
        (src / name).unlink()  # the file server does not even hold them
    runs = fanout_nodes(src, tmp_path, 2, clean_env(TORCH_CPP_LOG_LEVEL="ERROR"), TIMEOUT)
    m = read_manifest(src, "train")
    assert m.index is not None
    moved = 0
    for k, s in enumerate(runs):
        moved += s["bytes_read"]
        assert s["bytes_read"] + s["bytes_received"] == m.total_bytes + m.index.bytes
        assert idx_files(tmp_path / f"n{k}") == want
        assert verify(tmp_path / f"n{k}", decode=False).ok
    assert moved == m.total_bytes + m.index.bytes  # the server read once, no .idx from it


def test_reader_paths_needs_the_dali_indexes(folder: Path) -> None:
    m = read_manifest(folder, "train")
    assert m.index is not None
    write_manifest(folder, replace(m, index=replace(m.index, dali=None)))
    with pytest.raises(ManifestError, match=re.escape(f"imgprep index {folder} --dali")):
        reader_paths(folder, "train")

