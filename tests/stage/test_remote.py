"""``stage-to-node --src URL``: a converted folder served over HTTP (a plain ``http.server`` on
127.0.0.1) or read through a ``pipe:`` command stages exactly as the folder does: the same
bytes, the node-local manifest, resume, sha256 checks, one-line errors naming the URL, and
fan-out reading each shard from the server once in all.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from imgprep.job.assign import node_shards
from imgprep.job.world import World
from imgprep.shards.manifest import Manifest, read_manifest
from imgprep.shards.verify import verify
from imgprep.stage.remote import UrlSource, check_url
from loaders import LoaderOptions
from loaders.shards import ShardLoader
from loaders.transforms import ValTransform
from tests.support import fanout_nodes, free_port
from tests.support.cli import invoke

TIMEOUT = 120  # a fan-out run: two processes on shared cores, each importing torch
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
                 "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "SLURM_")
NO_PROXY = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


# ---------------------------------------------------------------------------- fixtures, helpers


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process runs detect a single process; curl never goes through a proxy here."""
    for name in list(os.environ):
        if name in LAUNCHER_VARS or name.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(name)
    for name, value in NO_PROXY.items():
        monkeypatch.setenv(name, value)


class Served:
    """A folder served at ``url``; ``counts`` holds the bytes sent per file name."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.counts, lock = folder, Counter[str](), threading.Lock()
        counts = self.counts

        class Handler(SimpleHTTPRequestHandler):
            def copyfile(self, source: Any, outputfile: Any) -> None:
                n = 0
                while block := source.read(64 << 10):
                    outputfile.write(block)
                    n += len(block)
                with lock:
                    counts[self.path.lstrip("/")] += n

            def log_message(self, *args: Any) -> None:  # quiet test output
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0),
                                          functools.partial(Handler, directory=str(folder)))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def shard_bytes(self) -> int:
        return sum(n for name, n in self.counts.items() if name.endswith(".tar"))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def serve() -> Iterator[Callable[[Path], Served]]:
    """Start HTTP servers on folders; every one is shut down after the test."""
    started: list[Served] = []

    def start(folder: Path) -> Served:
        started.append(Served(folder))
        return started[-1]

    yield start
    for s in started:
        s.close()


def stage(src: str, dst: Path, *extra: object) -> tuple[int, str]:
    """Run stage-to-node in this process (the fan-out test below runs it as processes);
    returns the exit code and stdout then stderr."""
    r = invoke("stage-to-node", "--src", src, "--dst", dst, "--json", "-q", *extra)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, r.stdout + r.stderr


def staged(src: str, dst: Path, *extra: object) -> dict[str, Any]:
    code, out = stage(src, dst, *extra)
    assert code == 0, out
    return dict(json.loads(out))


def error_line(out: str, *names: str) -> str:
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("imgprep: error: "), out
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_of(m: Manifest) -> list[str]:
    """The shards a manifest lists, and its sample index."""
    return [e.name for e in m.shards] + ([m.index.name] if m.index else [])


def assert_same_files(src: Path, dst: Path, split: str, names: list[str] | None = None) -> None:
    """``dst`` holds ``names`` (default: every file of the split) byte-identical to ``src``,
    and nothing else of the split (no temporary names either)."""
    m = read_manifest(src, split)
    names = files_of(m) if names is None else names
    for name in names:
        assert sha(dst / name) == sha(src / name), name
    held = sorted(p.name for p in dst.iterdir() if p.name.startswith(f"{split}-")
                  and p.suffix in (".tar", ".bin"))  # the DALI indexes: tests/shards
    assert held == sorted(names)
    assert not list(dst.rglob(".tmp-*"))


def samples_read(dst: Path, split: str) -> int:
    loader = ShardLoader(dst, split, World(),
                         LoaderOptions(batch_size=4, workers=0, tail="uneven",
                                       transform=ValTransform(size=32, resize=32)))
    return sum(len(labels) for _, labels in loader)


def env(**extra: object) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)}
    e.update({k: str(v) for k, v in extra.items()}, OMP_NUM_THREADS="1",
             TORCH_CPP_LOG_LEVEL="ERROR", **NO_PROXY)
    return e


# ---------------------------------------------------------------------------- URLs


def test_urls_are_checked_and_spelled_one_way() -> None:
    assert check_url("http://host/imagenet") == "http://host/imagenet/"
    assert UrlSource("https://host/in").where("train.json") == "https://host/in/train.json"
    assert UrlSource("pipe:aws s3 cp s3://b/in/{} -").where("train-000000.tar") == \
        "pipe:aws s3 cp s3://b/in/train-000000.tar -"
    for bad in ("pipe:cat /x/train.json", "http://", "http://host/x?y=1", "ftp://host/"):
        with pytest.raises(ValueError):
            check_url(bad)


def test_cli_refuses_a_pipe_without_a_name_slot_and_a_url_without_split(tmp_path: Path) -> None:
    code, out = stage("pipe:cat train.json", tmp_path / "dst", "--split", "train")
    assert code == 2 and "needs {}" in out
    code, out = stage("http://127.0.0.1:9/x/", tmp_path / "dst")
    assert code != 0
    error_line(out, "http://127.0.0.1:9/x/", "--split")


# ---------------------------------------------------------------------------- staging over HTTP


def test_http_source_stages_the_same_bytes_and_a_node_manifest(
        src: Path, tmp_path: Path, serve: Callable[[Path], Served]) -> None:
    server = serve(src)
    dst = tmp_path / "dst"
    for split in ("train", "val"):
        s = staged(server.url, dst, "--split", split)
        m = read_manifest(src, split)
        assert (s["role"], s["shards_copied"], s["shards_skipped"]) == \
            ("copier", len(m.shards), 0)
        assert s["bytes_read"] == m.total_bytes + (m.index.bytes if m.index else 0)
        assert_same_files(src, dst, split)
        local = read_manifest(dst, split)
        assert local.node is not None and local.node.num_nodes == 1
        assert local.shards == m.shards and local.index == m.index
        assert samples_read(dst, split) == m.total_samples
    assert server.shard_bytes() == sum(read_manifest(src, sp).total_bytes
                                       for sp in ("train", "val"))
    rep = verify(dst, decode=False)
    assert rep.ok, rep.problems


def test_partition_mode_gives_each_node_its_share(
        src: Path, tmp_path: Path, serve: Callable[[Path], Served]) -> None:
    server = serve(src)
    m = read_manifest(src, "train")
    shares = node_shards([e.samples for e in m.shards], 2, "partition", 0)
    for k in range(2):
        dst = tmp_path / f"n{k}"
        s = staged(server.url, dst, "--split", "train", "--mode", "partition",
                   "--num-nodes", 2, "--node-rank", k)
        names = [m.shards[i].name for i in shares[k]]
        assert s["shards_copied"] == len(names)
        assert_same_files(src, dst, "train", names + ([m.index.name] if m.index else []))
        local = read_manifest(dst, "train")
        assert local.node is not None and (local.node.node_rank, local.node.mode) == \
            (k, "partition")
    assert server.shard_bytes() == m.total_bytes  # each shard once, by its node


def test_a_rerun_copies_nothing(src: Path, tmp_path: Path,
                                serve: Callable[[Path], Served]) -> None:
    server = serve(src)
    dst = tmp_path / "dst"
    staged(server.url, dst, "--split", "train")
    server.counts.clear()
    again = staged(server.url, dst, "--split", "train")
    assert (again["bytes_read"], again["shards_copied"]) == (0, 0)
    assert server.shard_bytes() == 0 and set(server.counts) <= {"train.json"}


def test_a_corrupt_or_short_file_on_the_server_is_caught(
        src: Path, tmp_path: Path, serve: Callable[[Path], Served]) -> None:
    served = Path(shutil.copytree(src, tmp_path / "served"))
    m = read_manifest(src, "train")
    bad, short = served / m.shards[2].name, served / m.shards[5].name
    data = bytearray(bad.read_bytes())
    data[700] ^= 0xFF
    bad.write_bytes(bytes(data))
    server = serve(served)
    dst = tmp_path / "dst"
    code, out = stage(server.url, dst, "--split", "train", "--jobs", 1)
    assert code != 0
    error_line(out, f"{server.url}{bad.name}", "sha256", "reconvert or restore")
    assert not (dst / bad.name).exists() and not list(dst.rglob(".tmp-*"))
    shutil.copy(src / bad.name, bad)  # repaired; now another one is cut short
    short.write_bytes(short.read_bytes()[:-1000])
    code, out = stage(server.url, dst, "--split", "train", "--jobs", 1)
    error_line(out, f"{server.url}{short.name}", f"{m.shards[5].bytes - 1000} bytes")
    assert not (dst / short.name).exists() and not list(dst.rglob(".tmp-*"))
    for e in m.shards:  # whatever is under a final name is right
        if (dst / e.name).exists():
            assert sha(dst / e.name) == e.sha256


def test_404_and_a_refused_connection_are_one_line_errors(
        src: Path, tmp_path: Path, serve: Callable[[Path], Served]) -> None:
    served = Path(shutil.copytree(src, tmp_path / "served"))
    server = serve(served)
    code, out = stage(server.url + "nothing/", tmp_path / "a", "--split", "train")
    assert code != 0
    error_line(out, f"{server.url}nothing/train.json", "HTTP error", "rerun")
    gone = read_manifest(src, "train").shards[3].name
    (served / gone).unlink()
    code, out = stage(server.url, tmp_path / "b", "--split", "train")
    error_line(out, f"{server.url}{gone}", "HTTP error", "rerun")
    assert not (tmp_path / "b" / gone).exists() and not list((tmp_path / "b").rglob(".tmp-*"))
    refused = f"http://127.0.0.1:{free_port()}/"
    code, out = stage(refused, tmp_path / "c", "--split", "train")
    error_line(out, f"{refused}train.json", "connection refused", "rerun")


class _Stalling(SimpleHTTPRequestHandler):
    """Sends the headers and half the body of any file, then nothing until released."""

    release = threading.Event()

    def copyfile(self, source: Any, outputfile: Any) -> None:
        data = source.read()
        outputfile.write(data[:len(data) // 2])
        outputfile.flush()
        self.release.wait(60)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_server_or_command_that_stalls_is_abandoned_not_waited_for(
        src: Path, tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 functools.partial(_Stalling, directory=str(src)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        code, out = stage(url, tmp_path / "a", "--split", "val", "--stall-timeout", "1")
    finally:
        _Stalling.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert code != 0
    error_line(out, f"{url}val.json", "no data for 1 s", "server stalled")
    code, out = stage(f"pipe:head -c 100 {src}/{{}}; exec sleep 30", tmp_path / "b",
                      "--split", "val", "--stall-timeout", "1")
    error_line(out, f"{src}/val.json", "no data for 1 s", "command stalled")
    assert not list(tmp_path.rglob(".tmp-*"))


# ---------------------------------------------------------------------------- pipe: commands


def test_a_pipe_source_stages_and_a_failing_command_is_one_line(src: Path,
                                                               tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    s = staged(f"pipe:cat {src}/{{}}", dst, "--split", "val")
    assert s["shards_copied"] == len(read_manifest(src, "val").shards)
    assert_same_files(src, dst, "val")
    assert samples_read(dst, "val") == read_manifest(src, "val").total_samples
    code, out = stage(f"pipe:cat {tmp_path}/missing/{{}} 2>/dev/null", tmp_path / "x",
                      "--split", "val")
    assert code != 0
    error_line(out, f"{tmp_path}/missing/val.json", "exited with status 1")
    doubled = f"pipe:case {{}} in *.tar) cat {src}/{{}} {src}/{{}};; *) cat {src}/{{}};; esac"
    code, out = stage(doubled, tmp_path / "z", "--split", "val", "--jobs", 1)
    error_line(out, f"{src}/val-", "has over", "reconvert or restore")
    assert not list((tmp_path / "z").glob("*.tar")) and not list((tmp_path / "z").rglob(".tmp-*"))
    (served := Path(shutil.copytree(src, tmp_path / "served"))).joinpath(
        read_manifest(src, "val").shards[1].name).unlink()
    code, out = stage(f"pipe:cat {served}/{{}} 2>/dev/null", tmp_path / "y", "--split", "val")
    error_line(out, read_manifest(src, "val").shards[1].name, "exited with status 1")
    assert not list((tmp_path / "y").glob("*.tar.*")) and not list((tmp_path / "y").rglob(".tmp-*"))


# ---------------------------------------------------------------------------- fan-out


def test_two_node_fanout_from_http_reads_each_shard_once(
        src: Path, tmp_path: Path, serve: Callable[[Path], Served]) -> None:
    server = serve(src)
    results = fanout_nodes(server.url, tmp_path, 2, env(), TIMEOUT, "--split", "train")
    m = read_manifest(src, "train")
    index = m.index.bytes if m.index else 0
    assert [s["fanout"] for s in results] == [True, True]
    assert sum(s["bytes_read"] for s in results) == m.total_bytes + index  # all once in all
    assert all(s["bytes_received"] > 0 for s in results)
    for k in range(2):
        assert_same_files(src, tmp_path / f"n{k}", "train")
    assert server.shard_bytes() == m.total_bytes  # every shard byte left the server once
    assert all(server.counts[e.name] == e.bytes for e in m.shards)
