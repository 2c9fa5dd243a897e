"""The GPU acceptance kit: one command that proves the CUDA paths on a GPU machine.

    PYTHONPATH=. python scripts/gpu_check.py --out gpu-out         # on the GPU machine
    PYTHONPATH=. python scripts/gpu_check.py --device cpu --quick   # its CPU form, anywhere

It says what the machine has (GPU, torch and CUDA, which PIL, cores, missing optional
packages), skips with one line each the checks it cannot run, then runs the trainer (synthetic
against fed), NCCL against Gloo, DeviceLoader, the loader and convert on every core, DALI
where it imports, and the nvjpeg backend (torchvision's nvJPEG) against the CPU loader;
``--only NAMES`` runs some. ``--out DIR`` receives the JSON record and the
markdown table. What to carry to a machine without network: docs/gpu_check.md.

The kit is the harness room ``harness/gpukit`` (it measures with ``bench``, which the scripts
do not import); this file only starts it, ``python -m harness.gpukit.run``, with the
repository first on the path.
"""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    os.environ["PYTHONPATH"] = path
    os.execv(sys.executable, [sys.executable, "-m", "harness.gpukit.run", *sys.argv[1:]])
