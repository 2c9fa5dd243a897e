"""Types of the optional C extension (imgprep/_jpegcrop.c, imgprep/csrc/); see
imgprep.jpegcrop and imgprep.resample."""

from typing import Any, Literal, overload

Buffer = Any  # any object with the buffer protocol

LIBJPEG_VERSION: int
LIBJPEG_TURBO_VERSION: int
LIBJPEG_LINKED_IN: int
Report = dict[str, Any]  # warnings, first, eof, hit_marker, padding, trailing, error

@overload
def probe(data: Buffer, check: Literal[False] = ..., /) -> tuple[int, int, int, None]: ...
@overload
def probe(data: Buffer, check: Literal[True], /) -> tuple[int, int, int, Report]: ...
def decode(data: Buffer, frame: Buffer, scale: int, x0: int, y0: int, x1: int, y1: int,
           whole: bool = ..., /) -> tuple[int, int, int, int, Report]: ...
def simd() -> int: ...
def pack(src: object, src_width: int, x0: int, y0: int, width: int, height: int, out: Buffer,
         flip: bool, planar: bool, /) -> None: ...
def encode(pixels: Buffer, width: int, height: int, channels: int, quality: int,
           sampling: tuple[int, ...] = (), /) -> bytes: ...
def resize(src: Buffer, width: int, height: int, stride: int, channels: int,
           box: tuple[float, float, float, float], out_width: int, out_height: int,
           window: tuple[int, int, int, int], out: Buffer, filter: int, flip: bool,
           planar: bool, kernel: int, part: tuple[int, int, int, int] = ..., /) -> None: ...
def resample_kernel(kernel: int, /) -> str: ...
# convert's path (imgprep/csrc/bindings.c): (status, message, jpeg, width, height, components,
# mpf, path, levels, rgb, out_width, out_height, scan)
def convert(data: Buffer, size: int, resize: int, filter: int, quality: int,
            exif_transpose: bool, whole: bool, histogram: bool, pixels: bool, max_pixels: int,
            bomb_pixels: int, /) -> tuple[Any, ...]: ...
def finish(rgb: Buffer, width: int, height: int, orig_width: int, orig_height: int, size: int,
           resize: int, filter: int, quality: int, histogram: bool, pixels: bool,
           max_pixels: int, /) -> tuple[Any, ...]: ...
def frame(data: Buffer, size: int, resize: int, filter: int, max_pixels: int,
          exif_transpose: bool, whole: bool, bomb_pixels: int, /) -> tuple[Any, ...]: ...
# the loader's one call a sample (imgprep/csrc/sample_py.c): (status, path, message, scan)
def sample(data: Buffer, width: int, height: int, draft: tuple[int, int],
           resize: tuple[int, int], box: tuple[float, float, float, float] | None,
           crop: tuple[int, int, int, int], flip: bool, planar: bool, whole: bool,
           max_pixels: int, out: Buffer, /) -> tuple[int, int, str, Report | None]: ...
