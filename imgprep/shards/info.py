"""What is installed and how fast it can be: PIL flavour, libjpeg-turbo, SIMD build, versions;
and what ``imgprep info`` shows of a manifest. Each is a record (``PilInfo``, ``Versions``,
``ManifestSummary`` with its ``FastDecode``; the decoder's ``imgprep.jpegcrop.Library``)
whose ``dataclasses.asdict`` (for ``ManifestSummary``, its ``to_json``) is what
``imgprep info --json`` prints."""

from __future__ import annotations

import importlib.metadata as md
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from imgprep import __version__, jpegcrop, resample
from imgprep.sections import ManifestOptions
from imgprep.shards.manifest import Manifest, read_manifest
from imgprep.shards.tario import iter_samples

PROBED = 256  # images of a shard set ``imgprep info`` probes for the crop-aware decode


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


@dataclass(frozen=True, kw_only=True)
class PilInfo:
    """Which PIL is imported, and what makes it fast or slow."""

    pil_version: str
    pillow_simd: bool  # the imported PIL is pillow-simd
    stock_pillow_installed: str | None  # the version of a stock Pillow installed, if any
    pillow_simd_installed: str | None = None  # of a pillow-simd installed (imported or not)
    libjpeg_turbo: bool
    jpeg_version: str | None
    core: str | None  # the path of PIL's compiled core
    cpu_avx2: bool | None  # this CPU has AVX2; None where /proc/cpuinfo is not readable
    avx2_build: bool | None = None  # the core was compiled with AVX2; None if not checked
    crop_decode: str = ""  # whether the crop-aware JPEG decoder is built (imgprep.jpegcrop)
    resampler: str = ""  # the resampler's kernel here, or why there is none (imgprep.resample)


def pil_info(check_avx2: bool = True) -> PilInfo:
    """Which PIL is imported, and whether it is the fast one (pillow-simd + libjpeg-turbo);
    ``check_avx2``: also disassemble its core to tell whether it was built with AVX2."""
    import PIL
    import PIL._imaging as core
    from PIL import features

    simd = _dist_version("pillow-simd")
    cpuinfo = Path("/proc/cpuinfo")
    return PilInfo(
        pil_version=PIL.__version__,
        pillow_simd=simd is not None and simd == PIL.__version__,
        stock_pillow_installed=_dist_version("pillow"),
        pillow_simd_installed=simd,
        libjpeg_turbo=bool(features.check_feature("libjpeg_turbo")),
        jpeg_version=features.version("jpg"),
        core=core.__file__,
        cpu_avx2="avx2" in cpuinfo.read_text() if cpuinfo.exists() else None,
        avx2_build=_avx2_build(core.__file__) if check_avx2 and core.__file__ else None,
        crop_decode=jpegcrop.status(),
        resampler=resample.status(),
    )


def pil_warning(info: PilInfo, extension: bool | None = None) -> str | None:
    """One line saying why the Pillow-side work will be slow, or None when PIL is pillow-simd.
    Not a failure of ``imgprep info --strict``: where imgprep's extension is built
    (``extension``; default: whether it is here), the loader decodes and resizes in it, and
    only what libjpeg-turbo cannot decode (PNG, CMYK), convert's Pillow path and
    ``crop_decode=False`` run on PIL."""
    if not info.pillow_simd:
        return _not_simd(info, jpegcrop.AVAILABLE and resample.AVAILABLE
                         if extension is None else extension)
    if info.avx2_build is False:
        return "pillow-simd was built without AVX2; rebuild with CC='cc -mavx2' (make setup)"
    if not info.libjpeg_turbo:
        return "PIL is not linked against libjpeg-turbo: its JPEG decoding will be slow"
    return None


def _not_simd(info: PilInfo, extension: bool) -> str:
    """What a PIL that is not pillow-simd costs, true for a wheel's user (stock Pillow, which
    is fine) and for a development environment whose pillow-simd stock Pillow replaced."""
    kind = "stock Pillow" if info.stock_pillow_installed else "not pillow-simd"
    what = f"PIL {info.pil_version} is {kind}"
    if info.pillow_simd_installed and info.stock_pillow_installed:
        what += (f", installed over pillow-simd {info.pillow_simd_installed} (its files "
                 "replaced pillow-simd's)")
    if not extension:
        return (f"{what}: without imgprep's extension the loader decodes and resizes every "
                "image with it, ~2x slower than with pillow-simd (docs/install.md)")
    back = ("to have pillow-simd back, reinstall it (docs/install.md)"
            if info.pillow_simd_installed and info.stock_pillow_installed else
            "pillow-simd is optional (a checkout's `make setup` builds it; docs/install.md)")
    return (f"{what}: fine for the loader, which decodes and resizes JPEGs in imgprep's "
            "extension; only the Pillow-side work (PNG and CMYK images, crop_decode=False) "
            f"runs ~2x slower than on pillow-simd; {back}")


