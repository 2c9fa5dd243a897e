"""What every fault, hostile-input or scale run needs around a child process: an environment
without any launcher's variables, and the checks made afterwards (one error line naming the
file, no temporary file left behind). Every harness and the tests (``tests.support``) use
these functions."""

from __future__ import annotations

import os
from pathlib import Path

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "SLURM_")


def is_launcher_var(name: str) -> bool:
    return name in LAUNCHER_VARS or name.startswith(LAUNCHER_PREFIXES)


def clean_env(**extra: object) -> dict[str, str]:
    """This environment without any launcher's variables, one thread per process, plus
    ``extra``: what a child process needs to see exactly the launcher it is given."""
    env = {k: v for k, v in os.environ.items() if not is_launcher_var(k)}
    env["OMP_NUM_THREADS"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


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
