"""The stored-pixel record: one layout in C and in Python, and a record is read only when
its length is exactly its header's (nothing is read or allocated on a forged header)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from imgprep import jpegcrop, rawformat, rawpixels
from imgprep.errors import ImageError
from imgprep.rawformat import BY_NAME, HEADER, read_header, record_size
from tests.support.images import jpeg

pytestmark = pytest.mark.skipif(not jpegcrop.AVAILABLE, reason="needs the extension")


def record(kind: str = "yuv420", size: tuple[int, int] = (37, 21)) -> bytes:
    data, _ = rawpixels.record(jpeg(size, seed=3), BY_NAME[kind])
    return data


def test_the_layout_is_the_extensions() -> None:
    from imgprep import _jpegcrop as ext

    assert ext.RAW_HEADER == HEADER.size and ext.RAW_VERSION == rawformat.VERSION
    assert (ext.RAW_RGB24, ext.RAW_YUV420) == (BY_NAME["rgb"].code, BY_NAME["yuv420"].code)
    assert ext.MAX_SIDE == rawformat.MAX_SIDE
    for kind, n in (("yuv420", 37 * 21 + 2 * 19 * 11), ("rgb", 37 * 21 * 3)):
        rec = record(kind)
        assert len(rec) == HEADER.size + n == record_size(BY_NAME[kind], 37, 21)
        assert read_header(rec) == rawformat.RawHeader(BY_NAME[kind], 37, 21)


@pytest.mark.parametrize("damage", ["short", "long", "magic", "version", "mode", "wide",
                                    "zero", "tiny"])
def test_a_record_that_is_not_whole_is_refused_before_any_pixel(damage: str) -> None:
    rec = bytearray(record())
    if damage == "short":
        rec = rec[:-1]
    elif damage == "long":
        rec += b"\0"
    elif damage == "magic":
        rec[0] ^= 1
    elif damage == "version":
        rec[4] = 2
    elif damage == "mode":
        rec[5] = 9
    elif damage == "wide":  # a header claiming far more pixels than the bytes hold
        struct.pack_into("<II", rec, 8, 65000, 65000)
    elif damage == "zero":
        struct.pack_into("<I", rec, 8, 0)
    else:
        rec = rec[:10]
    with pytest.raises(ValueError):
        read_header(bytes(rec))
    out = np.empty((8, 8, 3), np.uint8)
    with pytest.raises(ImageError):  # the C side refuses the same record, reading nothing
        rawpixels.sample(bytes(rec), 37, 21, resize=(8, 8), box=None, crop=(0, 0, 8, 8),
                         out=out, flip=False, planar=False)


def test_a_geometry_that_does_not_fit_the_record_is_a_value_error() -> None:
    rec = record()
    out = np.empty((8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match="record holds 37x21"):
        rawpixels.sample(rec, 38, 21, resize=(8, 8), box=None, crop=(0, 0, 8, 8), out=out,
                         flip=False, planar=False)
    with pytest.raises(ValueError, match="box"):
        rawpixels.sample(rec, 37, 21, resize=(8, 8), box=(0, 0, 40, 21), crop=(0, 0, 8, 8),
                         out=out, flip=False, planar=False)
    with pytest.raises(ValueError, match="out holds"):
        rawpixels.sample(rec, 37, 21, resize=(8, 8), box=None, crop=(0, 0, 8, 8),
                         out=np.empty((7, 8, 3), np.uint8), flip=False, planar=False)


def test_a_jpeg_of_other_sampling_is_stored_as_rgb() -> None:
    from imgprep import _jpegcrop as ext

    px = np.random.default_rng(0).integers(0, 256, (9, 14, 3), np.uint8)
    full = ext.encode(px.tobytes(), 14, 9, 3, 90, (1, 1, 1, 1, 1, 1))  # 4:4:4
    data, made = rawpixels.record(full, BY_NAME["yuv420"])
    assert made.name == "rgb" and read_header(data).kind.name == "rgb"
    with pytest.raises(ImageError):
        rawpixels.record(b"\xff\xd8\xff" + b"\0" * 40, BY_NAME["yuv420"])


def test_mutated_records_fail_or_decode_never_more() -> None:
    """Hostile records (random bytes flipped, cut, grown, or a forged header): the C call
    gives a row or a refusal, and the Python header check agrees on which."""
    rng = np.random.default_rng(7)
    base = [record("yuv420", (31, 17)), record("rgb", (31, 17))]
    out = np.empty((3, 12, 12), np.uint8)
    for i in range(300):
        rec = bytearray(base[i % 2])
        kind = i % 4
        if kind == 0:
            for at in rng.integers(0, 16, 2).tolist():  # the header
                rec[at] = int(rng.integers(0, 256))
        elif kind == 1:
            rec = rec[:int(rng.integers(0, len(rec)))]
        elif kind == 2:
            rec += bytes(int(rng.integers(1, 64)))
        else:
            struct.pack_into("<II", rec, 8, *rng.integers(1, 70000, 2).tolist())
        try:
            head = read_header(bytes(rec))
        except ValueError:
            head = None
        try:
            rawpixels.sample(bytes(rec), 31, 17, resize=(12, 12), box=(1.5, 2.0, 30.0, 16.0),
                             crop=(0, 0, 12, 12), out=out, flip=True, planar=True)
            made = True
        except ImageError:
            made = False
        except ValueError:  # a whole record of another size than the geometry's
            made = False
            assert head is not None and (head.width, head.height) != (31, 17)
        assert made == (head is not None and (head.width, head.height) == (31, 17)), i
