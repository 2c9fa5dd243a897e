"""Types of the optional C extension (imgprep/_jpegcrop.c); see imgprep.jpegcrop."""

from typing import Any as Buffer  # any object with the buffer protocol

LIBJPEG_VERSION: int
LIBJPEG_TURBO_VERSION: int
LIBJPEG_LINKED_IN: int

def simd() -> int: ...
def probe(data: Buffer, /) -> tuple[int, int, int]: ...
def decode(data: Buffer, frame: Buffer, scale: int, x0: int, y0: int, x1: int, y1: int, /
           ) -> tuple[int, int, int, int, int]: ...
def pack(src: object, src_width: int, x0: int, y0: int, width: int, height: int, out: Buffer,
         flip: bool, planar: bool, /) -> None: ...
