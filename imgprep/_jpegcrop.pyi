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
def resize(src: Buffer, width: int, height: int, stride: int, channels: int,
           box: tuple[float, float, float, float], out_width: int, out_height: int,
           window: tuple[int, int, int, int], out: Buffer, filter: int, flip: bool,
           planar: bool, kernel: int, /) -> None: ...
def resample_kernel(kernel: int, /) -> str: ...
