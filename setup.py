"""The optional C extension: crop-aware JPEG decoding (``imgprep.jpegcrop``) and the
resampler (``imgprep.resample``, imgprep/csrc/).

Built for the stable ABI (Python 3.11 and later share one build) against the system's
libjpeg(-turbo), the one pillow-simd links. The install never fails for it: without a
compiler or the libjpeg headers the extension is left out and every image takes the Pillow
path (``imgprep info`` says which). ``-ffp-contract=off``: no fused multiply-add in the
resampler's weights, so they are the same numbers on every CPU (imgprep/csrc/resample.h);
its AVX2 and AVX-512 kernels are compiled by target attributes, with no flags of their own.
"""

import sys
from pathlib import Path

from setuptools import Extension, setup

LIMITED = sys.version_info >= (3, 11)  # the buffer protocol joined the stable ABI in 3.11
RESAMPLER = [f"imgprep/csrc/resample{part}.c" for part in ("", "_avx2", "_avx512", "_py")]
# The convert path (decode, resample, encode in one call): imgprep/csrc/.
CONVERT_SOURCES = [f"imgprep/csrc/{name}.c"
                   for name in ("jerr", "encode", "orient", "jpegdec", "convert", "bindings")]
HEADERS = sorted(str(p) for p in Path("imgprep/csrc").glob("*.h"))

setup(
    ext_modules=[Extension("imgprep._jpegcrop", ["imgprep/_jpegcrop.c", *RESAMPLER,
                                                   *CONVERT_SOURCES],
                           depends=HEADERS, libraries=["jpeg"],
                           extra_compile_args=["-O3", "-ffp-contract=off"],
                           py_limited_api=True, optional=True)] if LIMITED else [],
    options={"bdist_wheel": {"py_limited_api": "cp311"}} if LIMITED else {},
)
