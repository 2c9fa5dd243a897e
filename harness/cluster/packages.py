"""The Debian packages the cluster in a box runs on, installed with apt-get when missing.

One list for both callers: the benchmark's preflight (:func:`ensure`) and ``make test`` /
``make cluster`` (``python3 -m harness.cluster.packages``: installs whatever is missing, as
root, and prints nothing when nothing is). Standard library only, so that it runs before the
virtualenv exists.

- the file server: sshfs (with fuse3's fusermount3) on the nodes, sshd on the server;
- Slurm (``--slurm``): slurmctld, slurmd and the client commands (slurm-wlm), munged (munge),
  and the PMIx library that Slurm's ``mpi/pmix`` plugin loads for ``srun --mpi=pmix``: Debian
  ships the plugin in slurm-wlm but the ``libpmix.so`` it opens only in libpmix-dev.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

# what must be there (a program on PATH, or an absolute path or pattern) -> its package
FILE_SERVER = {"sshfs": "sshfs", "/usr/sbin/sshd": "openssh-server", "fusermount3": "fuse3"}
SLURM = {"/usr/sbin/slurmctld": "slurm-wlm", "/usr/sbin/slurmd": "slurm-wlm",
         "sbatch": "slurm-wlm", "/usr/sbin/munged": "munge",
         "/usr/lib/*/pmix2/lib/libpmix.so": "libpmix-dev"}
ALL = {**FILE_SERVER, **SLURM}


def _present(what: str) -> bool:
    if what.startswith("/"):
        return bool(glob.glob(what))
    return shutil.which(what) is not None


def missing(packages: dict[str, str]) -> list[str]:
    """The packages whose files are absent, sorted."""
    return sorted({pkg for what, pkg in packages.items() if not _present(what)})


def ensure(packages: dict[str, str]) -> str | None:
    """Install the missing packages with apt-get (as root); None, or why they are not there."""
    absent = missing(packages)
    if not absent:
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"{', '.join(absent)} not installed (apt-get as root would install them)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *absent]):
        try:
            subprocess.run(argv, capture_output=True, timeout=900, env=env, check=True)
        except subprocess.CalledProcessError as e:
            tail = (e.stderr or b"").decode(errors="replace").strip()[-300:]
            return f"installing {', '.join(absent)} failed: {' '.join(argv)}: {tail}"
        except (subprocess.SubprocessError, OSError) as e:
            return f"installing {', '.join(absent)} failed: {e}"
    left = missing(packages)
    return f"{', '.join(left)} still missing after apt-get install" if left else None


def main() -> int:
    """``make test``'s step: install what is missing when root; silent when there is nothing
    to do; a note (not a failure) where it cannot, since the cluster tests then skip."""
    absent = missing(ALL)
    if not absent or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return 0
    print(f"apt-get install {' '.join(absent)} (the cluster in a box)", flush=True)
    why = ensure(ALL)
    if why is not None:
        print(f"packages.py: {why}; the cluster tests will skip", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
