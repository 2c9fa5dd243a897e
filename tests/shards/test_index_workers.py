"""``imgprep index --workers N``: the shards' tar headers read by N processes, the sample
index, every DALI index and the manifests byte-identical to the one-process run for any N;
a damaged shard named, as in one process; --workers checked by the command line."""

from __future__ import annotations

import ctypes
import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from imgprep.errors import ShardError
from imgprep.shards.indexing import in_shard_order, index_folder, plan_index, run_index
from imgprep.shards.manifest import ShardEntry, read_manifest, write_manifest
from tests.support.cli import invoke, ok
from tests.support.shards import UNEQUAL_SIZES, write_split


def image(i: int) -> bytes:
    """Stand-in image bytes of varied length (indexing never decodes them)."""
    return bytes([i % 251]) * (1 + i * 97 % 1500)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Two splits of unequal shards (an empty one among val's), their indexes dropped: an
    older conversion."""
    out = tmp_path / "set"
    out.mkdir()
    write_split(out, "train", UNEQUAL_SIZES, image)
    write_split(out, "val", (4, 0, 6), image)
    for split in ("train", "val"):
        m = read_manifest(out, split)
        write_manifest(out, replace(m, index=None))
        (out / f"{split}-index.bin").unlink()
    return out


def written(folder: Path) -> dict[str, bytes]:
    """What indexing writes: sample indexes, DALI indexes, manifests."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.suffix in (".bin", ".idx", ".json")}


def test_every_worker_count_writes_the_same_bytes(folder: Path) -> None:
    runs = {}
    for workers in (1, 2, 3):
        for p in folder.glob("*.idx"):
            p.unlink()
        counted: list[int] = []
        summary = run_index(plan_index(folder), dali=True, workers=workers,
                            tick=counted.append)
        assert summary.workers == workers
        assert [s.split for s in summary.splits] == ["train", "val"]
        assert sum(counted) == sum(UNEQUAL_SIZES) + 10
        runs[workers] = written(folder)
    assert len([n for n in runs[1] if n.endswith(".idx")]) == len(UNEQUAL_SIZES) + 3
    assert runs[2] == runs[1] and runs[3] == runs[1]


def test_the_sample_index_alone_is_the_same_for_any_worker_count(folder: Path) -> None:
    index_folder(folder, "train", workers=1)
    one = written(folder)
    (folder / "train-index.bin").unlink()
    index_folder(folder, "train", workers=3)
    assert written(folder) == one and not list(folder.glob("*.idx"))


def test_a_truncated_shard_is_named_with_two_workers(folder: Path) -> None:
    """The first damaged shard in manifest order is the one named, whichever worker fails
    first; nothing but DALI indexes is written."""
    before = written(folder)
    for name, keep in (("train-000002.tar", 5000), ("train-000005.tar", 3000)):
        path = folder / name
        os.truncate(path, keep)
    r = invoke("index", folder, "--split", "train", "--workers", "2", "--quiet")
    assert r.exit_code == 3, r.output
    assert "train-000002.tar" in r.stderr and "train-000005.tar" not in r.stderr
    assert "verify or restage it" in r.stderr
    assert written(folder) == before
    with pytest.raises(ShardError, match="train-000002.tar.*verify or restage it"):
        index_folder(folder, "train", workers=1)


def test_the_command_reports_its_worker_count(folder: Path) -> None:
    out = ok(invoke("index", folder, "--json", "-j", "2"))
    assert out["workers"] == 2
    assert [s["split"] for s in out["splits"]] == ["train", "val"]
    default = ok(invoke("index", folder, "--json", "--quiet"))
    assert default["workers"] >= 1


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_workers_must_be_a_positive_count(folder: Path, value: str) -> None:
    r = invoke("index", folder, "--workers", value)
    assert r.exit_code == 2
    assert "--workers" in r.stderr
    assert not (folder / "train-index.bin").exists()


def worker_state(shard: ShardEntry) -> tuple[str, int, int, bool]:
    """In a pool worker: the shard, this process, its parent-death signal, whether it
    ignores Ctrl-C."""
    sig = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
    return shard.name, os.getpid(), sig.value, signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_the_workers_die_with_the_command_and_leave_ctrl_c_to_it() -> None:
    shards = [ShardEntry(f"train-{k:06d}.tar", k, 0, "") for k in range(6)]
    ticks: list[int] = []
    got = list(in_shard_order(worker_state, shards, 2, ticks.append))
    assert [g[0] for g in got] == [s.name for s in shards] and ticks == list(range(6))
    assert os.getpid() not in {g[1] for g in got}
    assert {(g[2], g[3]) for g in got} == {(signal.SIGKILL, True)}
