"""Helpers the tests and the reliability harness (``scripts/reliability``) share: ports,
launcher-free environments, and the checks every hostile or fault case makes (one error line
naming the file, no temporary file left behind)."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "SLURM_")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def is_launcher_var(name: str) -> bool:
    return name in LAUNCHER_VARS or name.startswith(LAUNCHER_PREFIXES)


def clean_env(**extra: object) -> dict[str, str]:
    """This environment without any launcher's variables, one thread per process, plus
    ``extra``: what a child process needs to see exactly the launcher a test gives it."""
    env = {k: v for k, v in os.environ.items() if not is_launcher_var(k)}
    env["OMP_NUM_THREADS"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def torchrun_env(rank: int, world_size: int, local_world_size: int,
                 **extra: object) -> dict[str, str]:
    """What torchrun gives ``rank`` of ``world_size`` with ``local_world_size`` ranks a node."""
    return clean_env(RANK=rank, WORLD_SIZE=world_size, LOCAL_RANK=rank % local_world_size,
                     LOCAL_WORLD_SIZE=local_world_size, GROUP_RANK=rank // local_world_size,
                     **extra)


def tmp_leftovers(root: Path) -> list[str]:
    """Temporary files (``.tmp-*``) anywhere under ``root``, relative to it."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob(".tmp-*"))


def one_line_problem(err: str, *names: object) -> str | None:
    """None when ``err`` is one ``imgprep: error:`` line (or one line of another tool) naming
    every one of ``names``, with no traceback; else what is wrong with it."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    if "Traceback" in err or len(lines) != 1:
        return f"not one line: {err.strip()[-400:]!r}"
    missing = [str(n) for n in names if str(n) not in lines[0]]
    return f"{lines[0]!r} lacks {missing}" if missing else None


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
