"""Rank-aware convert: every rank converts its share; the result equals a single-process run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from imgprep.convert.options import ConvertOptions
from imgprep.convert.records import assigned_tasks
from imgprep.convert.run import convert
from imgprep.convert.tasks import make_plan
from imgprep.errors import WaitTimeout
from imgprep.job.assign import node_shards
from imgprep.job.world import World
from imgprep.shards.manifest import read_manifest
from imgprep.shards.verify import verify
from tests.support import mpirun_cmd

SHARDS = 7


def _files(folder: Path) -> dict[str, bytes]:
    """Every output file except the resume state, by name."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and ".imgprep" not in p.parts}


@pytest.fixture(scope="module")
def opts(bad_sample: Path, tmp_path_factory: pytest.TempPathFactory) -> ConvertOptions:
    return ConvertOptions(input=bad_sample / "ILSVRC2012_img_train.tar",
                          out=tmp_path_factory.mktemp("single"), num_shards=SHARDS,
                          max_errors=2, workers=1)


@pytest.fixture(scope="module")
def single(opts: ConvertOptions) -> dict[str, bytes]:
    summary = convert(opts)
    assert summary.complete and summary.errors == 2
    return _files(opts.out)


def _worlds(nodes: int, per_node: int) -> list[World]:
    size = nodes * per_node
    return [World(rank=r, world_size=size, local_rank=r % per_node, local_world_size=per_node,
                  node_rank=r // per_node, num_nodes=nodes, launcher="test")
            for r in range(size)]


@pytest.mark.parametrize(("nodes", "per_node"), [(1, 3), (2, 2), (3, 1)])
def test_shared_mode_equals_single_process(opts: ConvertOptions, single: dict[str, bytes],
                                           tmp_path: Path, nodes: int, per_node: int) -> None:
    o = replace(opts, out=tmp_path)
    worlds = _worlds(nodes, per_node)
    summaries = [convert(o, w) for w in reversed(worlds)]  # rank 0 last: the others are done
    by_rank = {s.rank: s for s in summaries}
    assert [by_rank[r].role for r in range(len(worlds))] == ["finaliser"] + ["part"] * (
        len(worlds) - 1)
    assert sum(s.tasks_mine for s in summaries) == SHARDS
    assert all(s.manifest is None for s in summaries if s.role == "part")
    assert _files(tmp_path) == single


def test_shares_are_disjoint_complete_and_balanced(opts: ConvertOptions) -> None:
    plan = make_plan(opts)
    worlds = _worlds(2, 2)
    shares = [assigned_tasks(plan, w).mine for w in worlds]
    names = [t.name for share in shares for t in share]
    assert sorted(names) == sorted(t.name for t in plan.tasks)
    loads = [sum(len(t.items) for t in share) for share in shares]
    assert max(loads) - min(loads) <= max(len(t.items) for t in plan.tasks)


def test_partition_writes_each_nodes_shards_only(opts: ConvertOptions, single: dict[str, bytes],
                                                 tmp_path: Path) -> None:
    worlds = _worlds(2, 2)
    plan = make_plan(opts)
    expected = node_shards([len(t.items) for t in plan.tasks], 2, "partition", opts.seed)
    for w in sorted(worlds, key=lambda w: -w.local_rank):  # leaders last on each node
        convert(replace(opts, out=tmp_path / f"node{w.node_rank}", mode="partition"), w)
    seen: set[str] = set()
    for node in (0, 1):
        folder = tmp_path / f"node{node}"
        m = read_manifest(folder, "train")
        names = [s.name for s in m.shards]
        assert names == [plan.tasks[i].name for i in expected[node]]
        assert m.node is not None and (m.node.node_rank, m.node.num_nodes) == (node, 2)
        assert m.node.mode == "partition" and m.node.shards == SHARDS
        assert m.total_samples == sum(s.samples for s in m.shards)
        for name in names:  # same bytes as the single-process shard
            assert (folder / name).read_bytes() == single[name]
        assert sorted(p.name for p in folder.glob("train-*.tar")) == names
        assert not seen & set(names)
        seen |= set(names)
        assert verify(folder, "train").ok
    assert seen == {n for n in single if n.endswith(".tar")}


def test_rank0_times_out_when_a_rank_never_comes(opts: ConvertOptions, tmp_path: Path) -> None:
    o = replace(opts, out=tmp_path, wait_timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout) as e:
        convert(o, World(rank=0, world_size=2, local_rank=0, local_world_size=2, node_rank=0,
                         num_nodes=1, launcher="test"))
    assert time.monotonic() - t0 < 20
    assert "rank 0" in str(e.value) and "train-0000" in str(e.value) and "rerun" in str(e.value)
    assert not (tmp_path / "train.json").exists()


def test_partition_refuses_label_lists(opts: ConvertOptions, tmp_path: Path) -> None:
    from imgprep.errors import OutputError

    with pytest.raises(OutputError, match="--format shards"):
        convert(replace(opts, out=tmp_path, format="list", mode="partition"), _worlds(2, 1)[0])


def _cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "imgprep", "convert", *args],
                            env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_torchrun_style_processes_equal_single_process(opts: ConvertOptions,
                                                       single: dict[str, bytes],
                                                       tmp_path: Path) -> None:
    args = [str(opts.input), "-o", str(tmp_path), "--shards", str(SHARDS), "--max-errors", "2",
            "-j", "1", "--json", "-q"]
    procs = [_cli(args, {"RANK": str(r), "WORLD_SIZE": "4", "LOCAL_RANK": str(r % 2),
                         "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": str(r // 2)})
             for r in range(4)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [e for _, e in outs]
    summaries = [json.loads(o) for o, _ in outs]
    assert sorted(s["role"] for s in summaries) == ["finaliser", "part", "part", "part"]
    assert _files(tmp_path) == single


@pytest.mark.slow
def test_mpirun_np4_equals_single_process(opts: ConvertOptions, single: dict[str, bytes],
                                          tmp_path: Path) -> None:
    cmd = [*mpirun_cmd(4), sys.executable, "-m",
           "imgprep", "convert", str(opts.input), "-o", str(tmp_path), "--shards", str(SHARDS),
           "--max-errors", "2", "-j", "1", "--json", "-q"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summaries = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(s["rank"] for s in summaries) == [0, 1, 2, 3]
    assert {s["world_size"] for s in summaries} == {4}
    assert _files(tmp_path) == single


@pytest.mark.slow
def test_plain_loop_over_simulated_nodes_partition(opts: ConvertOptions, single: dict[str, bytes],
                                                   tmp_path: Path) -> None:
    """No launcher: a for loop with --num-nodes/--node-rank, '{node}' in --out."""
    for node in (0, 1):
        p = _cli([str(opts.input), "-o", str(tmp_path / "n{node}"), "--mode", "partition",
                  "--num-nodes", "2", "--node-rank", str(node), "--shards", str(SHARDS),
                  "--max-errors", "2", "-j", "1", "-q"], {})
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    union: dict[str, bytes] = {}
    for node in (0, 1):
        union.update({n: b for n, b in _files(tmp_path / f"n{node}").items() if n.endswith(".tar")})
    assert union == {n: b for n, b in single.items() if n.endswith(".tar")}
