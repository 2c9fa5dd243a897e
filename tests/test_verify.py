"""Parallel verify: the same report, line for line, whatever the worker count; a dead worker
is an error, never a silent pass."""

from __future__ import annotations

import json
import os
import shutil
import signal
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import imgprep.verify as verify_mod
from imgprep.convert import ConvertOptions, convert
from imgprep.index import Layout, index_folder, scan_layout, write_index
from imgprep.manifest import read_manifest, write_manifest
from imgprep.verify import VerifyError, verify
from imgprep.world import World
from imgprep.writers import ShardWriter
from loaders import LoaderError, ShardLoader
from tests.conftest import jpeg


@pytest.fixture(scope="module")
def converted(sample: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("verify")
    shards, lst = out / "shards", out / "list"
    convert(ConvertOptions(input=sample / "ILSVRC2012_img_train.tar", out=shards, num_shards=3,
                           workers=1))
    convert(ConvertOptions(input=sample / "ILSVRC2012_img_train.tar", out=lst, format="list",
                           workers=1))
    return {"shards": shards, "list": lst}


def _damaged_shards(src: Path, dst: Path) -> Path:
    """A copy whose first shard holds a bad label, an undecodable image and a repeated key,
    and whose manifest matches its bytes (so only the sample checks find the problems)."""
    shutil.copytree(src, dst)
    m = read_manifest(dst, "train")
    first = dst / m.shards[0].name
    with ShardWriter(first) as w:
        w.add("a", {"jpg": jpeg((256, 256), 1), "cls": b"2"})
        w.add("b", {"jpg": b"not a jpeg", "cls": b"1"})
        w.add("c", {"jpg": jpeg((256, 256), 2), "cls": b"999999"})
        w.add("a", {"jpg": jpeg((256, 256), 3), "cls": b"0"})
        w.add("d", {"cls": b"0"})
    d = json.loads((dst / "train.json").read_text())
    d["total_samples"] += 5 - d["shards"][0]["samples"]
    d["shards"][0].update(samples=5, bytes=w.bytes, sha256=w.sha256)
    (dst / "train.json").write_text(json.dumps(d))
    return dst


@pytest.mark.parametrize("fmt", ["shards", "list"])
def test_a_good_conversion_is_ok_with_any_worker_count(converted: dict[str, Path],
                                                       fmt: str) -> None:
    reports = [verify(converted[fmt], workers=w) for w in (1, 2, 3)]
    assert all(r.ok for r in reports), reports[0].problems
    assert len({(r.checked, r.samples) for r in reports}) == 1
    assert reports[0].samples == read_manifest(converted[fmt]).total_samples


def test_problems_are_reported_identically_in_order(converted: dict[str, Path],
                                                    tmp_path: Path) -> None:
    bad = _damaged_shards(converted["shards"], tmp_path / "bad")
    reports = [verify(bad, workers=w) for w in (1, 2, 4)]
    first = reports[0].problems
    assert any("label b'999999' outside" in p for p in first)
    assert any(":b.jpg does not decode" in p for p in first)
    assert any(":a: key appears in more than one place" in p for p in first)
    assert any(":d: has ['cls'], needs jpg and cls" in p for p in first)
    for r in reports[1:]:
        assert r.problems == first
        assert (r.checked, r.samples) == (reports[0].checked, reports[0].samples)


def test_one_shard_is_split_over_the_workers(converted: dict[str, Path],
                                             tmp_path: Path) -> None:
    bad = _damaged_shards(converted["shards"], tmp_path / "bad")
    m = read_manifest(bad, "train")
    one = verify_mod.verify_shards(bad, m, True, lambda n: None, workers=1)
    ticks: list[int] = []
    many = verify_mod.verify_shards(bad, m, True, ticks.append, workers=7)  # 7 > 3 shards
    assert many.problems == one.problems
    assert sum(ticks) == sum(s.samples for s in m.shards) - 1  # every sample ticked once


def test_corrupt_shard_file_is_reported_once(converted: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "flip"
    shutil.copytree(converted["shards"], bad)
    m = read_manifest(bad, "train")
    path = bad / m.shards[1].name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    for w in (1, 4):
        rep = verify(bad, workers=w)
        assert rep.problems == [f"{m.shards[1].name}: sha256 differs from the manifest "
                                "(corrupt copy)"]


def test_list_problems_are_the_same_in_order(converted: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "list"
    shutil.copytree(converted["list"], bad)
    lines = (bad / "train.txt").read_text().splitlines()
    (bad / lines[3].split()[0]).unlink()
    (bad / lines[7].split()[0]).write_bytes(b"junk")
    lines[10] = lines[10].split()[0] + " 5000"
    (bad / "train.txt").write_text("\n".join(lines) + "\n")
    reports = [verify(bad / "train.txt", workers=w) for w in (1, 3)]
    assert reports[0].problems == reports[1].problems
    assert [p.split(":")[1] for p in reports[0].problems] == ["4", "8", "11"]


_PARENT = os.getpid()
_REAL_CHECK = verify_mod._check_shard


def _dies_on_second_shard(job: verify_mod._ShardJob) -> verify_mod._ShardResult:
    if os.getpid() != _PARENT and job.entry.name.endswith("000001.tar"):
        os.kill(os.getpid(), signal.SIGKILL)
    return _REAL_CHECK(job)


def test_a_killed_worker_is_an_error(converted: dict[str, Path],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_mod, "_check_shard", _dies_on_second_shard)
    with pytest.raises(VerifyError, match="verify worker died"):
        verify(converted["shards"], workers=2)


def _with_index(folder: Path, shift: int) -> None:
    """Rewrite the sample index (and the manifest's entry for it) with every member of the
    first shard's second sample moved by ``shift`` bytes: an index the manifest vouches for
    that points the loaders at the wrong bytes."""
    m = read_manifest(folder, "train")
    layouts = [scan_layout(folder / s.name) for s in m.shards]
    first = layouts[0]
    offset = first.offset.copy()
    lo = int(first.counts[0])
    offset[lo:lo + int(first.counts[1])] += np.uint64(shift)
    layouts[0] = Layout(first.exts, first.counts, offset, first.size, first.ext)
    write_manifest(folder, replace(m, index=write_index(folder, "train", m.shards, layouts)))


def test_the_sample_index_is_checked_against_the_manifest_and_the_tars(
        converted: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "idx"
    shutil.copytree(converted["shards"], folder)
    m = read_manifest(folder, "train")
    _with_index(folder, 512)
    reports = [verify(folder, workers=w) for w in (1, 3)]
    assert reports[0].problems == reports[1].problems
    (problem,) = reports[0].problems
    assert problem.startswith(f"{m.shards[0].name}: sample 1: the sample index puts its .cls")
    assert f"imgprep index {folder}" in problem
    with pytest.raises(LoaderError, match=m.shards[0].name):  # what verify warns of
        next(iter(ShardLoader(folder, "train", World(), 4, workers=0, shuffle=False)))
    index_folder(folder)
    assert verify(folder, workers=2).ok

    (folder / m.index.name).unlink()  # type: ignore[union-attr]
    (problem,) = verify(folder, workers=2).problems
    assert "cannot read index" in problem and "imgprep index" in problem
    write_manifest(folder, replace(read_manifest(folder, "train"), index=None))
    (problem,) = verify(folder, workers=2).problems
    assert "lists no sample index" in problem and f"imgprep index {folder}" in problem


def test_an_index_with_fewer_samples_names_the_first_sample_it_lacks(tmp_path: Path) -> None:
    def lay(counts: list[int]) -> Layout:
        m = sum(counts)
        return Layout(("cls", "jpg"), np.asarray(counts, np.uint8), np.arange(m, dtype=np.uint64),
                      np.ones(m, np.uint32), np.zeros(m, np.uint8))

    why = verify_mod._layout_problem("s.tar", lay([2, 2, 2]), lay([2, 2]), tmp_path)
    assert why is not None and "gives 2 samples" in why and "into 3" in why
    assert "first difference at sample 2" in why
