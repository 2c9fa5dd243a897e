"""``stage-to-node --mode replicate --fanout``: every node ends with every shard, the file server
is read once in all, a dead, failing or stuck node stops the others with its name, a corrupt
copy on a sending node is caught by the receivers, and a rerun moves only what some node lacks.

Nodes are real processes on this machine, one copier each, meeting on 127.0.0.1 at a free port
(``--num-nodes/--node-rank --rendezvous``, or torchrun's variables); every wait has a timeout.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from imgprep.job.assign import node_shards
from imgprep.job.rendezvous import Rendezvous, RendezvousError, copier_rendezvous
from imgprep.job.world import World
from imgprep.shards.manifest import read_manifest
from imgprep.shards.verify import verify
from imgprep.stage.peers import HEARTBEAT
from imgprep.stage.pool import StallClock
from imgprep.stage.schedule import chunks, plan_transfers, walk
from tests.support import REPO, clean_env, feed_pipe, free_port, mpirun_cmd, outcomes
from tests.support.cli import invoke

TIMEOUT = 120  # for a whole run of 4 processes on 2 shared cores (each imports torch)
NODES = 3  # a chain forwards (sender, a middle node, the last): all a larger ring does
Fanned = tuple[Path, list[dict[str, Any]]]  # the nodes' parent folder, their summaries


def env(**extra: object) -> dict[str, str]:
    """A launcher-free environment; torch's C++ log quiet, as the command sets it."""
    return clean_env(TORCH_CPP_LOG_LEVEL="ERROR", **extra)


def shard_names(src: Path) -> dict[str, str]:
    """Every shard's (and the index's) name and sha256, from the manifests."""
    out = {}
    for split in ("train", "val"):
        m = read_manifest(src, split)
        out.update({s.name: s.sha256 for s in m.shards})
        if m.index is not None:
            out[m.index.name] = m.index.sha256
    return out


def set_bytes(src: Path) -> int:
    return sum(read_manifest(src, split).total_bytes for split in ("train", "val"))


def index_bytes(src: Path) -> int:
    """The splits' sample indexes: read from the file server once in all, by node 0."""
    return sum(m.index.bytes for split in ("train", "val")
               if (m := read_manifest(src, split)).index is not None)


def digests(dst: Path) -> dict[str, str]:
    """sha256 of every shard and index under its final name in ``dst`` (not temporary ones:
    a failed run may leave those; the rerun sweeps them)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(dst.iterdir())
            if p.is_file() and p.suffix in (".tar", ".bin") and not p.name.startswith(".")}


def assert_complete(src: Path, dst: Path) -> None:
    """``dst`` holds every shard byte-identical to the source, and verifies."""
    assert digests(dst) == shard_names(src)
    for split in ("train", "val"):
        assert read_manifest(dst, split).index == read_manifest(src, split).index
    rep = verify(dst, decode=False)
    assert rep.ok, rep.problems


def assert_nothing_bad(src: Path, dst: Path) -> None:
    """Whatever ``dst`` holds under a final name is right."""
    want = shard_names(src)
    for name, digest in digests(dst).items():
        assert want[name] == digest, name


def owned(src: Path, node: int, split: str = "train") -> list[str]:
    m = read_manifest(src, split)
    return [m.shards[i].name for i in
            node_shards([s.samples for s in m.shards], NODES, "partition", 0)[node]]


def copy_nodes(dst: Path, to: Path) -> None:
    """Copy every node's folder under ``dst`` (``n<k>``) to ``to``."""
    for k in range(NODES):
        shutil.copytree(dst / f"n{k}", to / f"n{k}")


def fanout_cmd(src: Path, dst: Path, port: int, node: int, *extra: object) -> list[str]:
    return [sys.executable, "-m", "bench.rchar", "stage-to-node", "--src", str(src), "--dst",
            str(dst / "n{node}"), "--mode", "replicate", "--fanout", "--rendezvous",
            f"127.0.0.1:{port}", "--num-nodes", str(NODES), "--node-rank", str(node), "--json",
            "-q", *(str(a) for a in extra)]


