"""The optional C extension: crop-aware JPEG decoding (``imgprep.jpegcrop``) and the
resampler (``imgprep.resample``, imgprep/csrc/).

Built for the stable ABI (Python 3.11 and later share one build) against the system's
libjpeg(-turbo), the one pillow-simd links. A user's install never fails for it: without a
compiler or the libjpeg headers the extension is left out and every image takes the Pillow
path (``imgprep info`` says which). ``-ffp-contract=off``: no fused multiply-add in the
resampler's weights, so they are the same numbers on every CPU (imgprep/csrc/resample.h);
its AVX2 and AVX-512 kernels are compiled by target attributes, with no flags of their own.

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

RESAMPLER = [f"imgprep/csrc/resample{part}.c" for part in ("", "_avx2", "_avx512", "_py")]
HEADERS = ["imgprep/csrc/resample.h", "imgprep/csrc/resample_impl.h"]
DETERMINISM = ["-ffp-contract=off"]  # the resampler's weights: the same numbers on every CPU
compile_args = ["-O1", "-g", *DETERMINISM, *WARNINGS, *SANITIZERS] if SANITIZE else \
    ["-O3", *DETERMINISM, *WARNINGS] if STRICT else ["-O3", *DETERMINISM]

setup(
    ext_modules=[Extension("imgprep._jpegcrop", ["imgprep/_jpegcrop.c", *RESAMPLER],
                           depends=HEADERS, libraries=["jpeg"],
                           extra_compile_args=compile_args,
                           extra_link_args=SANITIZERS if SANITIZE else [],
                           py_limited_api=True, optional=not STRICT)] if LIMITED else [],
    options={"bdist_wheel": {"py_limited_api": "cp311"}} if LIMITED else {},
)
