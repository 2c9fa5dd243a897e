"""The optional C extension: crop-aware JPEG decoding (``imgprep.jpegcrop``).

Built for the stable ABI (Python 3.11 and later share one build) against the system's
libjpeg(-turbo), the one pillow-simd links. The install never fails for it: without a
compiler or the libjpeg headers the extension is left out and every image takes the Pillow
path (``imgprep info`` says which).
"""

import sys
from pathlib import Path

from setuptools import Extension, setup

# The convert path (decode, resample, encode in one call): imgprep/csrc/.
CONVERT_SOURCES = [f"imgprep/csrc/{name}.c" for name in ("jerr", "encode", "bindings")]
CONVERT_HEADERS = sorted(str(p) for p in Path("imgprep/csrc").glob("*.h"))
LIMITED = sys.version_info >= (3, 11)  # the buffer protocol joined the stable ABI in 3.11

setup(
    ext_modules=[Extension("imgprep._jpegcrop", ["imgprep/_jpegcrop.c", *CONVERT_SOURCES],
                           depends=CONVERT_HEADERS, libraries=["jpeg"],
                           extra_compile_args=["-O3"], py_limited_api=True,
                           optional=True)] if LIMITED else [],
    options={"bdist_wheel": {"py_limited_api": "cp311"}} if LIMITED else {},
)