def start_nodes(src: Path, dst: Path, *extra: object) -> list[subprocess.Popen[str]]:
    port = free_port()
    return [subprocess.Popen(fanout_cmd(src, dst, port, k, *extra), env=env(), cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for k in range(NODES)]


def summaries(results: Sequence[tuple[int, str, str]]) -> list[dict[str, Any]]:
    out = []
    for code, stdout, stderr in results:
        assert code == 0, stderr
        s = json.loads(stdout)
        s["rchar"] = int(stderr.strip().splitlines()[-1].split()[1])
        out.append(s)
    return out


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("rchar ")]
    assert len(lines) == 1 and lines[0].startswith("imgprep: error: "), stderr
    return lines[0]


# ---------------------------------------------------------------------------- the schedule


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_transfers_reach_every_lacking_node_once(n: int) -> None:
    owners = [i % n for i in range(11)]
    fresh = plan_transfers([[False] * 11 for _ in range(n)], owners)
    assert [t.index for t in fresh[:n]] == list(range(n))  # senders take turns
    for t in fresh:
        assert t.sender == owners[t.index] and t.from_server
        assert t.chain == tuple((t.sender + d) % n for d in range(1, n))  # ring order
    have = [[(i + k) % 3 == 0 for i in range(11)] for k in range(n)]
    for t in plan_transfers(have, owners):
        held = any(h[t.index] for h in have)
        assert t.from_server == (not held)  # the server only for what no node holds
        assert have[t.sender][t.index] if held else t.sender == owners[t.index]
        got = t.chain + ((t.sender,) if t.from_server else ())  # the reader keeps a copy
        assert sorted(got) == [k for k in range(n) if not have[k][t.index]]
    assert plan_transfers([[True] * 11 for _ in range(n)], owners) == []


def test_the_stall_clock_runs_only_while_nothing_moves_and_no_peer_is_awaited() -> None:
    clock = StallClock(0.2)
    assert clock.stuck((0, 0), False) is None  # the first look starts the clock
    time.sleep(0.3)
    assert clock.stuck((0, 5), False) is None  # bytes moved: the clock restarts
    time.sleep(0.3)
    assert clock.stuck((0, 5), True) is None  # waiting on a peer: that peer's stall, not ours
    assert clock.stuck((0, 5), False) is None  # the wait ended at the last look
    time.sleep(0.3)
    idle = clock.stuck((0, 5), False)
    assert idle is not None and 0.25 < idle < 5


def test_chunks_cover_the_shard() -> None:
    assert chunks(10, 4) == [4, 4, 2] and chunks(8, 4) == [4, 4] and chunks(0, 4) == [0]


def test_walk_interleaves_senders_chunk_by_chunk() -> None:
    transfers = plan_transfers([[False] * 4 for _ in range(2)], [0, 1, 0, 1])
    steps = [(t.index, c, size) for t, c, size in walk(transfers, [10, 6, 4, 0], 4)]
    assert steps == [(0, 0, 4), (1, 0, 4), (0, 1, 4), (1, 1, 2), (0, 2, 2),  # round 0
                     (2, 0, 4), (3, 0, 0)]  # round 1


# ---------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def fanned(src: Path, tmp_path_factory: pytest.TempPathFactory) -> Fanned:
    """One clean fan-out of ``src`` over the nodes, run once for the tests that start from a
    complete set: (the nodes' parent folder, their summaries). Read-only: tests that damage
    the nodes' folders work on a copy."""
    dst = tmp_path_factory.mktemp("fanned")
    return dst, summaries(outcomes(start_nodes(src, dst), TIMEOUT))


