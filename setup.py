"""The C extension ``imgprep._jpegcrop`` (crop-aware JPEG decoding: ``imgprep.jpegcrop``).

Built for the stable ABI (one build serves Python 3.11 and later) from ``SOURCES``. Which
libjpeg-turbo it runs on:

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
"""

import os
import shutil
from glob import glob
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCES = ["imgprep/_jpegcrop.c", *sorted(glob("imgprep/csrc/*.c"))]
HEADERS = sorted(glob("imgprep/csrc/*.h"))
COMPILE_ARGS = ["-O3"]
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


setup(
    ext_modules=[Extension("imgprep._jpegcrop", SOURCES, depends=HEADERS,
                           extra_compile_args=COMPILE_ARGS, py_limited_api=True,
                           **link_options(bundled_libjpeg()))],
    cmdclass={"build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
