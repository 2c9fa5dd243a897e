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
from imgprep.sections import TransformOptions

TRANSFORMS = {  # each version in a few words, for messages
    pillowpath.VERSION: "Pillow's decode, resample and JPEG encoder",
    native.VERSION: "imgprep's C path over libjpeg-turbo",
}


def transform_version() -> int:
    """The transform version this environment converts with: 2 where the C extension is
    built, else 1."""
    return native.VERSION if native.AVAILABLE else pillowpath.VERSION


def describe_transform(version: int) -> str:
    """``version`` and what it is, for messages."""
    return f"transform version {version} ({TRANSFORMS.get(version, 'unknown to this imgprep')})"


def convert_image(data: bytes, opts: TransformOptions, *, crop_decode: bool = True,
                  histogram: bool = False, pixels: bool = False) -> Converted:
    """``data`` cropped/resized to ``opts.size`` and encoded as an RGB JPEG by this
    environment's transform version (``transform_version()``); ``histogram`` and ``pixels``
    ask for the output's level counts and pixels too. ``crop_decode=False`` decodes whole
    images where a region would do (the bytes are the same either way). Raises ImageError
    for what cannot be converted."""
    if native.AVAILABLE:
        return native.convert_native(data, opts, crop_decode=crop_decode,
                                     histogram=histogram, pixels=pixels)
    return pillowpath.convert_pillow(data, opts, histogram=histogram, pixels=pixels)