@pytest.mark.slow
def test_every_node_gets_everything_reading_the_server_once(
        src: Path, fanned: Fanned, tmp_path: Path) -> None:
    total, indexes = set_bytes(src), index_bytes(src)
    assert indexes > 0
    manifests = sum((src / f"{split}.json").stat().st_size for split in ("train", "val"))
    dst, runs = fanned
    for k, s in enumerate(runs):
        assert (s["node_rank"], s["role"], s["fanout"]) == (k, "copier", True)
        share = sum(e.bytes for split in ("train", "val")
                    for e in read_manifest(src, split).shards if e.name in owned(src, k, split))
        own = indexes if k == 0 else 0  # node 0 reads the indexes, then fans them out
        assert s["bytes_read"] == share + own  # its partition share
        assert s["bytes_read"] + s["bytes_received"] == total + indexes
        # the kernel agrees (it counts file reads, not the network's): the node's share and
        # its reads of the manifests (listing, planning, its own after writing: ~54 kB each
        # here, for the class table), never a second share (~300 kB) or the set (~980 kB)
        assert s["bytes_read"] <= s["rchar"] < s["bytes_read"] + 4 * manifests + 64_000, s
        assert_complete(src, dst / f"n{k}")
    read = sum(s["bytes_read"] for s in runs)
    assert read == total + indexes  # the shards and the indexes once in all

    copy_nodes(dst, tmp_path)
    rerun = summaries(outcomes(start_nodes(src, tmp_path), TIMEOUT))
    assert [(s["bytes_read"], s["bytes_received"], s["shards_copied"]) for s in rerun] == \
        [(0, 0, 0)] * NODES


