"""Untrusted images are bounded and judged alike: convert and the loader (its extension path
and its Pillow path) accept the same formats, refuse the same hostile files in the same
words, hold every JPEG to the per-image budget (scans, block decodes, bytes against the
declared size, quantisation tables), say what a file they cannot read is, and turn every
decoder failure into the sample's error."""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, features

from imgprep import budget, imagefile, jpegcrop
from imgprep.convert.image import convert_image
from imgprep.errors import ImageError
from imgprep.sections import TransformOptions
from loaders.decode import SampleDecoder
from loaders.transforms import SampleError, TrainTransform, ValTransform, apply
from tests.support import encode, jpeg, photo

T = TrainTransform(size=64)
FAST = [True, False] if jpegcrop.AVAILABLE else [False]


def convert_says(data: bytes) -> str | None:
    """convert's error for ``data``, or None when it converts."""
    try:
        convert_image(data, TransformOptions(size=64))
    except ImageError as e:
        return str(e)
    return None


def loader_says(data: bytes, fast: bool, t: TrainTransform | ValTransform = T) -> str | None:
    """The loader's SampleError for ``data`` (minus the sample's name), or None."""
    out = np.zeros((3, t.size, t.size), np.uint8)
    try:
        if fast:
            SampleDecoder(t, fast=True)(data, np.random.default_rng(0), out, "s")
        else:
            apply(data, t, np.random.default_rng(0), out, "s")
    except SampleError as e:
        return str(e).removeprefix("s: ")
    return None


def segments(data: bytes) -> list[tuple[int, int, int]]:
    """(marker, start, end) of a JPEG's segments up to its first scan's header."""
    i, out = 2, []
    while True:
        m, size = data[i + 1], struct.unpack(">H", data[i + 2:i + 4])[0]
        out.append((m, i, i + 2 + size))
        if m == 0xDA:
            return out
        i += 2 + size


def with_frame(data: bytes, **fields: int) -> bytes:
    """``data`` with its frame header's precision, height or width replaced."""
    d = bytearray(data)
    _, s, _ = next(seg for seg in segments(data) if seg[0] in (0xC0, 0xC1, 0xC2))
    at = {"precision": (s + 4, ">B"), "height": (s + 5, ">H"), "width": (s + 7, ">H")}
    for name, value in fields.items():
        off, fmt = at[name]
        d[off:off + struct.calcsize(fmt)] = struct.pack(fmt, value)
    return bytes(d)


def header_only(width: int, height: int, mode: str = "RGB") -> bytes:
    """A progressive JPEG's headers declaring ``width`` x ``height``, 20 bytes of its scan
    and an end marker: a few hundred bytes."""
    data = encode(photo((64, 48), 1).convert(mode), "JPEG", quality=90, progressive=True)
    sos = next(s for m, s, _ in segments(data) if m == 0xDA)
    return with_frame(data, width=width, height=height)[:sos + 40] + b"\xff\xd9"


def many_scans(n: int) -> bytes:
    """A 1600 x 1200 progressive JPEG whose smallest scan is repeated ``n`` times."""
    size = (1600, 1200)
    y = np.random.default_rng(0).integers(0, 255, (150, 200), np.uint8).repeat(8, 0).repeat(8, 1)
    grey = Image.new("L", size, 128)
    img = Image.merge("YCbCr", [Image.fromarray(y), grey, grey]).convert("RGB")
    data = encode(img, "JPEG", quality=90, progressive=True)
    scans, i = [], 0
    while (i := data.find(b"\xff\xda", i + 1)) > 0:
        end = i + 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
        while not (data[end] == 0xFF and data[end + 1] not in (0, *range(0xD0, 0xD8))):
            end += 1
        scans.append(data[i:end])
    return data[:-2] + min(scans, key=len) * n + b"\xff\xd9"


def zero_quant(data: bytes) -> bytes:
    """``data`` with its first quantisation table all zeros."""
    d = bytearray(data)
    _, s, _ = next(seg for seg in segments(data) if seg[0] == 0xDB)
    d[s + 5:s + 5 + 64] = bytes(64)
    return bytes(d)


