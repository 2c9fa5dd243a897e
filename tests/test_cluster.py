"""scripts/bench_cluster.py, reduced: a file server and 2 nodes in network namespaces, a small
set served over sshfs through a throttled link. Needs root, FUSE and namespaces (CI has them);
skips with the script's one-line reason elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, photo

sys.path.insert(0, str(REPO / "scripts"))

import bench_cluster  # noqa: E402
from cluster.box import clean_leftovers  # noqa: E402
from cluster.measure import peer_rate  # noqa: E402
from cluster.netns import namespaces  # noqa: E402
from cluster.sshfs import mount_root, sshfs_mounts  # noqa: E402

PREFIX = "ipct-"  # not the benchmark's own prefix, so a run of it is never touched
WNIDS = ("n01440764", "n01443537", "n01484850")


def _default_route() -> str:
    if shutil.which("ip") is None:
        return ""
    return subprocess.run(["ip", "route", "show", "default"], capture_output=True, text=True,
                          timeout=10).stdout


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """240 synthetic photos named like ImageNet train files."""
    d = tmp_path_factory.mktemp("cluster-images")
    for i in range(240):
        photo((320, 240), seed=i).save(d / f"{WNIDS[i % 3]}_{i}.JPEG", quality=90)
    return d


def _bench(images: Path, out: Path) -> dict[str, Any]:
    """Run the reduced benchmark (bounded: SIGTERM at 150 s, which tears down; then kill)."""
    cmd = [sys.executable, str(REPO / "scripts" / "bench_cluster.py"), "--images", str(images),
           "--nodes", "2", "--mb", "10", "--server-mbit", "100", "--rounds", "2",
           "--train-steps", "8", "--prefix", PREFIX, "--timeout", "60", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        stdout, stderr = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
        pytest.fail(f"the reduced cluster run took over 150 s:\n{stdout[-2000:]}")
    assert proc.returncode == 0, stderr[-3000:]
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def test_peer_rate_falls_back_to_the_nodes_own_time_when_the_trace_missed_it() -> None:
    assert peer_rate(0, 0.0, {}) == 0.0
    assert peer_rate(10_000_000, 0.5, {"fanout_seconds": 9.0}) == pytest.approx(19.2)
    assert peer_rate(10_000_000, 0.0, {"fanout_seconds": 2.0}) == pytest.approx(5.0)
    assert peer_rate(10_000_000, 0.0, {"fanout_seconds": None}) == 0.0


def test_without_root_it_skips_with_one_line_and_a_json_reason(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench_cluster.os, "geteuid", lambda: 1000)
    assert bench_cluster.main(["--prefix", PREFIX]) == 0
    first, last = capsys.readouterr().out.strip().splitlines()
    assert first == "bench_cluster: skipped: needs root (network namespaces, FUSE mounts, tc)"
    assert json.loads(last) == {"benchmark": "cluster", "skipped": first.split(": ", 2)[2]}


@pytest.mark.slow
def test_two_node_cluster_stages_exact_bytes_and_leaves_nothing(images: Path,
                                                                tmp_path: Path) -> None:
    route = _default_route()
    try:
        res = _bench(images, tmp_path)
    finally:
        if os.geteuid() == 0 and shutil.which("ip"):
            left = clean_leftovers(PREFIX)  # only if the run itself failed to
            assert not left, f"the run left {left} behind"
    if "skipped" in res:
        pytest.skip(f"no cluster in a box here: {res['skipped']}")
    (row,) = res["rows"]
    set_bytes, index = res["set_bytes"], res["index_bytes"]  # shards; their sample index
    st = row["staging"]
    assert index > 0
    assert sum(st["partition"]["bytes_read"]) == set_bytes + 2 * index  # each node its index
    assert sum(st["replicate"]["bytes_read"]) == 2 * (set_bytes + index)
    assert st["partition"]["server_over_set"] == pytest.approx(1.0, abs=0.02)
    assert st["replicate"]["server_over_set"] == pytest.approx(2.0, abs=0.04)
    if res["fanout"]:
        assert sum(st["fanout"]["bytes_read"]) == set_bytes + index  # all of it once in all
        assert st["fanout"]["server_over_set"] == pytest.approx(1.0, abs=0.02)
        # each node got the other half; node 1 the index too, from node 0
        assert sum(st["fanout"]["bytes_received"]) == set_bytes + index
    assert all(s["identical"] for s in st.values()), st  # every shard's sha256 on every node
    assert row["direct_mean"] > 0 and row["staged_mean"] > 0
    assert row["staged_over_peer"] >= 0.5  # the floor ratio, loosely: no timing assertion
    assert res["train"] is not None and res["train"]["images_per_s"] > 0
    assert namespaces(PREFIX) == []
    assert sshfs_mounts(mount_root(PREFIX)) == []
    assert _default_route() == route
