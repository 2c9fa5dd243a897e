"""One image in, one RGB JPEG out: what ``imgprep convert`` does to every image.

Two transform versions, recorded in the manifest (a folder never mixes them):

- 2, where the C extension is built: ``native``, imgprep's own decode, resample and encode
  over libjpeg-turbo, one call an image with the GIL released; Pillow decodes only what
  libjpeg-turbo cannot (CMYK, PNG and the other formats), and the same resampler and encoder
  finish those.
- 1, without it: ``pillowpath.convert_pillow``, Pillow throughout, as convert wrote before
  its own C path.

Either way the output is a pure function of the bytes and ``TransformOptions``: the same on
every run, worker count and rank layout.
"""

from __future__ import annotations

from imgprep.convert import native, pillowpath
from imgprep.convert.converted import Converted
from imgprep.convert.options import TransformOptions

TRANSFORM_VERSION = native.VERSION if native.AVAILABLE else pillowpath.VERSION
TRANSFORMS = {  # each version's one line, for messages and ``imgprep info``
    pillowpath.VERSION: "Pillow's draft decode, resample and JPEG encoder",
    native.VERSION: "imgprep's C path: libjpeg-turbo region decode, fixed-point resampler, "
                    "libjpeg-turbo encoder",
}


def convert_image(data: bytes, opts: TransformOptions, *, crop_decode: bool = True,
                  histogram: bool = False, pixels: bool = False) -> Converted:
    """``data`` cropped/resized to ``opts.size`` and encoded as an RGB JPEG by this
    environment's transform version (``TRANSFORM_VERSION``); ``histogram`` and ``pixels``
    ask for the output's level counts and pixels too. ``crop_decode=False`` decodes whole
    images where a region would do (the bytes are the same either way). Raises ImageError
    for what cannot be converted."""
    if native.AVAILABLE:
        return native.convert_native(data, opts, crop_decode=crop_decode,
                                     histogram=histogram, pixels=pixels)
    return pillowpath.convert_pillow(data, opts, histogram=histogram, pixels=pixels)
