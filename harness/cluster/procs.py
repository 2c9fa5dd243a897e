"""Start a group of commands at once (one per node), each bounded in time and tied to us.

Every child gets ``PR_SET_PDEATHSIG`` (SIGKILL), so it dies if this process does, even by
SIGKILL, and a deadline: past it the whole group is killed and a ClusterError names the
command that was late. A child that exits non-zero fails the group with its stderr's tail.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from harness.cluster.netns import ClusterError
from imgprep.procs import die_with_parent, readable

REPO = Path(__file__).resolve().parents[2]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for children: this checkout first on PYTHONPATH, one thread each."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **(extra or {})}


class Started:
    """A context manager for what ``_start`` brings up and ``close`` tears down (idempotent):
    a start that fails part way is closed before its error goes on, so nothing is left
    running behind a failed ``with``."""

    def _start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Group:
    """Children started together; ``wait`` collects their stdout in order."""

    def __init__(self, argvs: Sequence[Sequence[str]], timeout: float,
                 env: dict[str, str] | None = None, stdin: bool = False) -> None:
        self.argvs = [list(a) for a in argvs]
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.procs: list[subprocess.Popen[str]] = []
        self.errs = [tempfile.TemporaryFile("w+") for _ in self.argvs]  # never a full pipe
        try:
            for argv, err in zip(self.argvs, self.errs, strict=True):
                self.procs.append(subprocess.Popen(
                    argv, stdout=subprocess.PIPE, stderr=err, text=True,
                    stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                    env=env or child_env(), preexec_fn=die_with_parent))
        except BaseException:
            self.kill()
            raise

    def readline(self, i: int) -> str:
        """One line of child ``i``'s stdout, waiting no later than the group's deadline."""
        stdout = self.procs[i].stdout
        left = self.deadline - time.monotonic()
        if stdout is None or left <= 0 or not readable(stdout, left):
            self.kill()
            raise ClusterError(f"{' '.join(self.argvs[i])} printed nothing within "
                               f"{self.timeout:.0f} s")
        return stdout.readline()

    def stderr_tail(self, i: int) -> str:
        """The last line child ``i`` wrote on stderr (what to show when it failed)."""
        self.errs[i].seek(0)
        lines = [line for line in self.errs[i].read().splitlines() if line.strip()]
        return lines[-1] if lines else "(nothing on stderr)"

    def send(self, text: str) -> None:
        """Write ``text`` to every child's stdin at (nearly) the same moment."""
        for p in self.procs:
            if p.stdin is not None:
                p.stdin.write(text)
                p.stdin.flush()

    def wait(self) -> list[str]:
        """Every child's stdout, once all exited 0; kills the group on a failure or timeout."""
        outs: list[str] = []
        try:
            for argv, p, errf in zip(self.argvs, self.procs, self.errs, strict=True):
                left = max(0.1, self.deadline - time.monotonic())
                try:
                    out, _ = p.communicate(timeout=left)
                except subprocess.TimeoutExpired as e:
                    raise ClusterError(f"{' '.join(argv)} did not finish within "
                                       f"{self.timeout:.0f} s") from e
                if p.returncode != 0:
                    errf.seek(0)
                    err = errf.read()
                    raise ClusterError(f"{' '.join(argv)} failed (exit {p.returncode}): "
                                       f"{err.strip()[-800:]}")
                outs.append(out)
        finally:
            self.kill()
        return outs

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        for f in self.errs:
            f.close()


def run_group(argvs: Sequence[Sequence[str]], timeout: float,
              env: dict[str, str] | None = None) -> list[str]:
    """Run the commands concurrently; their stdouts."""
    return Group(argvs, timeout, env).wait()


def last_json(out: str) -> dict[str, Any]:
    """The last line of ``out`` that is a JSON object."""
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise ClusterError(f"no JSON line in the output: {out[-300:]!r}")
