"""The GPU acceptance kit: one command that proves the CUDA paths on a GPU machine.

    PYTHONPATH=. python scripts/gpu_check.py --out gpu-out         # on the GPU machine
    PYTHONPATH=. python scripts/gpu_check.py --device cpu --quick   # its CPU form, anywhere
    PYTHONPATH=. python scripts/gpu_check.py --wheel dist/imgprep-*.whl --out gpu-out

It says what the machine has (GPU, torch and CUDA, which PIL and libjpeg-turbo, cores, missing
optional packages), skips with one line each the checks it cannot run, then runs the trainer
(synthetic against fed), NCCL against Gloo, DeviceLoader, the loader and convert on every
core, DALI where it imports, and the nvjpeg backend (torchvision's nvJPEG) against the CPU
loader; ``--only NAMES`` runs some. ``--out DIR`` receives the JSON record and the markdown
table. What to carry to a machine without network: docs/gpu_check.md.

``--wheel FILE``: first install that wheel (``make wheel``'s, carried as a file) with pip,
no dependencies and no index, into ``build/gpu-kit/site`` (made afresh) and put it first on
the path, so that imgprep and loaders, and the extension with its own libjpeg-turbo, come
from the wheel, as a user's install would give them.

The kit is the harness room ``harness/gpukit`` (it measures with ``bench``, which the scripts
do not import); this file only starts it, ``python -m harness.gpukit.run``, with the
repository first on the path (after the wheel's folder).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SITE = REPO / "build" / "gpu-kit" / "site"  # git-ignored


def wheel_of(argv: list[str]) -> str | None:
    """The value of ``--wheel FILE`` or ``--wheel=FILE`` in ``argv``, if any."""
    for i, arg in enumerate(argv):
        if arg.startswith("--wheel="):
            return arg.split("=", 1)[1]
        if arg == "--wheel" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def install(wheel: str) -> None:
    """``wheel`` into SITE, afresh: no dependencies (the machine has them), no index."""
    shutil.rmtree(SITE, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
           "--target", str(SITE), wheel]
    print(f"gpu_check: {' '.join(cmd)}", flush=True)
    if subprocess.run(cmd).returncode:
        sys.exit(f"gpu_check: error: pip could not install {wheel} (docs/gpu_check.md)")


if __name__ == "__main__":
    wheel = wheel_of(sys.argv[1:])
    if wheel is not None:
        install(wheel)
    first = [str(SITE)] if wheel is not None else []
    path = os.pathsep.join(p for p in (*first, str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    os.environ["PYTHONPATH"] = path
    # -P: the current folder (the checkout) does not go before the path set here
    os.execv(sys.executable, [sys.executable, "-P", "-m", "harness.gpukit.run", *sys.argv[1:]])