@pytest.fixture
def fifo_src(src: Path, tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """A copy of ``src`` where node 2's first train shard is a named pipe: node 2 blocks on
    it mid-read. Yields (source, pipe, the real shard set aside)."""
    s = Path(shutil.copytree(src, tmp_path / "src"))
    pipe = s / owned(s, 2)[0]
    aside = tmp_path / "aside.tar"
    os.replace(pipe, aside)
    os.mkfifo(pipe)
    yield s, pipe, aside


def exit_times(procs: Sequence[subprocess.Popen[str]], since: float) -> list[float]:
    """Seconds from ``since`` until each process exited (each prints its error, then exits
    at once); their output stays in the pipes for ``outcome``."""
    left, times = set(range(len(procs))), [0.0] * len(procs)
    deadline = since + TIMEOUT
    while left and time.monotonic() < deadline:
        for k in list(left):
            if procs[k].poll() is not None:
                times[k] = time.monotonic() - since
                left.discard(k)
        time.sleep(0.02)
    assert not left, f"nodes {sorted(left)} still run {TIMEOUT} s after the kill"
    return times


@pytest.mark.slow
@pytest.mark.serial  # timed to the heartbeat
def test_a_killed_node_stops_the_others_naming_it_within_two_heartbeats(
        fifo_src: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """SIGKILL node 2 mid-fan-out (held reading its shard): every other node fails naming it
    within two heartbeats of the kill, node 0 (the store's host) included; a rerun
    completes."""
    s, pipe, aside = fifo_src
    dst = tmp_path / "dst"
    procs = start_nodes(s, dst, "--timeout", 60)
    fd = feed_pipe(pipe, aside.read_bytes()[:1000], procs[2], TIMEOUT, "node 2's shard")
    try:
        time.sleep(1)  # the others move what they can, then wait on node 2
        t0 = time.monotonic()
        procs[2].kill()
        waited = exit_times(procs, t0)
        results = outcomes(procs, TIMEOUT)
    finally:
        os.close(fd)
    print(f"seconds from the kill to each node's failure: {waited}")
    for k in (0, 1):
        assert waited[k] <= 2 * HEARTBEAT + 1.0, (k, waited)
    for k, (code, _, stderr) in enumerate(results):
        if k != 2:
            assert code == 3, stderr
            line = error_line(stderr)
            assert f"node {k}: fan-out" in line and "node 2" in line and "rerun" in line, line
    for k in range(NODES):
        assert_nothing_bad(s, dst / f"n{k}")
    os.replace(aside, pipe)
    runs = summaries(outcomes(start_nodes(s, dst), TIMEOUT))
    for k in range(NODES):
        assert_complete(s, dst / f"n{k}")
    assert sum(r["bytes_read"] for r in runs) <= set_bytes(s)  # what was there stayed


@pytest.mark.slow
def test_a_node_whose_file_server_read_hangs_stops_every_node_naming_itself(
        fifo_src: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """Node 2's read stays open but silent (a hung mount): its heartbeat goes on, so only it
    can tell; after --stall-timeout it fails naming the shard, and the others stop with it
    long before --timeout."""
    s, pipe, aside = fifo_src
    dst = tmp_path / "dst"
    procs = start_nodes(s, dst, "--timeout", 90, "--stall-timeout", 3)
    fd = feed_pipe(pipe, aside.read_bytes()[:1000], procs[2], TIMEOUT, "node 2's shard")
    try:
        t0 = time.monotonic()
        results = outcomes(procs, TIMEOUT)
        waited = time.monotonic() - t0
    finally:
        os.close(fd)
    assert waited < 45, waited  # the stall (3 s) and the others' reaction, not --timeout (90 s)
    stuck = f"node 2: stuck reading shard {pipe.name} from the file server: no byte moved"
    for k, (code, _, stderr) in enumerate(results):
        assert code == 3, stderr
        line = error_line(stderr)
        assert stuck in line and "--stall-timeout" in line, line
        if k != 2:
            assert f"node {k}: fan-out stopped: node 2 failed" in line, line
    for k in range(NODES):
        assert_nothing_bad(s, dst / f"n{k}")
    os.replace(aside, pipe)
    runs = summaries(outcomes(start_nodes(s, dst), TIMEOUT))
    for k in range(NODES):
        assert_complete(s, dst / f"n{k}")
    assert sum(r["bytes_read"] for r in runs) <= set_bytes(s)  # what was there stayed


@pytest.mark.slow
def test_a_corrupt_copy_on_a_sender_is_caught_by_its_receivers(
        src: Path, fanned: Fanned, tmp_path: Path) -> None:
    copy_nodes(fanned[0], tmp_path)
    bad = owned(src, 1)[0]
    victim = tmp_path / "n1" / bad
    data = bytearray(victim.read_bytes())
    data[700] ^= 0xFF  # same size: node 1's done-marker still vouches for it
    victim.write_bytes(bytes(data))
    (tmp_path / "n2" / bad).unlink()  # node 2, next after node 1, gets node 1's copy
    results = outcomes(start_nodes(src, tmp_path, "--timeout", 60), TIMEOUT)
    assert results[2][0] == 3
    line = error_line(results[2][2])
    for words in ("node 2", bad, "node 1's copy", "sha256"):
        assert words in line, (words, line)
    assert not (tmp_path / "n2" / bad).exists()
    for k in (0, 1):
        assert results[k][0] == 3 and "node 2 failed" in error_line(results[k][2])

    # node 1 re-checks, finds it bad
    runs = summaries(outcomes(start_nodes(src, tmp_path), TIMEOUT))
    assert sum(r["bytes_read"] for r in runs) == 0  # healthy copies came from other nodes
    assert sorted(r["shards_copied"] for r in runs) == [0, 1, 1]
    for k in range(NODES):
        assert_complete(src, tmp_path / f"n{k}")


@pytest.mark.slow
def test_a_corrupt_shard_on_the_file_server_stops_every_node(src: Path, tmp_path: Path) -> None:
    s = Path(shutil.copytree(src, tmp_path / "src"))
    bad = s / owned(s, 2)[1]
    data = bytearray(bad.read_bytes())
    data[700] ^= 0xFF
    bad.write_bytes(bytes(data))
    results = outcomes(start_nodes(s, tmp_path / "dst", "--timeout", 60), TIMEOUT)
    for k, (code, _, stderr) in enumerate(results):
        assert code == 3, stderr
        line = error_line(stderr)
        assert bad.name in line and "sha256" in line, line
        assert_nothing_bad(src, tmp_path / "dst" / f"n{k}")
        assert not (tmp_path / "dst" / f"n{k}" / bad.name).exists()
    assert "the file server's" in error_line(results[2][2])  # its reader names the source


# ---------------------------------------------------------------------------- launchers, usage


@pytest.mark.slow
def test_torchrun_two_nodes_copiers_fan_out_and_waiters_wait(src: Path, tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "imgprep", "stage-to-node", "--src", str(src), "--dst",
           str(tmp_path / "n{node}"), "--fanout", "--json", "-q", "--timeout", 60]
    procs = [subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=env(RANK=r, WORLD_SIZE=4, LOCAL_RANK=r % 2, LOCAL_WORLD_SIZE=2,
                                      GROUP_RANK=r // 2, MASTER_ADDR="127.0.0.1",
                                      MASTER_PORT=port))
             for r in range(4)]
    runs = []
    for code, stdout, stderr in outcomes(procs, TIMEOUT):
        assert code == 0, stderr
        runs.append(json.loads(stdout))
    assert [s["role"] for s in runs] == ["copier", "waiter"] * 2
    assert sum(s["bytes_read"] for s in runs) == set_bytes(src) + index_bytes(src)
    for k in range(2):
        assert_complete(src, tmp_path / f"n{k}")


@pytest.mark.slow
def test_mpirun_copiers_meet_over_mpi4py(src: Path, tmp_path: Path) -> None:
    """Four MPI ranks posing as two nodes of two (local variables set per rank): rank 0's
    address and a free port go out over mpi4py, the node copiers fan out, the others wait."""
    as_two_nodes = ("OMPI_COMM_WORLD_LOCAL_SIZE=2 "
                    "OMPI_COMM_WORLD_LOCAL_RANK=$((OMPI_COMM_WORLD_RANK % 2)) exec \"$@\"")
    cmd = [*mpirun_cmd(4), "sh", "-c", as_two_nodes, "sh", sys.executable, "-m", "imgprep",
           "stage-to-node", "--src", str(src), "--dst", str(tmp_path / "n{node}"), "--fanout",
           "--json", "-q", "--timeout", "60"]
    r = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = sorted((json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")),
                  key=lambda s: s["rank"])
    assert [(s["node_rank"], s["role"]) for s in runs] == \
        [(0, "copier"), (0, "waiter"), (1, "copier"), (1, "waiter")]
    assert all(s["bytes_received"] > 0 for s in runs if s["role"] == "copier")
    for k in range(2):
        assert_complete(src, tmp_path / f"n{k}")


def test_fanout_without_a_meeting_point_says_what_to_pass(src: Path, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "imgprep", "stage-to-node", "--src", str(src),
                        "--dst", str(tmp_path / "n{node}"), "--fanout", "--num-nodes", "2",
                        "--node-rank", "1", "-q"], env=env(), capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 3
    line = error_line(r.stderr)
    assert "node 1" in line and "--rendezvous HOST:PORT" in line
    usage = invoke("stage-to-node", "--src", src, "--dst", tmp_path / "x", "--fanout", "--mode",
                   "partition")  # refused before any fan-out: in this process
    assert usage.exit_code == 2 and "--mode replicate" in usage.stderr


def test_where_copiers_meet() -> None:
    world = World(rank=0, world_size=4, local_rank=0, local_world_size=2, node_rank=0, num_nodes=2,
                  launcher="torchrun")
    rv = copier_rendezvous(world, "node0:29500", {})
    assert (rv.addr, rv.port, rv.store_listens) == ("node0", 29500, False)
    plain = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}
    assert copier_rendezvous(world, None, plain) == Rendezvous("10.0.0.1", 29400,
                                                              "MASTER_ADDR/MASTER_PORT")
    agent = copier_rendezvous(world, None, {**plain, "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert agent.store_listens  # torchrun's agent keeps the store: nobody opens another
    loop = World().with_nodes(3, 2)
    with pytest.raises(RendezvousError, match="node 2: fan-out over 3 nodes .* --rendezvous"):
        copier_rendezvous(loop, None, {})
    for bad in ("node0", "node0:", ":29500", "node0:http", "node0:70000"):
        with pytest.raises(RendezvousError, match="HOST:PORT"):
            copier_rendezvous(loop, bad, {})
