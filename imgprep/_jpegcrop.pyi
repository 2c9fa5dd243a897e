"""Types of the optional C extension (imgprep/_jpegcrop.c, imgprep/csrc/); see
imgprep.jpegcrop, imgprep.resample and imgprep.augment. Its results are struct sequences
(named tuples, made in imgprep/csrc/results.c); its status codes and limits are the
constants below."""

from typing import Any, Literal, NamedTuple, overload

Buffer = Any  # any object with the buffer protocol

LIBJPEG_VERSION: int
LIBJPEG_TURBO_VERSION: int
LIBJPEG_LINKED_IN: int
CONVERTED: int
DECLINED: int
FAILED: int
PATH_REGION: int
PATH_WHOLE: int
PATH_PIXELS: int
SAMPLE_DONE: int
SAMPLE_DECLINED: int
SAMPLE_FAILED: int
SAMPLE_REFUSED: int
SAMPLE_REGION: int
SAMPLE_WHOLE: int
PROBE_FAST: int
PROBE_PROGRESSIVE: int
PROBE_COLOR: int
PROBE_TAIL: int
PROBE_BROKEN: int
MAX_SIDE: int
BUDGET_MAX_SCANS: int
BUDGET_MAX_BLOCK_SCANS: int
BUDGET_BLOCKS_PER_BYTE: int
BUDGET_ARITH_BLOCKS_PER_BYTE: int
AUG_OP_IDENTITY: int
AUG_OP_AFFINE: int
AUG_OP_BRIGHTNESS: int
AUG_OP_COLOR: int
AUG_OP_CONTRAST: int
AUG_OP_SHARPNESS: int
AUG_OP_POSTERIZE: int
AUG_OP_SOLARIZE: int
AUG_OP_SOLARIZE_ADD: int
AUG_OP_AUTOCONTRAST: int
AUG_OP_EQUALIZE: int
AUG_OP_INVERT: int
AUG_NEAREST: int
AUG_BILINEAR: int
AUG_BICUBIC: int
AUG_MAX_OPS: int
AUG_MAX_ARG: int
# warnings, first, eof, hit_marker, padding, trailing, error, refused
Report = dict[str, Any]

class ProbeResult(NamedTuple):
    width: int
    height: int
    code: int
    report: Report | None

class DecodeResult(NamedTuple):
    left: int
    top: int
    right: int
    bottom: int
    report: Report

class ConvertResult(NamedTuple):
    status: int
    message: str
    jpeg: bytes | None
    width: int
    height: int
    components: int
    mpf: int
    path: int
    levels: bytes | None
    rgb: bytes | None
    out_width: int
    out_height: int
    scan: Report

class FrameResult(NamedTuple):
    status: int
    message: str
    rgbx: bytes | None
    width: int
    height: int
    box: tuple[float, float, float, float] | None
    out_width: int
    out_height: int
    path: int

class SampleResult(NamedTuple):
    status: int
    path: int
    message: str
    scan: Report | None

@overload
def probe(data: Buffer, check: Literal[False] = ..., /) -> ProbeResult: ...
@overload
def probe(data: Buffer, check: Literal[True], /) -> ProbeResult: ...
def decode(data: Buffer, frame: Buffer, scale: int, x0: int, y0: int, x1: int, y1: int,
           whole: bool = ..., /) -> DecodeResult: ...
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
def convert(data: Buffer, size: int, resize: int, filter: int, quality: int,
            exif_transpose: bool, whole: bool, histogram: bool, pixels: bool, max_pixels: int,
            bomb_pixels: int, /) -> ConvertResult: ...
def finish(rgb: Buffer, width: int, height: int, orig_width: int, orig_height: int, size: int,
           resize: int, filter: int, quality: int, histogram: bool, pixels: bool,
           max_pixels: int, /) -> ConvertResult: ...
def frame(data: Buffer, size: int, resize: int, filter: int, max_pixels: int,
          exif_transpose: bool, whole: bool, bomb_pixels: int, /) -> FrameResult: ...
def sample(data: Buffer, width: int, height: int, draft: tuple[int, int],
           resize: tuple[int, int], box: tuple[float, float, float, float] | None,
           crop: tuple[int, int, int, int], flip: bool, planar: bool, whole: bool,
           max_pixels: int, out: Buffer, /) -> SampleResult: ...
# (kind, args, resample, fill): an AUG_OP_* code, its arguments, an AUG_* filter, RGB 0..255
AugOp = tuple[int, tuple[float, ...], int, tuple[int, int, int]]
def augment(out: Buffer, width: int, height: int, planar: bool, ops: tuple[AugOp, ...],
            /) -> None: ...