def restart_damaged() -> bytes:
    """A JPEG with restart markers, the last 60 bytes of one interval cut: libjpeg meets the
    next RST marker before the interval's last block, warns, and resyncs there."""
    data = encode(photo((380, 260), 12), "JPEG", quality=90, restart_marker_rows=1)
    rst = [i for i in range(data.index(b"\xff\xda"), len(data) - 1)
           if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]
    end = rst[len(rst) // 2]
    return data[:end - 60] + data[end:]


# ---------------------------------------------------------------------------- 2, 3: budget

REFUSED = {
    "2,000 scans": (lambda: many_scans(2000), "more than 500 scans"),
    "20,000 scans": (lambda: many_scans(20000), "more than 500 scans"),
    "9400x9400 header": (lambda: header_only(9400, 9400), "too few for that image"),
    "9000x9000 CMYK header": (lambda: header_only(9000, 9000, "CMYK"),
                              "too few for that image"),
    "65500x1 header": (lambda: with_frame(jpeg((64, 8), seed=2), width=65500),
                       "too few for that image"),
    "zero quantisation table": (lambda: zero_quant(jpeg((120, 90), seed=3)),
                                "quantisation table 0 holds a 0"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_convert_and_both_loader_paths_refuse_what_breaks_the_budget_in_one_reason(
        name: str) -> None:
    make, words = REFUSED[name]
    data = make()
    said = {convert_says(data), *(loader_says(data, fast) for fast in FAST)}
    assert len(said) == 1 and words in str(said.pop()), said


def test_the_python_prescan_holds_the_extensions_limits_and_reasons() -> None:
    """Where the extension is built, its exported limits are the pre-scan's; its reasons
    are the pre-scan's words."""
    if jpegcrop.AVAILABLE:
        assert budget.LIMITS == budget.Limits()
    for name, (make, words) in REFUSED.items():
        data = make()
        why = budget.refusal(budget.prescan(data), len(data))
        assert why is not None and words in why, name
        if jpegcrop.AVAILABLE:
            assert jpegcrop.check(data).error == why, name


def test_without_the_extension_the_budget_still_holds(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    monkeypatch.setattr(jpegcrop, "AVAILABLE", False)
    for name, (make, words) in REFUSED.items():
        assert words in str(loader_says(make(), fast=False)), name


LEGAL = {
    "12 MP progressive": lambda: encode(photo((4000, 3000), 5), "JPEG", quality=85,
                                        progressive=True),
    "1 x 20,000 strip": lambda: encode(Image.new("RGB", (1, 20000), (90, 30, 200)), "JPEG"),
    "20,000 x 1 strip": lambda: encode(Image.new("RGB", (20000, 1), (90, 30, 200)), "JPEG"),
    "flat 4000 x 3000": lambda: encode(Image.new("RGB", (4000, 3000), (0, 0, 0)), "JPEG",
                                       quality=50),
}


@pytest.mark.parametrize("name", LEGAL)
def test_large_and_elongated_legal_images_still_decode_everywhere(name: str) -> None:
    data = LEGAL[name]()
    assert convert_says(data) is None
    for t in (T, ValTransform(size=64)):
        for fast in FAST:
            assert loader_says(data, fast, t) is None, (t, fast)


# ---------------------------------------------------------------------------- 4: formats

def _saved(fmt: str) -> bytes | None:
    img = Image.new("RGB", (40, 30), (10, 200, 30))
    if fmt == "SPIDER":
        img = img.convert("F")
    buf = io.BytesIO()
    try:
        img.save(buf, fmt)
    except (KeyError, OSError, ValueError):
        return None  # this Pillow cannot write it
    return buf.getvalue()


REFUSED_FORMATS = ["TGA", "PCX", "PPM", "ICO", "SGI", "SPIDER", "EPS", "QOI", "DDS", "IM",
                   "MSP"]


@pytest.mark.parametrize("fmt", REFUSED_FORMATS)
def test_the_loader_opens_only_the_formats_convert_reads(fmt: str) -> None:
    data = _saved(fmt)
    if data is None:
        pytest.skip(f"this Pillow cannot write {fmt}")
    said = {convert_says(data), *(loader_says(data, fast) for fast in FAST)}
    assert len(said) == 1 and None not in said, said
    assert str(said.pop()).startswith(("a ", "not an image")), fmt
    truncated = data[:len(data) // 2]  # a truncated QOI raised IndexError out of the loader
    assert all(loader_says(truncated, fast) is not None for fast in FAST)


def test_every_decoder_failure_is_the_samples_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pillow's decoders can raise anything on hostile bytes (a QOI's IndexError, a DDS's
    NotImplementedError, struct's error): each is the sample's SampleError, under on_error,
    and convert's ImageError."""
    png = encode(photo((50, 40), 2), "PNG")
    for error in (IndexError("index out of range"), NotImplementedError("no codec"),
                  struct.error("unpack requires a buffer"), ZeroDivisionError("division")):
        def load(self: Image.Image, error: Exception = error) -> None:
            raise error
        monkeypatch.setattr(Image.Image, "load", load)
        said = {loader_says(png, fast) for fast in FAST}
        assert all(s is not None and str(error) in s for s in said), (error, said)
        assert str(error) in str(convert_says(png))


def test_accepted_formats_are_one_list() -> None:
    assert imagefile.ACCEPTED_FORMATS == ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP")
    for fmt in ("PNG", "GIF", "BMP", "TIFF"):
        data = encode(photo((50, 40), 3), fmt)
        assert convert_says(data) is None and all(loader_says(data, f) is None for f in FAST)


# ---------------------------------------------------------------------------- 5: damage

DAMAGE: dict[str, tuple[Callable[[], bytes], str | None]] = {
    "70 KB of random bytes after the end": (
        lambda: jpeg((200, 150), seed=4) + np.random.default_rng(1).bytes(70_000),
        "bytes of trailing data"),
    "a second JPEG after the end": (
        lambda: jpeg((200, 150), seed=5) + encode(photo((600, 500), 6), "JPEG", quality=95),
        "bytes of trailing data"),
    "restart-marker damage": (restart_damaged, None),
}


@pytest.mark.parametrize("name", DAMAGE)
def test_the_loader_judges_damage_as_convert_does(name: str) -> None:
    make, words = DAMAGE[name]
    data = make()
    said = {convert_says(data), *(loader_says(data, fast) for fast in FAST)}
    assert len(said) == 1, said
    got = said.pop()
    assert (got is None) if words is None else (words in str(got)), got


def test_restart_damage_converts_with_libjpegs_warning_listed() -> None:
    c = convert_image(restart_damaged(), TransformOptions(size=64))
    assert "premature end of data segment" in c.warning or "Corrupt JPEG" in c.warning


# ---------------------------------------------------------------------------- 6: messages

MESSAGES = {
    "12-bit": (lambda: with_frame(jpeg((64, 48), seed=7), precision=12), "a 12-bit JPEG"),
    "zero width": (lambda: with_frame(jpeg((64, 48), seed=7), width=0),
                   "declares a size of 0x48"),
    "zero height": (lambda: with_frame(jpeg((64, 48), seed=7), height=0),
                    "declares a size of 64x0"),
    "two components": (lambda: _two_components(), "a 2-component JPEG"),
    "QOI": (lambda: _saved("QOI") or b"qoif" + bytes(20), "a QOI image, a format that is not"),
}


def _two_components() -> bytes:
    data = bytearray(jpeg((64, 48), seed=8))
    _, s, _ = next(seg for seg in segments(bytes(data)) if seg[0] == 0xC0)
    data[s + 9] = 2  # the frame's component count: the third component's bytes stay
    return bytes(data)


@pytest.mark.parametrize("name", MESSAGES)
def test_a_file_that_cannot_be_read_is_named_for_what_it_is(name: str) -> None:
    make, words = MESSAGES[name]
    data = make()
    said = {convert_says(data), *(loader_says(data, fast) for fast in FAST)}
    assert all(s is not None and words in s for s in said), said


def test_webp_is_named_where_this_pillow_cannot_read_it(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    riff = b"RIFF" + struct.pack("<I", 30) + b"WEBPVP8 " + bytes(22)
    if features.check("webp"):
        data = encode(photo((50, 40), 9), "WEBP")
        assert convert_says(data) is None and all(loader_says(data, f) is None for f in FAST)
        monkeypatch.setattr(features, "check", lambda name: name != "webp")
    assert "this Pillow is built without WebP support" in imagefile.what_it_is(riff)


def test_a_forged_header_costs_no_memory_in_the_prescan(tmp_path: Path) -> None:
    layout = budget.prescan(header_only(65000, 65000))
    assert (layout.width, layout.height, layout.scans) == (65000, 65000, 1)
    assert budget.refusal(layout, 300) is not None
