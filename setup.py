"""The optional C extension: crop-aware JPEG decoding (``imgprep.jpegcrop``).

Built for the stable ABI (Python 3.11 and later share one build) against the system's
libjpeg(-turbo), the one pillow-simd links. A user's install never fails for it: without a
compiler or the libjpeg headers the extension is left out and every image takes the Pillow
path (``imgprep info`` says which).

Two environment variables make the development builds (``make ext``, which ``make lint`` and
``make test`` run; docs/development.md):

- ``IMGPREP_STRICT_BUILD=1``: ``-Wall -Wextra -Werror``, and a failed build is an error
  instead of a left-out extension;
- ``IMGPREP_SANITIZE=1``: strict, plus AddressSanitizer and UBSan (``-fsanitize=address,
  undefined -fno-sanitize-recover=all``), for the fuzz run (``harness.fuzz.sanitize``),
  which builds it into a folder of its own and loads it with libasan preloaded.
"""

import os
import sys

from setuptools import Extension, setup

LIMITED = sys.version_info >= (3, 11)  # the buffer protocol joined the stable ABI in 3.11
SANITIZE = os.environ.get("IMGPREP_SANITIZE") == "1"
STRICT = SANITIZE or os.environ.get("IMGPREP_STRICT_BUILD") == "1"
WARNINGS = ["-Wall", "-Wextra", "-Werror"]
SANITIZERS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
              "-fno-omit-frame-pointer"]

compile_args = ["-O1", "-g", *WARNINGS, *SANITIZERS] if SANITIZE else \
    ["-O3", *WARNINGS] if STRICT else ["-O3"]

setup(
    ext_modules=[Extension("imgprep._jpegcrop", ["imgprep/_jpegcrop.c"], libraries=["jpeg"],
                           extra_compile_args=compile_args,
                           extra_link_args=SANITIZERS if SANITIZE else [],
                           py_limited_api=True, optional=not STRICT)] if LIMITED else [],
    options={"bdist_wheel": {"py_limited_api": "cp311"}} if LIMITED else {},
)
