"""What the machine has, said first: the GPU and its memory, torch and CUDA, which PIL (and
whether it is pillow-simd), the crop-aware decoder's libjpeg-turbo (bundled or the system's,
SIMD on or off), which imgprep runs (the checkout's or a wheel's, ``harness.gpukit.wheel``),
the cores, the optional packages it lacks; and which checks it cannot run, each with the
reason.

``imgprep``'s own view of PIL comes from ``python -m imgprep info --json`` (the command line
runs on the machine, as users would run it). Every torch call here exists in torch 2.1 and
later; ``torch.cuda.nccl`` is looked up, not assumed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.checks import clean_env

from . import wheel

REPO = Path(__file__).resolve().parents[2]
OPTIONAL = {  # module -> what it serves here
    "nvidia.dali": "the dali check (pip install 'imgprep[dali]')",
    "torchvision": "the nvjpeg checks on a GPU (torchvision's nvJPEG decoder)",
    "nvidia.nvimgcodec": "the feed check's hardware-decoder row on a GPU (nvImageCodec)",
    "webdataset": "stage-to-node's URL sources and bench.loader's peer (not the kit)",
    "mpi4py": "the trainer under mpirun (not the kit)",
    "pytest": "the gpu-marked tests (tests/scripts/test_gpu_check.py)",
}
# ``python -P -m imgprep``: the current folder (the checkout) is not put first on the path,
# so imgprep comes from the path the launcher set (a wheel's folder first, with --wheel)
SAFE_PATH = ("-P",)
PIL_KEYS = ("pil_version", "pillow_simd", "libjpeg_turbo", "jpeg_version", "crop_decode")


def child_env(**extra: object) -> dict[str, str]:
    """A launcher-free environment for the kit's children, with this process's path: the
    checkout on it (first, unless the launcher put a wheel's folder before it), never an
    installed copy elsewhere."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO) not in paths:
        paths.insert(0, str(REPO))
    return clean_env(PYTHONPATH=os.pathsep.join(paths), **extra)


def cores() -> int:
    """The CPUs this process may use."""
    return len(os.sched_getaffinity(0))


def _meminfo_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        return None
    return round(kb / 2**20, 1)


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), None)
    except OSError:
        return None


def optional_packages() -> dict[str, bool]:
    """Whether each optional module can be found (not imported: DALI is imported by its
    check alone)."""
    found = {}
    for name in OPTIONAL:
        try:
            found[name] = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package is missing
            found[name] = False
    return found


def gpu_info() -> dict[str, Any]:
    """GPU 0: name, memory, compute capability, bf16; the NCCL version torch carries."""
    import torch

    props = torch.cuda.get_device_properties(0)
    nccl = getattr(torch.cuda, "nccl", None)
    try:
        nccl_version = ".".join(map(str, nccl.version())) if nccl is not None else None
    except (RuntimeError, AttributeError, TypeError):
        nccl_version = None
    return {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}", "count": torch.cuda.device_count(),
            "bf16": bool(torch.cuda.is_bf16_supported()), "nccl": nccl_version,
            "cudnn": torch.backends.cudnn.version()}


def imgprep_info() -> dict[str, Any]:
    """``python -m imgprep info --json``: PIL and the versions, as the command sees them;
    on failure, the in-process view and the command's error."""
    cmd = [sys.executable, *SAFE_PATH, "-m", "imgprep", "info", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=child_env())
    if done.returncode == 0:
        info = json.loads(done.stdout.strip().splitlines()[-1])
        return {"pil": {k: info["pil"].get(k) for k in PIL_KEYS}, "versions": info["versions"],
                "libjpeg": info.get("libjpeg")}
    from imgprep import pil_info

    pil = asdict(pil_info(check_avx2=False))
    return {"pil": {k: pil.get(k) for k in PIL_KEYS}, "versions": {}, "libjpeg": None,
            "cli_error": done.stderr.strip()[-500:]}


def probe(device: str) -> dict[str, Any]:
    """Everything the first lines say, as the record keeps it."""
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cores": cores(), "cpu": _cpu_model(),
            "memory_gib": _meminfo_gib(), "gpu": gpu_info() if device == "cuda" else None,
            **imgprep_info(), "imgprep": wheel.origin(), "optional": optional_packages()}


def lines(m: dict[str, Any]) -> list[str]:
    """What the kit found, a line a subject."""
    gpu = m["gpu"]
    out = [f"GPU: {gpu['name']}, {gpu['memory_gib']} GiB, compute {gpu['capability']}, "
           f"bf16 {'yes' if gpu['bf16'] else 'no'}, {gpu['count']} visible" if gpu else
           "GPU: none used (the CPU form)",
           f"torch {m['torch']}, CUDA {m['cuda'] or 'none'}"
           + (f", cuDNN {gpu['cudnn']}, NCCL {gpu['nccl']}" if gpu else "")
           + f"; Python {m['python']}"]
    pil = m["pil"]
    out.append(f"PIL {pil['pil_version']}: "
               + ("pillow-simd" if pil["pillow_simd"] else "stock Pillow, not pillow-simd")
               + f"; libjpeg-turbo {'yes' if pil['libjpeg_turbo'] else 'no'}; "
               f"crop-aware decoder {pil['crop_decode']}")
    out.append(f"{m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB memory")
    missing = [name for name, found in m["optional"].items() if not found]
    out.append("optional packages missing: " + (", ".join(missing) or "none"))
    lib = m.get("libjpeg")
    out.append(wheel.line(m["imgprep"])
               + (f"; the decoder's extension: {lib['extension']}" if lib else ""))
    if "cli_error" in m:
        out.append(f"python -m imgprep info failed: {m['cli_error']}")
    return out


def dali_problem() -> str | None:
    """Why the dali check cannot run (None: nvidia.dali imports, tried in a child process
    so that this one stays free of DALI until its check)."""
    if not optional_packages()["nvidia.dali"]:
        return "nvidia.dali is not installed (pip install 'imgprep[dali]')"
    done = subprocess.run([sys.executable, "-c", "import nvidia.dali"], capture_output=True,
                          text=True, timeout=120, env=child_env())
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"nvidia.dali does not import: {last}"
    return None


def torchvision_problem() -> str | None:
    """Why the nvjpeg backend cannot decode on a GPU here (None: ``torchvision.io`` imports,
    tried in a child process: a torchvision built for another torch fails on import)."""
    if not optional_packages()["torchvision"]:
        return "torchvision is not installed (pip install --no-deps torchvision==<the " \
               "release made for this torch>)"
    done = subprocess.run([sys.executable, "-c", "import torchvision.io"], capture_output=True,
                          text=True, timeout=120, env=child_env())
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"torchvision does not import: {last}"
    return None


def unavailable(device: str, wanted: list[str]) -> dict[str, str]:
    """The checks of ``wanted`` that cannot run here, each with why."""
    import torch.distributed as dist

    out: dict[str, str] = {}
    if "nccl" in wanted and not dist.is_available():
        out["nccl"] = "torch.distributed is not available in this torch build"
    elif "nccl" in wanted and device == "cuda" and not dist.is_nccl_available():
        out["nccl"] = "this torch build has no NCCL"
    if "dali" in wanted and (why := dali_problem()) is not None:
        out["dali"] = why
    gpu_decode = [n for n in ("nvjpeg", "nvjpeg_trainer") if n in wanted]
    if gpu_decode and device == "cuda" and (why := torchvision_problem()) is not None:
        out.update(dict.fromkeys(gpu_decode, why))  # the CPU form decodes with Pillow
    return out
