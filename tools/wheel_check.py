"""The wheel as a user installs it (``make wheel-check``, which ``make test`` runs): a fresh
virtualenv holding ``torch==2.13.0`` and stock Pillow, the wheel installed into it from its
file, and what the wheel promises checked there.

    python tools/wheel_check.py dist/imgprep-*.whl --sdist dist/imgprep-*.tar.gz \\
        --work build/wheel-check

In order, stopping at the first that fails (exit 1):

1. the wheel: tagged ``cp311-abi3`` and ``manylinux_2_X_x86_64`` with X at most 39 (Ubuntu
   24.04's glibc, the GPU machine's); it holds the extension and libjpeg-turbo's licence
   files, and no C sources;
2. the environment: torch and stock Pillow first, then the wheel (its dependencies from the
   package index or pip's cache); Pillow's version is the same after, and no pillow-simd came;
3. ``ldd`` of the installed extension: no libjpeg (the library is inside it), nothing missing;
4. ``imgprep info --json``: the extension's libjpeg-turbo, bundled, SIMD on; and with
   ``JSIMD_FORCENONE=1`` SIMD off, so the report can fail;
5. a tiny convert (``make-sample``, ``convert``, ``verify``), the trainer's loader over it
   (``scripts/train_imagenet.py``, a few steps of a tiny model, imgprep and loaders from the
   wheel), every image through the crop-aware decoder, whose val crops equal the Pillow
   path's;
   and, where the real ImageNet sample is (``--sample``), each of its JPEGs decoded by the
   extension's libjpeg-turbo and by the installed PIL's: the same pixels;
6. the sdist installed where there is no compiler (``CC=/nonexistent``): it installs, and
   ``imgprep info`` says in one line what it lacks.

Everything runs in ``WORK`` with ``PYTHONPATH`` unset, so only the installed copy is imported.
The virtualenv is made anew each time; torch and Pillow are installed by pip once per set of
pins into ``WORK/stock-DIGEST`` and hard-linked from there into each fresh one (installing
torch takes 25 s to 3 minutes on the 2-core machine, by its load). The transcript,
every command and what it printed (less pip's notes on local index folders this machine's
pip configuration names but lacks), goes to stdout and ``WORK/transcript.txt``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
STOCK = ("torch==2.13.0", "pillow==13.0.0")  # the environment most users train in
GLIBC_MAX = 39  # Ubuntu 24.04 (the GPU machine); a wheel needing newer would not install there
LICENSES = "imgprep/licenses/libjpeg-turbo/"
REPO = Path(__file__).resolve().parents[1]
TRAINER = REPO / "scripts" / "train_imagenet.py"  # a script: its own folder first, no imgprep
SAMPLE = Path(os.environ.get("IMGPREP_SAMPLE_DATA",
                             REPO.parent / "shared" / "data" / "imagenet-sample"))
NOISE = re.compile(r"^WARNING: Location '.*' is ignored: it is neither a file nor a directory\.$")
PILLOW = """import importlib.metadata as m, PIL
names = {d.metadata["Name"].lower() for d in m.distributions()}
print(m.version("pillow"), PIL.__version__, "pillow-simd" in names)
"""
# Every sample through the decoder both ways: the crop-aware path must take each image, and
# its val crops must equal the Pillow path's.
LOADER = """import sys, numpy as np
from pathlib import Path
from imgprep.shards.tario import iter_samples
from loaders import SampleDecoder, TrainTransform, ValTransform
data = Path(sys.argv[1])
blobs = [f["jpg"] for shard in sorted(data.glob("train-*.tar")) for _, f in iter_samples(shard)]
rng, out = np.random.default_rng(0), np.empty((3, 224, 224), np.uint8)
train = SampleDecoder(TrainTransform(), fast=True)
for b in blobs:
    train(b, rng, out)
fast, slow = SampleDecoder(ValTransform(), fast=True), SampleDecoder(ValTransform(), fast=False)
other = np.empty_like(out)
differ = 0
for b in blobs:
    fast(b, rng, out)
    slow(b, rng, other)
    differ += not np.array_equal(out, other)
