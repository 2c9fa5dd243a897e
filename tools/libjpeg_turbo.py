"""Build the libjpeg-turbo the wheel links in (``IMGPREP_LIBJPEG=DIR``, setup.py) from Debian's
source package of the libjpeg-turbo installed here, Debian's patches applied: static,
position-independent, SIMD required.

    python tools/libjpeg_turbo.py build/libjpeg-turbo      # make setup and make wheel run it

It writes ``DIR/lib/libjpeg.a``, ``DIR/include/`` (jpeglib.h, jconfig.h, jmorecfg.h, jerror.h:
the headers of that build, so the version the extension reports is the code it runs; and
imgprep_backports.h, a macro for each backport below) and ``DIR/licenses/`` (LICENSE.md;
README.ijg, whose LEGAL ISSUES the IJG licence asks to ship with the library; Debian's
copyright file), working in ``DIR-src/`` (apt's lists, the source, the cmake build).

On top of Debian's patches, the fixes of later libjpeg-turbo releases that the extension's
partial decoding needs (``BACKPORTS``): each replaces one exact passage, is skipped where the
source already has it, and stops the build where the passage is neither (another release).

Why not Debian's own ``libjpeg.a``: it is compiled for executables (``-fPIE``: PC-relative
references to libc's data, which a shared object cannot hold), so the linker refuses it in
the extension. The source comes from the machine's own apt sources, read as ``deb-src``
through a private list in ``DIR-src`` (the system's apt configuration is left as it is), and
apt checks it against the archive's signed index. cmake, nasm (libjpeg-turbo's SIMD kernels
are assembly) and dpkg-dev are installed with apt-get when missing (as root). Standard library
only: it runs before the virtualenv exists. Exit 1, saying what is missing, when it cannot.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TOOLS = {"cmake": "cmake", "nasm": "nasm", "dpkg-source": "dpkg-dev", "cc": "gcc"}
HEADERS = {"jpeglib.h": "src", "jerror.h": "src", "jmorecfg.h": "src", "jconfig.h": "obj"}
LICENSES = {"LICENSE.md": "LICENSE.md", "README.ijg": "README.ijg",
            "debian/copyright": "copyright"}
CMAKE = ["-DCMAKE_BUILD_TYPE=Release", "-DENABLE_SHARED=OFF", "-DENABLE_STATIC=ON",
         "-DWITH_TURBOJPEG=OFF", "-DCMAKE_POSITION_INDEPENDENT_CODE=ON", "-DWITH_SIMD=ON",
         "-DREQUIRE_SIMD=ON"]
APT_SOURCES = Path("/etc/apt")
# (file, the passage as released, the passage as fixed, where the fix comes from, the macro
# that include/imgprep_backports.h defines for it: the extension's decoders read it)
BACKPORTS = [(
    "jdapistd.c",
    """      (JDIMENSION)jdiv_round_up((long)(cinfo->output_width *
                                       compptr->h_samp_factor),
                                (long)cinfo->max_h_samp_factor);""",
    """      (JDIMENSION)jdiv_round_up((long)cinfo->output_width *
                                (long)(compptr->h_samp_factor *
                                       compptr->DCT_scaled_size),
                                (long)(cinfo->max_h_samp_factor *
                                       cinfo->min_DCT_scaled_size));""",
    "libjpeg-turbo 3.0.0 (commit 3a53627): jpeg_crop_scanline() miscalculated the downsampled "
    "width of 4x2- and 2x4-subsampled components when scaling, leaving them part-upsampled "
    "(the colour converter then read uninitialised memory)",
    "IMGPREP_BACKPORT_CROP_SCANLINE",
)]


class Refused(Exception):
    """The library cannot be built here; the message says why and what to do."""


def run(argv: list[str], cwd: Path | None = None, timeout: float = 600) -> str:
    """A command's stdout; Refused with the end of its stderr when it fails."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env=env, check=True)
    except subprocess.CalledProcessError as e:
        raise Refused(f"`{' '.join(argv)}` failed: {(e.stderr or e.stdout).strip()[-600:]}"
                      ) from e
    except (OSError, subprocess.SubprocessError) as e:
        raise Refused(f"`{' '.join(argv)}` failed: {e}") from e
    return done.stdout


def ensure_tools() -> None:
    """cmake, nasm, dpkg-source and a C compiler, installed with apt-get when missing."""
    absent = sorted({pkg for prog, pkg in TOOLS.items() if shutil.which(prog) is None})
    if not absent:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Refused(f"{', '.join(absent)} not installed: apt-get install {' '.join(absent)}")
    print(f"libjpeg_turbo: apt-get install {' '.join(absent)}", flush=True)
    run(["apt-get", "update", "-qq"])
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *absent])


def as_deb_src(text: str) -> str:
    """An apt sources file (one-line or deb822) with its ``deb`` entries as ``deb-src``."""
    text = re.sub(r"^(\s*)deb(\s)", r"\1deb-src\2", text, flags=re.M)
    return re.sub(r"^Types:.*\bdeb\b.*$", "Types: deb-src", text, flags=re.M)


