"""Convert's JPEG encoder (imgprep/csrc/encode.c) writes what Pillow's ``save(format="JPEG",
quality=q)`` writes for the same pixels, byte for byte, with the same markers every time."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image, features

from imgprep import jpegcrop
from tests.support import photo

ext = pytest.importorskip("imgprep._jpegcrop", reason=f"C extension: {jpegcrop.status()}")

QUALITIES = (1, 5, 24, 25, 50, 75, 90, 95, 100)


def _pillow(arr: np.ndarray, quality: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _rgbx(arr: np.ndarray) -> np.ndarray:
    return np.concatenate([arr, np.full(arr.shape[:2] + (1,), 7, np.uint8)], axis=2)


def _markers(data: bytes) -> list[int]:
    """The marker codes of a JPEG up to its scan (then EOI, when it ends with one)."""
    out, i = [], 2
    while data[i] == 0xFF and data[i + 1] != 0xDA:
        out.append(data[i + 1])
        i += 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
    return [0xD8, *out, 0xDA] + ([0xD9] if data.endswith(b"\xff\xd9") else [])


@pytest.mark.parametrize("size", [(256, 256), (255, 17), (1, 1), (333, 500), (17, 1)])
def test_the_encoder_writes_pillows_bytes_for_the_same_pixels(size: tuple[int, int]) -> None:
    """Held with the extension on libjpeg-turbo 2.1.5 against Pillow on 2.1.5 (pillow-simd)
    and on 3.2.0 (stock Pillow 13): the baseline encoder's output did not change between."""
    pil = features.version("libjpeg_turbo")
    if pil is None:
        pytest.skip(f"PIL {features.version('pil')} is not built with libjpeg-turbo")
    versions = f"PIL on libjpeg-turbo {pil}, the extension on {ext.LIBJPEG_TURBO_VERSION}"
    arr = np.asarray(photo(size, seed=sum(size)).convert("RGB"))
    h, w = arr.shape[:2]
    for q in QUALITIES:
        want = _pillow(arr, q)
        assert ext.encode(arr.tobytes(), w, h, 3, q) == want, (q, versions)
        assert ext.encode(_rgbx(arr).tobytes(), w, h, 4, q) == want, (q, versions)


def test_the_output_holds_the_same_markers_every_time() -> None:
    """SOI, JFIF APP0, the quantisation tables, a baseline frame (SOF0) with 4:2:0 sampling,
    the Huffman tables, the scan and EOI: no comment, EXIF or ICC segment."""
    arr = np.asarray(photo((300, 200), seed=1))
    data = ext.encode(arr.tobytes(), 300, 200, 3, 90)
    assert _markers(data) == [0xD8, 0xE0, 0xDB, 0xDB, 0xC0, 0xC4, 0xC4, 0xC4, 0xC4, 0xDA, 0xD9]
    assert data[6:11] == b"JFIF\0"
    with Image.open(io.BytesIO(data)) as img:
        assert img.mode == "RGB" and img.size == (300, 200)
        assert [layer[1:] for layer in img.layer] == [(2, 2, 0), (1, 1, 1), (1, 1, 1)]
        assert "comment" not in img.info and "exif" not in img.info
        assert "icc_profile" not in img.info and "progressive" not in img.info


def test_a_higher_quality_keeps_the_pixels_closer() -> None:
    arr = np.asarray(photo((256, 256), seed=2))

    def error(q: int) -> float:
        data = ext.encode(arr.tobytes(), 256, 256, 3, q)
        back = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)
        return float(np.abs(back - arr).mean())

    assert error(100) < error(90) < error(50) < error(10) < 16


@pytest.mark.parametrize("args,words", [
    ((b"\0" * 12, 2, 2, 3, 0), "quality"),
    ((b"\0" * 12, 2, 2, 3, 101), "quality"),
    ((b"\0" * 12, 2, 2, 2, 90), "channels"),
    ((b"\0" * 11, 2, 2, 3, 90), "bytes"),
    ((b"\0" * 16, 2, 2, 3, 90), "bytes"),
    ((b"", 0, 2, 3, 90), "width and height"),
    ((b"\0" * 12, -2, -2, 3, 90), "width and height"),
    ((b"\0" * 3 * 65501, 65501, 1, 3, 90), "width and height"),
])
def test_the_encoder_refuses_bad_arguments(args: tuple[object, ...], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ext.encode(*args)