print(f"decoder: {len(blobs)} images: crop-aware train {train.fast_count}, Pillow "
      f"{train.pillow_count}; val crops differing from the Pillow path's {differ}")
sys.exit(0 if train.fast_count == len(blobs) and fast.fast_count == len(blobs) and not differ
         else 1)
"""

# The extension's libjpeg-turbo against the installed PIL's on real JPEGs: each image decoded
# whole at one DCT scale (1, 1/2, 1/4, 1/8 in turn), the pixels equal.
DECODE = """import sys, numpy as np
from pathlib import Path
from PIL import Image, features
from imgprep import jpegcrop
same = declined = 0
differ = []
files = sorted(Path(sys.argv[1]).glob("*.JPEG"))
for i, f in enumerate(files):
    data, scale = f.read_bytes(), (1, 2, 4, 8)[i % 4]
    p = jpegcrop.probe(data)
    img = None if p.reason else jpegcrop.Frame().decode(
        data, p, scale, (0, 0, -(-p.width // scale), -(-p.height // scale)))[0]
    if img is None:
        declined += 1
        continue
    pil = Image.open(f)
    pil.draft("RGB", (p.width // scale, p.height // scale))
    if np.array_equal(np.asarray(img.convert("RGB")), np.asarray(pil.convert("RGB"))):
        same += 1
    else:
        differ.append(f.name)
print(f"decode: {len(files)} real JPEGs, DCT scales 1-8: the extension's libjpeg-turbo "
      f"{jpegcrop.library().version} and PIL's {features.version('libjpeg_turbo')} give the "
      f"same pixels for {same}, different for {len(differ)} {differ[:5]}; {declined} declined")
sys.exit(1 if differ or not same else 0)
"""


class Failed(Exception):
    """A check that did not hold; the message says which and what was seen."""


class Transcript:
    """Commands and their output, to stdout and a file."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("w")

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.file.write(text + "\n")
        self.file.flush()

    def run(self, argv: list[str], *, cwd: Path, extra: dict[str, str] | None = None,
            show: bool = True, timeout: float = 600) -> str:
        """Run ``argv`` with ``extra`` added to a clean environment; its stdout. What it
        printed goes into the transcript when ``show`` or when it fails (Failed)."""
        prefix = "".join(f"{k}={v} " for k, v in (extra or {}).items())
        self.say(f"$ {prefix}{shlex.join(argv)}")
        done = subprocess.run(argv, cwd=cwd, env=clean_env(**(extra or {})),
                              capture_output=True, text=True, timeout=timeout)
        lines = (done.stdout + done.stderr).strip().splitlines()
        out = "\n".join(line for line in lines if not NOISE.match(line))
        if out and (show or done.returncode):
            self.say(out)
        if done.returncode:
            raise Failed(f"`{shlex.join(argv)}` exited {done.returncode}")
        return done.stdout


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without a virtualenv or a path into the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "JSIMD_FORCENONE")}
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def check_wheel(t: Transcript, wheel: Path) -> str:
    """The wheel's tags and files (1.); its platform tag."""
    m = re.fullmatch(r"imgprep-[^-]+-cp311-abi3-(.+)\.whl", wheel.name)
    tags = m.group(1).split(".") if m else []
    glibc = [int(g) for tag in tags for g in re.findall(r"^manylinux_2_(\d+)_x86_64$", tag)]
    if not glibc or min(glibc) > GLIBC_MAX:
        raise Failed(f"{wheel.name}: not cp311-abi3 manylinux_2_X_x86_64 with X <= {GLIBC_MAX}")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        t.say(f"$ unzip -l {wheel.name}  ({wheel.stat().st_size / 1e3:.0f} kB)")
        t.say("\n".join(f"{i.file_size:>9}  {i.filename}" for i in z.infolist()))
    sources = [n for n in names if n.endswith((".c", ".h"))]
    if not any(n.startswith("imgprep/_jpegcrop.abi3") for n in names) or sources:
        raise Failed(f"{wheel.name}: the extension missing or C sources inside ({sources})")
    if not any(n.startswith(LICENSES) for n in names):
        raise Failed(f"{wheel.name}: no libjpeg-turbo licence files under {LICENSES}")
    return f"manylinux_2_{min(glibc)}"


def pillow_version(t: Transcript, python: Path, work: Path) -> str:
    """The installed Pillow distribution and the PIL it gives, one string; Failed when
    pillow-simd is installed."""
    (work / "pillow_version.py").write_text(PILLOW)
    dist, pil, simd = t.run([str(python), "pillow_version.py"], cwd=work).split()
    if simd == "True":
        raise Failed("pillow-simd is installed in the stock environment")
    return f"{dist} (PIL {pil})"


def stock_site(t: Transcript, work: Path, stock: tuple[str, ...]) -> Path:
    """The site-packages of a virtualenv holding only ``stock``, installed by pip once per set
    of pins and this Python, and kept (``WORK/stock-DIGEST``); what pip would unpack into
    each fresh environment."""
    key = hashlib.sha256("\n".join([sys.version, *stock]).encode()).hexdigest()[:12]
    base = work / f"stock-{key}"
    site = base / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    if (base / ".ready").is_file():
        return site
    shutil.rmtree(base, ignore_errors=True)
    t.run([sys.executable, "-m", "venv", str(base)], cwd=work)
    t.run([str(base / "bin" / "python"), "-m", "pip", "install", "-q", *stock], cwd=work,
          show=False)
    (base / ".ready").write_text("\n".join(stock) + "\n")
    return site


def link_into(src: Path, dest: Path) -> list[str]:
    """What ``src`` (a site-packages) holds and ``dest`` does not, hard-linked file by file
    into ``dest`` (new folders, shared file contents: a file replaced later is replaced in
    ``dest`` alone); the names."""
    added = []
    for entry in sorted(src.iterdir()):
        target = dest / entry.name
        if target.exists():
            continue  # pip, setuptools: the same Python's own, already in the fresh env
        if entry.is_dir():
            shutil.copytree(entry, target, copy_function=os.link)
        else:
            os.link(entry, target)
        added.append(entry.name)
    return added


def install(t: Transcript, work: Path, wheel: Path, stock: tuple[str, ...]) -> Path:
    """A fresh virtualenv with ``stock``, then the wheel (2.); its python."""
    site = stock_site(t, work, stock)
    venv = work / "venv"
    shutil.rmtree(venv, ignore_errors=True)
    t.run([sys.executable, "-m", "venv", str(venv)], cwd=work)
    python = venv / "bin" / "python"
    mine = venv / site.relative_to(site.parents[2])
    added = link_into(site, mine)
    t.say(f"{' '.join(stock)}: as pip installed them in {site.parents[2].name}/, hard-linked "
          f"into the fresh venv ({len(added)} entries)")
    t.run([str(python), "-m", "pip", "list"], cwd=work)
    before = pillow_version(t, python, work)
    t.run([str(python), "-m", "pip", "install", str(wheel.resolve())], cwd=work)
    after = pillow_version(t, python, work)
    t.say(f"Pillow before the install {before}, after {after}")
    if after != before:
        raise Failed(f"installing the wheel changed Pillow: {before} -> {after}")
    return python


def check_extension(t: Transcript, python: Path, work: Path) -> None:
    """``ldd`` (3.) and ``imgprep info`` (4.) of the installed extension."""
    so = t.run([str(python), "-c", "import imgprep._jpegcrop as m; print(m.__file__)"],
               cwd=work).strip()
    ldd = t.run(["ldd", so], cwd=work)
    if "libjpeg" in ldd or "not found" in ldd:
        raise Failed(f"{so} links a system libjpeg or misses a library")
    imgprep = str(python.parent / "imgprep")
    t.run([imgprep, "info"], cwd=work)
    lib = json.loads(t.run([imgprep, "info", "--json"], cwd=work, show=False))["libjpeg"]
    t.say(f"libjpeg: {lib}")
    if not (lib and lib["bundled"] and lib["simd"] is True and lib["version"]):
        raise Failed(f"the installed extension's libjpeg-turbo is not bundled with SIMD on: {lib}")
    off = json.loads(t.run([imgprep, "info", "--json"], cwd=work, show=False,
                           extra={"JSIMD_FORCENONE": "1"}))
    t.say(f"with JSIMD_FORCENONE=1: simd {off['libjpeg']['simd']}; warning: {off['warning']}")
    if off["libjpeg"]["simd"] is not False or not off["warning"]:
        raise Failed("JSIMD_FORCENONE=1 did not show SIMD off: the report cannot fail")


def smoke(t: Transcript, python: Path, work: Path) -> None:
    """A tiny convert and the loader over it (5.)."""
    imgprep = str(python.parent / "imgprep")
    for d in ("raw", "shards"):
        shutil.rmtree(work / d, ignore_errors=True)
    t.run([imgprep, "make-sample", "raw", "--classes", "4", "--per-class", "12", "--val", "4",
           "-q"], cwd=work)
    t.run([imgprep, "convert", "raw/ILSVRC2012_img_train.tar", "-o", "shards", "--shards", "2",
           "--workers", "2"], cwd=work)
    t.run([imgprep, "verify", "shards"], cwd=work)
    info = json.loads(t.run([imgprep, "info", "shards", "--json"], cwd=work, show=False))
    fast = info["manifests"][0]["fast_decode"]
    t.say(f"crop-aware probe of the converted shards: {fast}")
    if fast["fast"] != fast["probed"] or not fast["probed"]:
        raise Failed(f"the crop-aware decoder declines converted images: {fast}")
    t.run([str(python), str(TRAINER), "--data", "shards", "--arch", "tiny", "--image-size",
           "64", "--batch-size", "8", "--workers", "1", "--steps", "4", "--log-every", "2"],
          cwd=work)
    (work / "decoder_paths.py").write_text(LOADER)
    t.run([str(python), "decoder_paths.py", "shards"], cwd=work)


def same_pixels(t: Transcript, python: Path, work: Path, sample: Path) -> None:
    """The decode against the installed PIL's on the real sample (5.), where it is."""
    if not (sample / "images").is_dir():
        t.say(f"decode: no real sample at {sample} (IMGPREP_SAMPLE_DATA): not compared")
        return
    (work / "decode_equal.py").write_text(DECODE)
    t.run([str(python), "decode_equal.py", str(sample / "images")], cwd=work)


def check_sdist(t: Transcript, python: Path, work: Path, sdist: Path) -> None:
    """The sdist where there is no compiler (6.)."""
    target = work / "no-compiler"
    shutil.rmtree(target, ignore_errors=True)
    t.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
           str(sdist.resolve())], cwd=work, extra={"CC": "/nonexistent"}, show=False)
    out = t.run([str(python), "-m", "imgprep", "info"], cwd=work,
                extra={"PYTHONPATH": str(target)})
    line = next((x for x in out.splitlines() if x.startswith("crop decode")), "")
    if "unavailable (" not in line:
        raise Failed(f"without a compiler, imgprep info does not say what is missing: {line!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--sdist", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("build/wheel-check"))
    ap.add_argument("--stock", nargs="+", default=list(STOCK), help="the env's packages")
    ap.add_argument("--sample", type=Path, default=SAMPLE,
                    help="the real ImageNet sample (default: $IMGPREP_SAMPLE_DATA or "
                         "../shared/data/imagenet-sample)")
    args = ap.parse_args(argv)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    t = Transcript(work / "transcript.txt")
    took: dict[str, float] = {}

    def step(name: str, fn: Callable[[], T]) -> T:
        t0 = time.perf_counter()
        out = fn()
        took[name] = time.perf_counter() - t0
        return out

    try:
        tag = step("wheel", lambda: check_wheel(t, args.wheel))
        python = step("environment", lambda: install(t, work, args.wheel, tuple(args.stock)))
        step("extension", lambda: check_extension(t, python, work))
        step("convert and loader", lambda: smoke(t, python, work))
        step("decode", lambda: same_pixels(t, python, work, args.sample))
        step("sdist", lambda: check_sdist(t, python, work, args.sdist))
    except (Failed, subprocess.TimeoutExpired) as e:
        t.say(f"wheel_check: FAILED: {e}")
        return 1
    t.say(f"wheel_check: OK: {args.wheel.name} ({tag}) in a fresh {', '.join(args.stock)} "
          f"environment, {sum(took.values()):.0f} s ("
          + ", ".join(f"{k} {v:.0f} s" for k, v in took.items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
