"""The C extension ``imgprep._jpegcrop``: crop-aware JPEG decoding (``imgprep.jpegcrop``) and
the resampler (``imgprep.resample``), from ``imgprep/_jpegcrop.c`` and ``imgprep/csrc/*.c``.

Built for the stable ABI (one build serves Python 3.11 and later). ``-ffp-contract=off``: no
fused multiply-add in the resampler's weights, so they are the same numbers on every CPU
(imgprep/csrc/resample.h); its AVX2 and AVX-512 kernels are compiled by target attributes,
with no flags of their own. Which libjpeg-turbo it runs on:

- ``IMGPREP_LIBJPEG`` unset (a source install): the system's shared libjpeg (``-ljpeg``, with
  the headers of libjpeg-dev). The install never fails for the extension: without a compiler
  or the headers it is left out, every image takes the Pillow path, and ``imgprep info`` says
  so in one line.
- ``IMGPREP_LIBJPEG=DIR`` (``make wheel``, ``make setup``): the static libjpeg-turbo in
  ``DIR/lib/libjpeg.a`` (headers in ``DIR/include``) linked into the extension, its symbols
  kept local so that it never meets the libjpeg PIL loads, and the files of
  ``DIR/licenses`` put into the wheel (``imgprep/licenses/libjpeg-turbo/``). The extension is
  then required: a build that asked for the bundled library fails rather than leave it out.
  ``tools/libjpeg_turbo.py`` makes DIR; docs/install.md says how to make one elsewhere.

Two environment variables make the development builds (``make ext``, which ``make lint`` and
``make test`` run; docs/development.md):

- ``IMGPREP_STRICT_BUILD=1``: ``-Wall -Wextra -Werror``, and a failed build is an error
  instead of a left-out extension;
- ``IMGPREP_SANITIZE=1``: strict, plus AddressSanitizer and UBSan (``-fsanitize=address,
  undefined -fno-sanitize-recover=all``), for the fuzz run (``harness.fuzz.sanitize``),
  which builds it into a folder of its own and loads it with libasan preloaded.
"""

import os
import shutil
import sys
from glob import glob
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCES = ["imgprep/_jpegcrop.c", *sorted(glob("imgprep/csrc/*.c"))]
HEADERS = sorted(glob("imgprep/csrc/*.h"))
LICENSES = "imgprep/licenses/libjpeg-turbo"  # where the bundled library's licences go


def bundled_libjpeg() -> Path | None:
    """``IMGPREP_LIBJPEG``'s folder, checked; None when unset (link the system's)."""
    value = os.environ.get("IMGPREP_LIBJPEG")
    if not value:
        return None
    prefix = Path(value).resolve()
    needs = [prefix / "lib" / "libjpeg.a", prefix / "include" / "jpeglib.h",
             prefix / "licenses"]
    missing = [str(p) for p in needs if not p.exists()]
    if missing or not any((prefix / "licenses").iterdir()):
        raise SystemExit(f"IMGPREP_LIBJPEG={value}: missing {', '.join(missing) or 'licence files'}"
                         "; make it with `python tools/libjpeg_turbo.py DIR` (docs/install.md)")
    return prefix


def link_options(prefix: Path | None) -> dict:
    """How the extension links libjpeg: the system's shared library, or ``prefix``'s static
    one inside it."""
    if prefix is None:
        return {"libraries": ["jpeg"], "optional": True}
    return {"include_dirs": [str(prefix / "include")],
            "extra_objects": [str(prefix / "lib" / "libjpeg.a")],
            "extra_link_args": ["-Wl,--exclude-libs,ALL"],
            "define_macros": [("IMGPREP_LIBJPEG_LINKED_IN", "1")], "optional": False}


class BuildExt(build_ext):
    """``build_ext`` that also puts a bundled libjpeg-turbo's licence files into the build
    (so into the wheel), beside the extension that carries the library."""

    def run(self) -> None:
        super().run()
        prefix = bundled_libjpeg()
        if prefix is not None and not self.inplace:
            dest = Path(self.build_lib, LICENSES)
            dest.mkdir(parents=True, exist_ok=True)
            for f in sorted((prefix / "licenses").iterdir()):
                shutil.copyfile(f, dest / f.name)

LIMITED = sys.version_info >= (3, 11)  # the buffer protocol joined the stable ABI in 3.11
SANITIZE = os.environ.get("IMGPREP_SANITIZE") == "1"
STRICT = SANITIZE or os.environ.get("IMGPREP_STRICT_BUILD") == "1"
WARNINGS = ["-Wall", "-Wextra", "-Werror"]
SANITIZERS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
              "-fno-omit-frame-pointer"]
DETERMINISM = ["-ffp-contract=off"]  # the resampler's weights: the same numbers on every CPU
COMPILE_ARGS = ["-O1", "-g", *DETERMINISM, *WARNINGS, *SANITIZERS] if SANITIZE else \
    ["-O3", *DETERMINISM, *WARNINGS] if STRICT else ["-O3", *DETERMINISM]


def extension() -> Extension:
    """The one extension: its sources, flags and libjpeg linking; strict builds are required."""
    options = link_options(bundled_libjpeg())
    options["optional"] = options["optional"] and not STRICT
    options["extra_link_args"] = [*options.get("extra_link_args", []),
                                  *(SANITIZERS if SANITIZE else [])]
    return Extension("imgprep._jpegcrop", SOURCES, depends=HEADERS,
                     extra_compile_args=COMPILE_ARGS, py_limited_api=True, **options)


setup(
    ext_modules=[extension()] if LIMITED else [],
    cmdclass={"build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp311"}} if LIMITED else {},
)