def loader_path() -> str:
    """One line for ``imgprep info``: what decodes and resizes the pillow backend's samples
    (by default, ``crop_decode=None``), and the pixel version its state records."""
    if jpegcrop.AVAILABLE and resample.AVAILABLE:
        lib = jpegcrop.library()
        version = lib.version if lib is not None else "?"
        return (f"imgprep's extension (libjpeg-turbo {version}, the resampler's "
                f"{resample.kernel()} kernel); Pillow decodes only PNG and CMYK; pixel "
                "version imgprep-1")
    return "Pillow's decode and resize (the extension is not built); pixel version pillow"


def resampler_warning() -> str | None:
    """One line when the loader cannot resize in the extension, or None."""
    if resample.AVAILABLE:
        return None
    return f"the resampler is {resample.status()}: the loader resizes with PIL"


def decoder_warning(lib: jpegcrop.Library | None) -> str | None:
    """One line saying why the crop-aware decoder is missing or slow, or None."""
    if lib is None:
        return f"the crop-aware decoder is {jpegcrop.status()}"
    if lib.simd is False:
        return (f"libjpeg-turbo {lib.version} runs without its SIMD kernels ({lib.extension}; "
                "JSIMD_FORCENONE set, or a build without them): install the wheel "
                "(docs/install.md)")
    return None


@dataclass(frozen=True, kw_only=True)
class Versions:
    """The versions of imgprep, Python, the platform and the packages it runs with (None:
    not installed); ``imgprep info`` prints them in this order."""

    imgprep: str
    python: str
    platform: str
    numpy: str | None
    torch: str | None
    webdataset: str | None
    tqdm: str | None
    click: str | None


def versions() -> Versions:
    """What this process runs with."""
    return Versions(
        imgprep=__version__, python=sys.version.split()[0], platform=platform.platform(),
        numpy=_dist_version("numpy"), torch=_dist_version("torch"),
        webdataset=_dist_version("webdataset"), tqdm=_dist_version("tqdm"),
        click=_dist_version("click"))


@dataclass(frozen=True, kw_only=True)
class FastDecode:
    """Of the first ``probed`` images of a shard set's first shard: how many the crop-aware
    decoder takes (``fast``), and why it declines the others (``declined``: reason -> count;
    they take the Pillow path)."""

    probed: int
    fast: int
    declined: dict[str, int]


@dataclass(frozen=True, kw_only=True)
class ManifestSummary:
    """What ``imgprep info`` shows of one manifest; ``fast_decode`` is None for a label list
    or a shard set whose first shard is not there."""

    path: str
    split: str
    format: str
    samples: int
    shards: int
    bytes: int
    classes: int
    errors: int
    expected_images: int | None  # what the split's ground truth listed (None: no such record)
    missing_images: int  # of those, the images the input did not hold, so not converted
    mean: list[float]
    std: list[float]
    tool_version: str
    options: ManifestOptions
    index: bool  # the manifest names a sample index
    transform_version: int  # how the images were made (imgprep.convert.image)
    fast_decode: FastDecode | None

    def to_json(self) -> dict[str, Any]:
        """What ``imgprep info --json`` prints (the options as the manifest holds them; an
        empty ``fast_decode`` where there is none)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["options"] = self.options.to_json()
        d["fast_decode"] = asdict(self.fast_decode) if self.fast_decode is not None else {}
        return d


def manifest_summaries(path: Path, split: str | None = None) -> list[ManifestSummary]:
    """What ``imgprep info`` shows of each manifest in ``path`` (a manifest or a folder)."""
    from imgprep.shards.verify import folder_manifests  # names what a folder without one is

    paths = [path] if path.is_file() else folder_manifests(path, split, "info")[0]
    out = []
    for p in paths:
        m = read_manifest(p)
        out.append(ManifestSummary(
            path=str(p), split=m.split, format=m.format, samples=m.total_samples,
            shards=len(m.shards), bytes=m.total_bytes, classes=len(m.classes),
            errors=m.errors, expected_images=m.source.expected if m.source else None,
            missing_images=m.source.missing if m.source else 0,
            mean=m.mean, std=m.std, tool_version=m.tool_version,
            options=m.options, index=m.index is not None,
            transform_version=m.transform_version, fast_decode=probe_decode(p.parent, m)))
    return out


def probe_decode(folder: Path, m: Manifest, limit: int = PROBED) -> FastDecode | None:
    """Which of the first ``limit`` JPEGs of ``m``'s first shard the crop-aware decoder takes,
    and why it declines the others; None for a label list or a missing first shard. A shard
    set written elsewhere (progressive or CMYK JPEGs) is seen to take the slower path."""
    if m.format != "shards" or not m.shards or not (folder / m.shards[0].name).is_file() \
            or m.options.store.mode in ("yuv420", "rgb"):  # no JPEG to decode
        return None
    declined: dict[str, int] = {}
    probed = fast = 0
    for _, members in iter_samples(folder / m.shards[0].name):
        data = members.get("jpg")
        if data is None:
            continue
        reason = jpegcrop.probe(data).reason
        probed += 1
        fast += reason is None
        if reason is not None:
            declined[reason] = declined.get(reason, 0) + 1
        if probed >= limit:
            break
    return FastDecode(probed=probed, fast=fast, declined=declined)
