"""The cluster box (``python -m harness.cluster.bench``), reduced: a file server and 2 nodes
in network namespaces, a small set served over sshfs through a throttled link; and the same
box running a real Slurm job (``--slurm``: convert, stage with fan-out, train, then mpirun in
the allocation). Needs root, FUSE and namespaces (CI has them; ``make test`` installs the
Debian packages); skips with the script's one-line reason elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import bench as bench_cluster
from harness.cluster.box import clean_leftovers
from harness.cluster.measure import peer_rate
from harness.cluster.netns import namespaces
from harness.cluster.packages import missing
from harness.cluster.slurm import Layout, slurm_conf
from harness.cluster.slurmbench import job_env
from harness.cluster.sshfs import mount_root, sshfs_mounts
from tests.support import REPO, encode, photo

PREFIX = "ipct-"  # not the benchmark's own prefix, so a run of it is never touched

# The cluster runs check the machine's own /tmp, /dev/shm, namespaces and routes before and
# after, and take the box's lock: nothing else may run meanwhile.
pytestmark = pytest.mark.serial
WNIDS = ("n01440764", "n01443537", "n01484850")


def _default_route() -> str:
    if shutil.which("ip") is None:
        return ""
    return subprocess.run(["ip", "route", "show", "default"], capture_output=True, text=True,
                          timeout=10).stdout


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """240 synthetic photos named like ImageNet train files (24 distinct ones, each under 10
    names: what is staged and trained on is the bytes and the count, drawn once)."""
    d = tmp_path_factory.mktemp("cluster-images")
    drawn = [encode(photo((320, 240), seed=i), quality=90) for i in range(24)]
    for i in range(240):
        (d / f"{WNIDS[i % 3]}_{i}.JPEG").write_bytes(drawn[i % len(drawn)])
    return d


# Still a throttled server link (the nodes' are 1000 Mbit/s), fast enough that the served
# set's bytes do not set the run's length; 2 steps: the fewest the trainer's summary reads.
REDUCED = ["--server-mbit", "400", "--train-steps", "2", "--prefix", PREFIX, "--timeout", "60"]


def _bench(images: Path, out: Path, *options: str, limit: float = 150) -> dict[str, Any]:
    """Run the benchmark reduced (bounded: SIGTERM at ``limit`` s, which tears down; then
    kill)."""
    cmd = [sys.executable, "-m", "harness.cluster.bench", "--images", str(images),
           "--nodes", "2", *REDUCED, "--out", str(out), *options]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO)
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
        pytest.fail(f"the reduced cluster run took over {limit:.0f} s:\n{stdout[-2000:]}"
                    f"\n{stderr[-2000:]}")
    assert proc.returncode == 0, stderr[-3000:]
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def _ours() -> list[str]:
    """Processes whose command line names this test's prefix (its daemons, hosts, mounts)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if f"{PREFIX}cluster-" in cmd and int(d.name) != os.getpid():
                found.append(f"{d.name}: {cmd[:120]}")
    return found


def _in_tmp(patterns: tuple[str, ...] = ("ompi.node", "prte.node", "spmix_appdir")) -> set[str]:
    """What MPI and Slurm's PMIx would leave in the machine's /tmp if a task used it."""
    tmp = Path(tempfile.gettempdir())
    return {p.name for p in tmp.iterdir() if p.name.startswith(patterns)}


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
            res = _bench(images, tmp_path, "--mb", "10", "--rounds", "1", limit=240)
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
    s3 = res["stage_s3"]["2"]  # from the S3 store behind the same link (tx bytes: + headers)
    assert s3["replicate"]["nodes_identical"] and s3["nodes_identical"]
    assert sum(s3["replicate"]["bytes_read"]) == 2 * (set_bytes + index)
    assert 2.0 <= s3["replicate"]["store_bytes_over_set"] <= 2.1
    if res["fanout"]:
        assert s3["mode"] == "fanout" and sum(s3["fanout"]["bytes_read"]) == set_bytes + index
        assert 1.0 <= s3["store_bytes_over_set"] <= 1.05
    assert row["direct_mean"] > 0 and row["staged_mean"] > 0
    assert row["staged_over_peer"] >= 0.5  # the floor ratio, loosely: no timing assertion
    assert res["train"] is not None and res["train"]["images_per_s"] > 0
    assert namespaces(PREFIX) == []
    assert sshfs_mounts(mount_root(PREFIX)) == []
    assert _default_route() == route