def apt_options(work: Path) -> list[str]:
    """apt-get options that read only the private deb-src list in ``work``."""
    parts = work / "apt" / "sources.list.d"
    lists = work / "apt" / "lists"
    for d in (parts, lists / "partial", work / "apt" / "cache" / "archives" / "partial"):
        d.mkdir(parents=True, exist_ok=True)
    files = [APT_SOURCES / "sources.list", *sorted((APT_SOURCES / "sources.list.d").glob("*"))]
    for f in files:
        if f.is_file() and f.suffix in (".list", ".sources"):
            (parts / f.name).write_text(as_deb_src(f.read_text()))
    return ["-o", "Dir::Etc::SourceList=/dev/null", "-o", f"Dir::Etc::SourceParts={parts}",
            "-o", f"Dir::State::Lists={lists}", "-o", f"Dir::Cache={work / 'apt' / 'cache'}"]


def installed_version() -> str | None:
    """The source version of the libjpeg-turbo installed here (Debian's 1:2.1.5-2), if any."""
    try:
        out = run(["dpkg-query", "-W", "-f", "${source:Package} ${source:Version}\\n",
                   "libjpeg*-turbo*"])
    except Refused:
        return None
    found = [line.split()[1] for line in out.splitlines()
             if line.startswith("libjpeg-turbo ") and len(line.split()) == 2]
    return found[0] if found else None


def fetch(work: Path) -> Path:
    """Debian's libjpeg-turbo source, unpacked with its patches applied; its folder."""
    opts = apt_options(work)
    run(["apt-get", *opts, "-qq", "update"])
    version = installed_version()
    dl = work / "download"
    shutil.rmtree(dl, ignore_errors=True)
    dl.mkdir()
    wanted = [f"libjpeg-turbo={version}"] if version else []
    for spec in (*wanted, "libjpeg-turbo"):
        try:
            run(["apt-get", *opts, "-qq", "source", "--download-only", spec], cwd=dl)
            break
        except Refused as e:
            if spec == "libjpeg-turbo":
                raise Refused(f"{e}; apt has no libjpeg-turbo source (docs/install.md says "
                              "how to build it by hand)") from e
            print(f"libjpeg_turbo: {spec} is not in the archive; taking its current version",
                  flush=True)
    (dsc,) = dl.glob("*.dsc")
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    run(["dpkg-source", "--no-check", "-x", str(dsc), str(src)])
    return src


def backport(src: Path) -> None:
    """Apply ``BACKPORTS`` to the unpacked source ``src``."""
    for name, released, fixed, origin, _ in BACKPORTS:
        path = src / name
        text = path.read_text()
        if fixed in text:
            continue
        if text.count(released) != 1:
            raise Refused(f"{name} holds neither the released nor the fixed passage of "
                          f"{origin.split(':')[0]}: another libjpeg-turbo release; check it "
                          "for that fix and update BACKPORTS")
        path.write_text(text.replace(released, fixed))
        print(f"libjpeg_turbo: {name}: backported {origin}", flush=True)


def build(src: Path, work: Path) -> Path:
    """The static library built from ``src``; the build folder."""
    obj = work / "obj"
    shutil.rmtree(obj, ignore_errors=True)
    run(["cmake", "-S", str(src), "-B", str(obj), *CMAKE])
    jobs = str(max(1, len(os.sched_getaffinity(0))))
    run(["cmake", "--build", str(obj), "--target", "jpeg-static", "-j", jobs], timeout=1800)
    return obj


def assemble(src: Path, obj: Path, out: Path) -> str:
    """``out``'s lib/, include/ and licenses/ from the build; libjpeg-turbo's version."""
    shutil.rmtree(out, ignore_errors=True)
    for sub in ("lib", "include", "licenses"):
        (out / sub).mkdir(parents=True)
    shutil.copyfile(obj / "libjpeg.a", out / "lib" / "libjpeg.a")
    for name, where in HEADERS.items():
        shutil.copyfile((src if where == "src" else obj) / name, out / "include" / name)
    (out / "include" / "imgprep_backports.h").write_text(
        "/* The fixes tools/libjpeg_turbo.py backported into this libjpeg-turbo. */\n"
        + "".join(f"#define {macro} 1\n" for *_, macro in BACKPORTS))
    for name, dest in LICENSES.items():
        shutil.copyfile(src / name, out / "licenses" / dest)
    m = re.search(r"#define\s+LIBJPEG_TURBO_VERSION\s+(\S+)",
                  (out / "include" / "jconfig.h").read_text())
    return m.group(1) if m else "unknown"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tools/libjpeg_turbo.py DIR", file=sys.stderr)
        return 2
    out = Path(argv[0]).resolve()
    work = out.with_name(out.name + "-src")
    work.mkdir(parents=True, exist_ok=True)
    try:
        ensure_tools()
        src = fetch(work)
        backport(src)
        version = assemble(src, build(src, work), out)
    except Refused as e:
        print(f"libjpeg_turbo: error: {e}", file=sys.stderr)
        return 1
    dsc = next((work / "download").glob("*.dsc")).name
    print(f"libjpeg_turbo: {argv[0]}: libjpeg-turbo {version} (Debian's {dsc}), static, "
          "position-independent, SIMD")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
