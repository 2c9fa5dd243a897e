"""Which imgprep the kit runs: the checkout's, or the wheel's (``scripts/gpu_check.py --wheel
FILE``).

With ``--wheel`` the launcher installs FILE with ``pip install --no-deps --no-index --target
build/gpu-kit/site`` (a git-ignored folder of the checkout, made afresh) and puts that folder
first on the path, so that ``imgprep`` and ``loaders`` come from the wheel (its extension with
the libjpeg-turbo inside it: no ``LD_LIBRARY_PATH``, no system libjpeg) while the kit's own
code, ``bench`` and the trainer come from the checkout. The kit and its ``python -m imgprep``
children run with ``python -P`` so that the current folder (the checkout) does not go first
on their path; the trainer, a script, has its own folder first, which holds no imgprep. A
wheel built from other sources than
the checkout's would be measured as if it were this commit: the kit refuses to run on it,
naming the files that differ.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("imgprep", "loaders")  # what the wheel installs


def differences(site: Path, repo: Path = REPO) -> list[str]:
    """The Python files of ``PACKAGES`` that differ between ``site`` (where a wheel is
    installed) and ``repo``, or that only one of them has, as paths relative to both."""
    out = []
    for pkg in PACKAGES:
        mine = {p.relative_to(site) for p in (site / pkg).rglob("*.py")}
        theirs = {p.relative_to(repo) for p in (repo / pkg).rglob("*.py")}
        out += [str(rel) for rel in sorted(mine | theirs)
                if rel not in mine or rel not in theirs
                or (site / rel).read_bytes() != (repo / rel).read_bytes()]
    return out


def origin() -> dict[str, Any]:
    """Where this process imports imgprep from (``site``; ``wheel``: not the checkout), the
    files in which it differs from the checkout, and ``LD_LIBRARY_PATH`` (None: unset)."""
    import imgprep

    site = Path(imgprep.__file__).resolve().parents[1]
    wheel = site != REPO
    return {"site": str(site), "wheel": wheel, "differ": differences(site) if wheel else [],
            "ld_library_path": os.environ.get("LD_LIBRARY_PATH")}


def line(o: dict[str, Any]) -> str:
    """What the kit says of it, one line."""
    ld = o["ld_library_path"]
    env = f"LD_LIBRARY_PATH={ld}" if ld is not None else "LD_LIBRARY_PATH unset"
    if not o["wheel"]:
        return f"imgprep from the checkout ({o['site']}); {env}"
    same = (f"its sources differ from the checkout's in {len(o['differ'])} files"
            if o["differ"] else "its sources are the checkout's")
    return f"imgprep from the wheel installed in {o['site']} ({same}); {env}"