def test_slurm_conf_keeps_every_file_in_the_run_and_names_every_node(tmp_path: Path) -> None:
    lay = Layout(tmp_path / "slurm")
    conf = slurm_conf(lay, "127.100.0.1", [("node0", "127.100.0.10"), ("node1", "127.100.0.11")])
    settings = dict(line.split("=", 1) for line in conf.splitlines() if "=" in line)
    assert settings["AuthInfo"] == f"socket={lay.socket}"
    assert settings["ProctrackType"] == "proctrack/linuxproc"
    assert settings["TaskPlugin"] == "task/none"
    assert settings["SlurmdSpoolDir"].endswith("/%n") and settings["SlurmdPidFile"].endswith(
        "%n.pid")
    assert settings["ReturnToService"] == "2" and settings["MpiDefault"] == "none"
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile",
                "SlurmctldLogFile", "SlurmdLogFile", "TmpFS", "TaskProlog"):
        assert settings[key].startswith(str(lay.root)), key  # never /var, /run or /etc
    nodes = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert nodes == [
        "NodeName=node0 NodeAddr=127.100.0.10 NodeHostname=node0 CPUs=2 State=UNKNOWN",
        "NodeName=node1 NodeAddr=127.100.0.11 NodeHostname=node1 CPUs=2 State=UNKNOWN"]


def test_the_job_gets_no_launcher_variables_from_the_harness(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLURM_JOB_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                 "MASTER_ADDR", "RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.setenv(name, "7")
    env = job_env({"SHARED": "/s"})
    assert not [k for k in env if k.startswith(("SLURM_", "PMIX_", "TORCHELASTIC_"))
                or k in ("MASTER_ADDR", "RANK", "OMPI_COMM_WORLD_RANK")]
    assert env["SHARED"] == "/s" and env["OMPI_MCA_btl_tcp_if_include"] == "eth0"
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)


def test_slurm_run_skips_with_one_line_naming_what_is_missing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench_cluster.os, "geteuid", lambda: 1000)
    assert bench_cluster.main(["--slurm", "--prefix", PREFIX]) == 0
    first, last = capsys.readouterr().out.strip().splitlines()
    assert first.startswith("bench_cluster: skipped: needs root")
    assert json.loads(last)["benchmark"] == "cluster-slurm"


@pytest.mark.slow
def test_a_slurm_job_converts_stages_and_trains_across_two_nodes_and_leaves_nothing(
        images: Path, tmp_path: Path) -> None:
    route, tmp_before = _default_route(), _in_tmp()
    host = (socket.gethostname(), Path("/etc/hosts").read_text(), sorted(os.listdir("/dev/shm")))
    try:
        res = _bench(images, tmp_path, "--slurm", "--shards", "4", "--mpirun-steps", "2",
                     limit=240)
    finally:
        if os.geteuid() == 0 and shutil.which("ip"):
            left = clean_leftovers(PREFIX)  # only if the run itself failed to
            assert not left, f"the run left {left} behind"
    if "skipped" in res:
        pytest.skip(f"no Slurm in a box here: {res['skipped']}")
    sl, st, s = res["slurm"], res["stage"], res["set"]
    assert sl["state"] == "COMPLETED" and sl["nodes"] == ["node0", "node1"]
    assert res["convert"]["world_size"] == 4  # srun's 4 tasks, from SLURM_*
    assert s["images"] == 240 and s["shards"] == 4
    assert st["copiers"] == 2  # one per node; the other task of each node waited
    assert sum(st["bytes_read"]) == s["bytes"] + s["index_bytes"]  # the set once in all
    assert sum(st["bytes_received"]) == s["bytes"] + s["index_bytes"]  # the rest from peers
    # the server's own count: that, plus each task's few reads of the manifest
    extra = st["server_bytes"] - s["bytes"] - s["index_bytes"]
    assert 0 <= extra <= 4 * 4 * s["manifest_bytes"] + 64 * 1024, st
    assert st["nodes_identical"]  # every shard's sha256 on every node
    assert res["train"]["steps"] == 2 and res["train"]["images_per_s"] > 0
    assert res["mpirun"] is not None and res["mpirun"]["state"] == "COMPLETED"
    assert namespaces(PREFIX) == [] and _ours() == []
    assert _in_tmp() == tmp_before  # every node's temporary files stayed in the run
    # names, /etc/hosts and /dev/shm were the hosts' own, in their namespaces
    assert (socket.gethostname(), Path("/etc/hosts").read_text(),
            sorted(os.listdir("/dev/shm"))) == host
    assert _default_route() == route


def test_missing_packages_are_named_by_package() -> None:
    assert missing({"/nonexistent/prog-xyz": "pkg-a", "sh": "pkg-b"}) == ["pkg-a"]
