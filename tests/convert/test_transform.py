"""Tests for imgprep.convert.image (whichever transform version this environment runs):
every image mode to a 256 px RGB JPEG, options, bad inputs, and the statistics it gives."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin

from imgprep.convert.converted import (
    Converted,
    center_pixels,
    channel_histogram,
    channel_sums,
    sums_of_histogram,
)
from imgprep.convert.image import convert_image
from imgprep.convert.pillowpath import convert_pillow
from imgprep.errors import ImageError
from imgprep.sections import TransformOptions
from tests.support import encode, jpeg, photo

OPTS = TransformOptions()
SHORT = TransformOptions(resize="short-side")

def _decode(c: Converted) -> Image.Image:
    out = Image.open(io.BytesIO(c.jpeg))
    out.load()
    return out


def _pixels(c: Converted) -> np.ndarray:
    return np.asarray(_decode(c), dtype=np.float64)


def _check_output(c: Converted, size: tuple[int, int] = (256, 256)) -> Converted:
    """Assert the encoded output is an RGB JPEG of ``size``, as ``c`` says; return ``c``."""
    out = _decode(c)
    assert out.format == "JPEG"
    assert out.mode == "RGB"
    assert out.size == size
    assert c.size == size
    return c


def _mad(a: Converted, b: Converted) -> float:
    """Mean absolute difference of two decoded outputs, in 8-bit levels."""
    return float(np.abs(_pixels(a) - _pixels(b)).mean())


def _png_with_size(width: int, height: int) -> bytes:
    """A small real PNG whose IHDR declares ``width`` x ``height`` (CRC recomputed)."""
    png = bytearray(encode(Image.new("1", (8, 8)), "PNG"))
    assert png[12:16] == b"IHDR"
    png[16:24] = struct.pack(">II", width, height)
    png[29:33] = struct.pack(">I", zlib.crc32(bytes(png[12:29])))
    return bytes(png)


# --- output shape --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(160, 120), (120, 160), (300, 300), (257, 1000)])
def test_center_crop_is_square(size: tuple[int, int]) -> None:
    c = convert_image(jpeg(size), OPTS)
    _check_output(c)
    assert c.original_size == size
    assert c.original_format == "JPEG" and c.original_mode == "RGB"


@pytest.mark.parametrize(("size", "out"), [
    ((400, 300), (341, 256)),
    ((300, 400), (256, 341)),
    ((100, 100), (256, 256)),
    ((1000, 500), (512, 256)),
])
def test_short_side_keeps_aspect(size: tuple[int, int], out: tuple[int, int]) -> None:
    _check_output(convert_image(jpeg(size), SHORT), out)


def test_center_crop_takes_the_middle() -> None:
    """A 300x100 image: left and right thirds red, middle third blue; the crop is all blue."""
    arr = np.zeros((100, 300, 3), np.uint8)
    arr[:, :100, 0] = arr[:, 200:, 0] = 255
    arr[:, 100:200, 2] = 255
    px = _pixels(convert_image(encode(Image.fromarray(arr), "PNG"), OPTS))
    inner = px[8:-8, 8:-8]
    assert inner[..., 2].min() > 230 and inner[..., 0].max() < 25


# --- every mode ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference() -> Converted:
    """The plain RGB conversion every other mode of the same photo is compared with."""
    return convert_image(encode(photo((200, 150), seed=3), "PNG"), OPTS, pixels=True)


def _gray(c: Converted) -> np.ndarray:
    assert c.pixels is not None
    return np.asarray(Image.fromarray(c.pixels).convert("L"), dtype=np.float64)


def _same_photo(mode: str, fmt: str, **kw: object) -> bytes:
    return encode(photo((200, 150), seed=3).convert(mode), fmt, **kw)


def test_rgb_jpeg_close_to_reference(reference: Converted) -> None:
    c = convert_image(_same_photo("RGB", "JPEG", quality=95), OPTS)
    _check_output(c)
    assert _mad(c, reference) < 4


def test_cmyk_jpeg_colours_survive(reference: Converted) -> None:
    data = _same_photo("CMYK", "JPEG", quality=95)
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    c = convert_image(data, OPTS)
    _check_output(c)
    assert c.original_mode == "CMYK"
    assert _mad(c, reference) < 6  # an un-inverted Adobe CMYK would be ~100 levels off


def test_grayscale_jpeg(reference: Converted) -> None:
    c = _check_output(convert_image(_same_photo("L", "JPEG", quality=95), OPTS))
    px = _pixels(c)
    assert c.original_mode == "L"
    assert np.abs(px[..., 0] - px[..., 1]).max() <= 2 and np.abs(px[..., 1] - px[..., 2]).max() <= 2
    assert np.abs(px[..., 0] - _gray(reference)).mean() < 4


def test_palette_with_transparency(reference: Converted) -> None:
    pal = photo((200, 150), seed=3).convert("P", palette=Image.Palette.ADAPTIVE, colors=256)
    data = encode(pal, "PNG", transparency=0)
    assert "transparency" in Image.open(io.BytesIO(data)).info
    c = _check_output(convert_image(data, OPTS))
    assert c.original_mode == "P"
    assert _mad(c, reference) < 10


def test_palette_gif(reference: Converted) -> None:
    c = _check_output(convert_image(_same_photo("P", "GIF"), OPTS))
    assert c.original_format == "GIF"
    assert _mad(c, reference) < 15


def test_rgba_png_named_jpeg(tmp_path: Path, reference: Converted) -> None:
    path = tmp_path / "n02105855_2933.JPEG"
    path.write_bytes(_same_photo("RGBA", "PNG"))
    c = _check_output(convert_image(path.read_bytes(), OPTS))
    assert (c.original_format, c.original_mode) == ("PNG", "RGBA")
    assert _mad(c, reference) < 3


def test_la_png(reference: Converted) -> None:
    c = _check_output(convert_image(_same_photo("LA", "PNG"), OPTS))
    assert c.original_mode == "LA"
    px = _pixels(c)
    assert np.abs(px[..., 0] - px[..., 2]).max() <= 2
    assert np.abs(px[..., 0] - _gray(reference)).mean() < 4


def test_one_bit_png() -> None:
    bw = photo((200, 150), seed=3).convert("1")
    c = _check_output(convert_image(encode(bw, "PNG"), OPTS))
    assert c.original_mode == "1"
    px = _pixels(c)
    assert np.abs(px[..., 0] - px[..., 1]).max() <= 2
    crop = np.asarray(bw.crop((25, 0, 175, 150)), dtype=np.float64) * 255
    assert abs(px.mean() - crop.mean()) < 8
    assert px.min() < 100 and px.max() > 150


@pytest.mark.parametrize("value", [0, 1000, 32768, 50000, 65535])
def test_sixteen_bit_gray_is_scaled_not_clipped(value: int) -> None:
    data = encode(Image.fromarray(np.full((120, 160), value, np.uint16)), "PNG")
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    c = _check_output(convert_image(data, OPTS))
    px = _pixels(c)
    assert abs(px.mean() - value / 257) < 2
    assert px.max() - px.min() <= 4


def test_sixteen_bit_gradient_matches_eight_bit() -> None:
    ramp8 = np.tile(np.linspace(0, 255, 300).round().astype(np.uint8), (200, 1))
    c16 = convert_image(encode(Image.fromarray(ramp8.astype(np.uint16) * 257), "PNG"), OPTS)
    c8 = convert_image(encode(Image.fromarray(ramp8), "PNG"), OPTS)
    assert _mad(c16, c8) < 1.5


def _exif_rotated() -> bytes:
    """200x100: left half red, right half blue; EXIF orientation 6 (display rotated 90° CW)."""
    arr = np.zeros((100, 200, 3), np.uint8)
    arr[:, :100, 0] = 255
    arr[:, 100:, 2] = 255
    exif = Image.Exif()
    exif[0x0112] = 6
    return encode(Image.fromarray(arr), "JPEG", quality=95, exif=exif.tobytes())


def test_exif_orientation_applied() -> None:
    c = convert_image(_exif_rotated(), TransformOptions(resize="short-side", exif_transpose=True))
    px = _pixels(_check_output(c, (256, 512)))
    top, bottom = px[:200].mean(axis=(0, 1)), px[-200:].mean(axis=(0, 1))
    assert top[0] > 200 and top[2] < 50  # the left (red) half is now on top
    assert bottom[2] > 200 and bottom[0] < 50


def test_exif_orientation_ignored() -> None:
    c = convert_image(_exif_rotated(), TransformOptions(resize="short-side", exif_transpose=False))
    px = _pixels(_check_output(c, (512, 256)))
    left, right = px[:, :200].mean(axis=(0, 1)), px[:, -200:].mean(axis=(0, 1))
    assert left[0] > 200 and left[2] < 50
    assert right[2] > 200 and right[0] < 50


# --- draft mode and options ----------------------------------------------------------------------


def test_draft_mode_on_large_jpeg(monkeypatch: pytest.MonkeyPatch) -> None:
    big = photo((2000, 1500), seed=7)
    data = encode(big, "JPEG", quality=95)
    decoded_at: list[tuple[int, int]] = []
    original_draft = JpegImagePlugin.JpegImageFile.draft

    def spy(self: JpegImagePlugin.JpegImageFile, mode: str | None,
            size: tuple[int, int] | None) -> object:
        result = original_draft(self, mode, size)
        decoded_at.append(self.size)
        return result

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    c = convert_pillow(data, OPTS)  # transform version 1 drafts with Pillow
    monkeypatch.undo()
    _check_output(c)
    assert c.original_size == (2000, 1500)
    assert decoded_at and min(decoded_at[-1]) >= 256 and decoded_at[-1][0] < 2000
    full = Image.open(io.BytesIO(data)).convert("RGB")
    ref = full.resize((256, 256), Image.Resampling.LANCZOS, box=(250, 0, 1750, 1500))
    diff = np.abs(_pixels(c) - np.asarray(ref, dtype=np.float64))
    assert diff.mean() < 4


def test_draft_mode_short_side_size() -> None:
    _check_output(convert_image(jpeg((2000, 1500), seed=7), SHORT), (341, 256))


@pytest.mark.parametrize(("size", "resize", "out"), [
    (128, "center-crop", (128, 128)),
    (224, "center-crop", (224, 224)),
    (128, "short-side", (171, 128)),
    (512, "center-crop", (512, 512)),
])
def test_size_option(size: int, resize: str, out: tuple[int, int]) -> None:
    c = convert_image(jpeg((400, 300)), TransformOptions(size=size, resize=resize))
    _check_output(c, out)


def test_quality_option() -> None:
    data = jpeg((400, 300))
    low = convert_image(data, TransformOptions(quality=50))
    high = convert_image(data, TransformOptions(quality=95))
    assert len(low.jpeg) < len(high.jpeg) * 0.8
    assert _mad(low, high) < 6


@pytest.mark.parametrize("filt", ["bicubic", "bilinear", "hamming", "box"])
def test_filter_option(filt: str) -> None:
    data = jpeg((400, 300))
    lanczos = convert_image(data, OPTS)
    other = convert_image(data, TransformOptions(filter=filt))
    _check_output(other)
    assert other.jpeg != lanczos.jpeg
    assert _mad(other, lanczos) < 6


def test_filter_changes_pixels_not_just_bytes() -> None:
    """Box and Lanczos of a fine checkerboard differ clearly; proves the filter is used."""
    board = (np.indices((300, 300)).sum(axis=0) % 2 * 255).astype(np.uint8)
    data = encode(Image.fromarray(board), "PNG")
    box = _pixels(convert_image(data, TransformOptions(filter="box", quality=95)))
    lan = _pixels(convert_image(data, TransformOptions(filter="lanczos", quality=95)))
    assert np.abs(box - lan).max() > 20


def test_deterministic() -> None:
    data = jpeg((500, 375), seed=11)
    a, b = (convert_image(data, OPTS, histogram=True, pixels=True) for _ in range(2))
    assert a.jpeg == b.jpeg
    np.testing.assert_array_equal(a.pixels, b.pixels)
    np.testing.assert_array_equal(a.histogram, b.histogram)


def test_statistics_come_only_when_asked() -> None:
    c = convert_image(jpeg((300, 200)), OPTS)
    assert c.histogram is None and c.pixels is None


@pytest.mark.parametrize("size", [(1, 1), (1, 10_000), (10_000, 1), (2, 3)])
def test_tiny_and_thin_images(size: tuple[int, int]) -> None:
    for data in (jpeg(size), encode(Image.new("RGB", size, (10, 200, 30)), "PNG")):
        c = convert_image(data, OPTS)
        _check_output(c)
        assert c.original_size == size


def test_thin_short_side() -> None:
    _check_output(convert_image(jpeg((10, 1000)), SHORT), (256, 25_600))


# --- bad inputs ----------------------------------------------------------------------------------


def _fails(data: bytes, opts: TransformOptions = OPTS) -> str:
    """The ImageError message for ``data``; any other exception fails the test."""
    with pytest.raises(ImageError) as info:
        convert_image(data, opts)
    message = str(info.value)
    assert message.strip()
    return message


def test_zero_bytes() -> None:
    assert "empty" in _fails(b"")


_JPEG = jpeg((400, 300), seed=5)


@pytest.mark.parametrize("cut", [
    2,
    20,
    200,
    len(_JPEG) // 3,
    len(_JPEG) // 2,
    len(_JPEG) * 9 // 10,
    len(_JPEG) - 10,
])
def test_truncated_jpeg(cut: int) -> None:
    message = _fails(_JPEG[:cut]).lower()
    assert any(word in message for word in ("truncated", "unreadable", "not an image"))


@pytest.mark.parametrize("cut", [60, 500, 0.5, 0.9])
def test_truncated_png(cut: float) -> None:
    data = encode(photo((300, 200), seed=2), "PNG")
    n = int(cut * len(data)) if isinstance(cut, float) else int(cut)
    _fails(data[:n])


@pytest.mark.parametrize("data", [
    bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)),
    b"not an image\n" * 100,
    b"\xff\xd8\xff\xe0" + bytes(200),
], ids=["random", "text", "jpeg-magic-then-zeros"])
def test_garbage(data: bytes) -> None:
    assert "image" in _fails(data).lower()


@pytest.mark.parametrize("page", [
    b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head><body></body></html>\n",
    b"  \n<html>\n<body>Flickr: this photo is no longer available</body></html>",
], ids=["doctype", "html-tag"])
def test_html_page_saved_as_jpeg(tmp_path: Path, page: bytes) -> None:
    path = tmp_path / "n01440764_123.JPEG"
    path.write_bytes(page)
    assert "HTML" in _fails(path.read_bytes())


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize(("w", "h"), [(30_000, 30_000), (10_000, 10_000), (65_535, 65_535)])
def test_decompression_bomb_refused(w: int, h: int) -> None:
    assert Image.open(io.BytesIO(_png_with_size(20, 10))).size == (20, 10)  # the patch works
    message = _fails(_png_with_size(w, h))
    assert "bomb" in message or "pixels" in message


def test_max_pixels_option() -> None:
    data = jpeg((200, 150))
    assert "--max-pixels" in _fails(data, TransformOptions(max_pixels=200 * 150 - 1))
    _check_output(convert_image(data, TransformOptions(max_pixels=200 * 150)))


@pytest.mark.filterwarnings("ignore::UserWarning")  # Pillow's TIFF parser chatter on bad tags
def test_fuzzed_inputs_raise_only_image_error() -> None:
    """Random corruptions of valid files either convert or raise ImageError, nothing else."""
    rng = np.random.default_rng(1234)
    img = photo((64, 48), seed=1)
    bases = [jpeg((64, 48)), encode(img, "JPEG", progressive=True), encode(img, "PNG"),
             encode(img.convert("P"), "GIF"), encode(img, "BMP"), encode(img, "TIFF")]
    outcomes = {"ok": 0, "error": 0}
    for base in bases:
        for k in range(120):
            mutated = bytearray(base)
            span = 300 if k % 2 else len(mutated)
            for _ in range(int(rng.integers(1, 8))):
                mutated[int(rng.integers(0, min(span, len(mutated))))] = int(rng.integers(0, 256))
            if k % 4 == 0:
                mutated = mutated[: int(rng.integers(1, len(mutated)))]
            try:
                _check_output(convert_image(bytes(mutated), OPTS))
                outcomes["ok"] += 1
            except ImageError as e:
                assert str(e)
                outcomes["error"] += 1
    assert outcomes["ok"] > 0 and outcomes["error"] > 0


# --- channel sums --------------------------------------------------------------------------------


def _numpy_sums(img: Image.Image) -> np.ndarray:
    arr = np.asarray(img, dtype=np.int64).reshape(-1, 3)
    return np.stack([arr.sum(axis=0), (arr * arr).sum(axis=0), np.full(3, len(arr))])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_channel_sums_match_numpy(seed: int) -> None:
    for data in (jpeg((300, 200), seed=seed), encode(photo((300, 200), seed), "PNG")):
        c = convert_image(data, OPTS, histogram=True, pixels=True)
        assert c.histogram is not None and c.pixels is not None
        sums = sums_of_histogram(c.histogram)
        assert sums.shape == (3, 3) and sums.dtype.kind == "i"
        np.testing.assert_array_equal(sums, _numpy_sums(Image.fromarray(c.pixels)))
        assert sums[2].tolist() == [256 * 256] * 3
        assert np.abs(c.pixels.astype(int) - np.asarray(_decode(c))).mean() < 6  # the JPEG


def test_channel_sums_extremes() -> None:
    arr = np.random.default_rng(5).integers(0, 256, (64, 32, 3), dtype=np.uint8)
    arr[0, 0] = (255, 0, 255)
    img = Image.fromarray(arr, "RGB")
    np.testing.assert_array_equal(channel_sums(img), _numpy_sums(img))
    white = Image.new("RGB", (10, 10), (255, 255, 255))
    assert channel_sums(white).tolist() == [[25500] * 3, [25500 * 255] * 3, [100] * 3]


def test_center_pixels() -> None:
    c = convert_image(jpeg((400, 300)), SHORT, pixels=True)
    assert c.pixels is not None and c.pixels.shape == (256, 341, 3)
    px = center_pixels(c.pixels, 256)
    assert px.shape == (256, 256, 3) and px.dtype == np.uint8
    np.testing.assert_array_equal(px, c.pixels[:, 42:298])
    square = convert_image(jpeg((400, 300)), OPTS, pixels=True)
    assert square.pixels is not None
    np.testing.assert_array_equal(center_pixels(square.pixels, 256), square.pixels)


# --- real data -----------------------------------------------------------------------------------


def _originals(real_data: Path) -> list[Path]:
    return sorted(p for p in (real_data / "originals").rglob("*") if p.is_file())


def test_real_originals_all_convert(real_data: Path) -> None:
    files = _originals(real_data)
    assert len(files) == 15
    formats = {}
    for path in files:
        c = convert_image(path.read_bytes(), OPTS)
        _check_output(c)
        formats[path.name] = (c.original_format, c.original_mode)
    assert formats["n02105855_2933.JPEG"] == ("PNG", "RGBA")
    assert formats["n15075141_38508.JPEG"] == ("JPEG", "L")
    assert sum(mode == "L" for _, mode in formats.values()) >= 2


def test_real_grayscale_output_is_gray(real_data: Path) -> None:
    path = real_data / "originals" / "train" / "n15075141" / "n15075141_13104.JPEG"
    px = _pixels(convert_image(path.read_bytes(), OPTS))
    assert np.abs(px[..., 0] - px[..., 2]).max() <= 2


def test_real_images_every_twentieth(real_data: Path) -> None:
    files = sorted((real_data / "images").iterdir())
    assert len(files) == 1000
    for path in files[::20]:
        c = convert_image(path.read_bytes(), OPTS)
        _check_output(c)
        assert c.original_format == "JPEG"


def test_real_exif_orientation(real_data: Path) -> None:
    data = (real_data / "images" / "n02951585_can_opener.JPEG").read_bytes()
    plain = convert_image(data, SHORT)
    turned = convert_image(data, TransformOptions(resize="short-side", exif_transpose=True))
    w, h = plain.size
    assert w != h and min(w, h) == 256
    assert turned.size == (h, w)


def test_short_side_refuses_outputs_over_the_pixel_limit() -> None:
    """A 2x4000 strip would become 256x512000 in short-side mode: refused, not allocated."""
    data = encode(photo((2, 4000)), "PNG")
    message = _fails(data, TransformOptions(resize="short-side", max_pixels=10_000_000))
    assert "elongated" in message and "256x512000" in message
    out = convert_image(data, TransformOptions())  # center-crop is always size x size
    assert Image.open(io.BytesIO(out.jpeg)).size == (256, 256)


def test_summed_histograms_give_the_summed_channel_sums() -> None:
    """A task adds histograms and converts once: the same integers as adding the sums."""
    imgs = [Image.effect_noise((40, 30), 50 + 20 * k).convert("RGB") for k in range(3)]
    total = sums_of_histogram(sum(channel_histogram(im) for im in imgs))
    np.testing.assert_array_equal(total, sum(channel_sums(im) for im in imgs))
