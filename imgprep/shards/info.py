"""What is installed and how fast it can be: PIL flavour, libjpeg-turbo, SIMD build, versions."""

from __future__ import annotations

import importlib.metadata as md
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from imgprep import __version__
from imgprep.shards.manifest import read_manifest


def _dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _avx2_build(so_path: str) -> bool | None:
    """Whether PIL's core was compiled with AVX2 (counts ymm instructions); None if unknown."""
    objdump = shutil.which("objdump")
    if objdump is None:
        return None
    try:
        out = subprocess.run([objdump, "-d", "--no-show-raw-insn", so_path], capture_output=True,
                             text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.count("%ymm") > 200


def pil_info(check_avx2: bool = True) -> dict[str, Any]:
    """Which PIL is imported, and whether it is the fast one (pillow-simd + libjpeg-turbo)."""
    import PIL
    import PIL._imaging as core
    from PIL import features

    simd = _dist_version("pillow-simd")
    stock = _dist_version("pillow")
    info: dict[str, Any] = {
        "pil_version": PIL.__version__,
        "pillow_simd": simd is not None and simd == PIL.__version__,
        "stock_pillow_installed": stock,
        "libjpeg_turbo": bool(features.check_feature("libjpeg_turbo")),
        "jpeg_version": features.version("jpg"),
        "core": core.__file__,
        "cpu_avx2": "avx2" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists()
        else None,
    }
    if check_avx2 and core.__file__:
        info["avx2_build"] = _avx2_build(core.__file__)
    return info


def pil_warning(info: dict[str, Any]) -> str | None:
    """One line saying why decoding will be slow, or None when PIL is pillow-simd."""
    if not info["pillow_simd"]:
        extra = " (stock Pillow is installed and replaced it)" if info["stock_pillow_installed"] \
            else ""
        return (f"PIL {info['pil_version']} is not pillow-simd{extra}: convert and loaders run "
                "~2x slower; reinstall with `make setup` (builds pillow-simd with AVX2)")
    if info.get("avx2_build") is False:
        return "pillow-simd was built without AVX2; rebuild with CC='cc -mavx2' (make setup)"
    if not info["libjpeg_turbo"]:
        return "PIL is not linked against libjpeg-turbo: JPEG decoding will be slow"
    return None


def versions() -> dict[str, Any]:
    return {
        "imgprep": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        **{name: _dist_version(name) for name in ("numpy", "torch", "webdataset", "tqdm", "click")},
    }


def manifest_summaries(path: Path, split: str | None = None) -> list[dict[str, Any]]:
    """What ``imgprep info`` shows of each manifest in ``path`` (a manifest or a folder)."""
    from imgprep.shards.verify import folder_manifests  # names what a folder without one is

    paths = [path] if path.is_file() else folder_manifests(path, split, "info")[0]
    out = []
    for p in paths:
        m = read_manifest(p)
        out.append({
            "path": str(p), "split": m.split, "format": m.format, "samples": m.total_samples,
            "shards": len(m.shards), "bytes": m.total_bytes, "classes": len(m.classes),
            "errors": m.errors, "mean": m.mean, "std": m.std, "tool_version": m.tool_version,
            "options": m.options, "index": m.index is not None,
        })
    return out
