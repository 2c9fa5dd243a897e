"""Transform version 2, convert's C path (imgprep/csrc/convert.c): its decode is Pillow's
draft decode pixel for pixel (only the region the resample reads, where it can), it turns
images by their EXIF orientation as Pillow does, and it gives the same bytes whether it
decodes a region, the whole image, or is handed Pillow's decode; what it declines goes to
Pillow; damage fails as before; threads convert at once without sharing scratch."""

from __future__ import annotations

import functools
import io
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from imgprep import jpegcrop
from imgprep.convert import native
from imgprep.errors import ImageError
from imgprep.sections import FILTER_NAMES, TransformOptions
from tests.support import encode, jpeg, photo, restart_out_of_order

ext = pytest.importorskip("imgprep._jpegcrop", reason=f"C extension: {jpegcrop.status()}")

REGION, WHOLE = 1, 2  # the extension's decode paths
MAX, BOMB = TransformOptions().max_pixels, 2 * TransformOptions().max_pixels


def _corrupt(data: bytes, at: float) -> bytes:
    """``data`` with 40 bytes XOR-ed at fraction ``at`` of its length."""
    out = bytearray(data)
    i = int(len(out) * at)
    out[i:i + 40] = bytes(b ^ 0x5A for b in out[i:i + 40])
    return bytes(out)


def _oriented(orientation: int, size: tuple[int, int] = (400, 240), subsampling: int = 2
              ) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(photo(size, orientation), "JPEG", quality=90, exif=exif.tobytes(),
                  subsampling=subsampling)


def _xmp_oriented() -> bytes:
    """Orientation 8 given only by an XMP packet (no EXIF), which Pillow also reads."""
    xmp = b'<x:xmpmeta><rdf:Description tiff:Orientation="8"/></x:xmpmeta>'
    return encode(photo((360, 200), 31), "JPEG", quality=90, xmp=xmp)


def _with_icc_and_comment() -> bytes:
    return encode(photo((420, 300), 14), "JPEG", quality=90, icc_profile=b"\0" * 128,
                  comment=b"made by a camera")


def _mpo() -> bytes:
    buf = io.BytesIO()
    photo((320, 240), 15).save(buf, "MPO", save_all=True, append_images=[photo((320, 240), 16)])
    return buf.getvalue()


_MAKERS: dict[str, Callable[[], bytes]] = {
    "landscape-420": lambda: jpeg((500, 375), seed=1),
    "portrait-444": lambda: encode(photo((333, 500), 2), "JPEG", quality=95, subsampling=0),
    "landscape-422": lambda: encode(photo((400, 300), 3), "JPEG", quality=80, subsampling=1),
    "square": lambda: jpeg((300, 300), seed=4),
    "draft-scaled": lambda: jpeg((2100, 1500), seed=5),  # 1/4 at 256, 1/8 at 64
    "elongated": lambda: jpeg((3000, 520), seed=6),
    "odd-size": lambda: jpeg((257, 131), seed=7),
    "under-256": lambda: jpeg((200, 150), seed=8),
    "tiny": lambda: jpeg((9, 7), seed=9),
    "one-column": lambda: jpeg((1, 300), seed=10),
    "restart-markers": lambda: encode(photo((380, 260), 11), "JPEG", quality=90,
                                      restart_marker_rows=1),
    "icc-and-comment": _with_icc_and_comment,
    "exif-orientation-6": lambda: _oriented(6),
    "exif-orientation-5-444": lambda: _oriented(5, (333, 517), subsampling=0),
    "xmp-orientation-8": _xmp_oriented,
    "grayscale": lambda: jpeg((300, 200), seed=17, mode="L"),
    "cmyk": lambda: jpeg((300, 200), seed=18, mode="CMYK"),
    "adobe-rgb": lambda: encode(photo((300, 200), 19), "JPEG", quality=90, keep_rgb=True),
    "progressive": lambda: encode(photo((300, 200), 20), "JPEG", quality=90, progressive=True),
    "progressive-large": lambda: encode(photo((1100, 700), 26), "JPEG", quality=90,
                                        progressive=True),
    "mpo": _mpo,
    "png-as-jpeg": lambda: encode(photo((300, 200), 21), "PNG"),
    "truncated": lambda: (d := jpeg((300, 200), seed=22))[: len(d) * 2 // 3],
    "restart-out-of-order": restart_out_of_order,
    "corrupt-middle": lambda: _corrupt(jpeg((400, 300), seed=23), 0.5),
    "corrupt-below-the-crop": lambda: _corrupt(jpeg((200, 600), seed=24), 0.93),
    "trailing-bytes": lambda: jpeg((300, 200), seed=25) + b"\x00garbage after EOI",
    "header-garbage": lambda: b"\xff\xd8\xff" + bytes(range(200)),
    "empty": lambda: b"",
}
QUIRKS = {name: functools.cache(make) for name, make in _MAKERS.items()}  # made once each
# How the extension decodes each under the default options (None: it declines, Pillow
# decodes); corrupt data starts as a region and is decoded whole once libjpeg warns, reading
# the data to its end.
PATHS = {
    **dict.fromkeys(["landscape-420", "portrait-444", "landscape-422", "draft-scaled",
                     "elongated", "odd-size", "under-256", "one-column", "restart-markers",
                     "icc-and-comment", "exif-orientation-6", "exif-orientation-5-444",
                     "xmp-orientation-8", "grayscale", "progressive", "progressive-large",
                     "mpo", "trailing-bytes", "corrupt-below-the-crop"], REGION),
    **dict.fromkeys(["square", "tiny", "adobe-rgb", "restart-out-of-order", "corrupt-middle"],
                    WHOLE),
    **dict.fromkeys(["cmyk", "png-as-jpeg", "header-garbage", "empty"], None),
    "truncated": "failed",
}

OPTIONS = {
    "default": TransformOptions(),
    **{f"filter-{f}": TransformOptions(filter=f) for f in FILTER_NAMES if f != "lanczos"},
    "size-64-dct-scaled": TransformOptions(size=64),
    "size-8": TransformOptions(size=8, filter="box"),
    "size-512-upscaled": TransformOptions(size=512, filter="bicubic"),
    "quality-50": TransformOptions(quality=50),
    "short-side": TransformOptions(resize="short-side"),
    "short-side-64": TransformOptions(resize="short-side", size=64, filter="bilinear"),
    "exif-transpose": TransformOptions(exif_transpose=True),
    "exif-transpose-short-side": TransformOptions(exif_transpose=True, resize="short-side"),
    "max-pixels": TransformOptions(max_pixels=120_000),
}


def outcome(data: bytes, opts: TransformOptions, crop_decode: bool = True) -> tuple[object, ...]:
    """Everything a conversion gives, or the error's message."""
    try:
        c = native.convert_native(data, opts, crop_decode=crop_decode, histogram=True,
                                  pixels=True)
    except ImageError as e:
        return ("error", str(e))
    assert c.histogram is not None and c.pixels is not None
    return (c.jpeg, c.size, c.original_size, c.original_mode, c.original_format,
            c.histogram.tobytes(), c.pixels.tobytes())


@pytest.fixture
def pillow_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every image goes the way of what the extension declines: Pillow decodes it."""
    monkeypatch.setattr(native, "JPEG_MAGIC", b"never a prefix")


def frame(data: bytes, opts: TransformOptions, whole: bool = False) -> tuple[object, ...]:
    """The extension's decode stage: (status, message, rgbx, width, height, box, out_width,
    out_height, path)."""
    return ext.frame(data, opts.size, native.RESIZE[opts.resize],
                     native.FILTER_CODES[opts.filter], opts.max_pixels, opts.exif_transpose,
                     whole, BOMB)


@pytest.mark.parametrize("name", OPTIONS)
def test_every_quirk_converts_to_the_same_bytes_from_a_region_or_the_whole(name: str) -> None:
    opts = OPTIONS[name]
    for quirk, make in QUIRKS.items():
        data = make()
        assert outcome(data, opts) == outcome(data, opts, crop_decode=False), quirk


@pytest.mark.parametrize("filter_name", sorted(native.FILTER_CODES))
def test_small_images_scaled_up_give_the_same_bytes_from_a_region_or_the_whole(
        filter_name: str) -> None:
    """The region's weights are the whole image's: a box shifted into a region's own
    coordinates rounds differently in the last bits, which once changed a pixel by one
    (bicubic, 86x108 and 108x86 scaled up to 224, found by the fuzz run)."""
    opts = TransformOptions(size=224, filter=filter_name)
    for seed in range(12):
        for size in ((86, 108), (108, 86), (90, 131), (150, 97)):
            data = jpeg(size, seed=seed)
            assert outcome(data, opts) == outcome(data, opts, crop_decode=False), (seed, size)


@pytest.mark.parametrize("name", OPTIONS)
def test_the_c_decode_gives_what_pillows_decode_gives(name: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The same output bytes from the extension's decode and from Pillow's (whose pixels the
    same resampler and encoder then finish); a failure either way is a failure both ways."""
    opts = OPTIONS[name]
    ours = {q: outcome(make(), opts) for q, make in QUIRKS.items()}
    monkeypatch.setattr(native, "JPEG_MAGIC", b"never a prefix")
    for quirk, make in QUIRKS.items():
        theirs = outcome(make(), opts)
        if ours[quirk][0] == "error" or theirs[0] == "error":
            assert ours[quirk][0] == theirs[0] == "error", (quirk, ours[quirk][:1], theirs[:1])
        else:
            assert ours[quirk] == theirs, quirk


def test_each_quirk_takes_its_path() -> None:
    got = {}
    for quirk, make in QUIRKS.items():
        status, message, *_, path = frame(make(), TransformOptions())
        got[quirk] = {native.DECLINED: None, native.FAILED: "failed"}.get(status, path)
    assert got == PATHS


def _pillow_frame(data: bytes, opts: TransformOptions) -> np.ndarray:
    """Pillow's decode as convert asks for it: draft, then the EXIF turn when asked."""
    img = Image.open(io.BytesIO(data))
    img.draft(img.mode, (opts.size, opts.size))
    img = ImageOps.exif_transpose(img) if opts.exif_transpose else img
    return np.asarray(img.convert("RGB"))


@pytest.mark.parametrize("name", ["default", "size-64-dct-scaled", "size-8", "short-side",
                                  "exif-transpose", "exif-transpose-short-side"])
def test_the_decoded_pixels_are_pillows_draft_decode(name: str) -> None:
    """Pixel for pixel, wherever the box and the filter's reach lie, and the box is the
    crop (center-crop) or the whole image (short-side) at the draft scale."""
    opts = OPTIONS[name]
    for quirk, path in PATHS.items():
        if path in (None, "failed") or quirk in ("corrupt-middle", "restart-out-of-order"):
            continue
        data = QUIRKS[quirk]()
        status, _, rgbx, w, h, box, out_w, out_h, _ = frame(data, opts)
        assert status == native.CONVERTED, quirk
        want = _pillow_frame(data, opts)
        full_h, full_w = want.shape[:2]
        side = min(full_w, full_h)
        if opts.resize == "center-crop":
            left, top, right, bottom = ((full_w - side) // 2, (full_h - side) // 2,
                                        (full_w + side) // 2, (full_h + side) // 2)
            assert (out_w, out_h) == (opts.size, opts.size)
        else:
            left, top, right, bottom = 0, 0, full_w, full_h
            assert min(out_w, out_h) == opts.size
        x0, y0 = left - int(box[0]), top - int(box[1])
        assert box == (left - x0, top - y0, right - x0, bottom - y0), quirk
        got = np.frombuffer(rgbx, np.uint8).reshape(h, w, 4)[..., :3]
        np.testing.assert_array_equal(got, want[y0:y0 + h, x0:x0 + w], err_msg=quirk)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_turns_as_pillow_turns(orientation: int,
                                                      pillow_decodes: None) -> None:
    opts = [OPTIONS["exif-transpose"], OPTIONS["exif-transpose-short-side"],
            TransformOptions(exif_transpose=True, size=64)]
    for size, subsampling in (((400, 240), 2), ((333, 517), 0), ((2100, 1500), 1)):
        data = _oriented(orientation, size, subsampling)
        theirs = [outcome(data, o) for o in opts]
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(native, "JPEG_MAGIC", b"\xff\xd8\xff")
            assert [outcome(data, o) for o in opts] == theirs, (orientation, size)


def test_an_unreadable_exif_block_leaves_the_image_as_stored() -> None:
    data = bytearray(_oriented(6))
    at = data.index(b"Exif\0\0") + 6
    data[at:at + 2] = b"XX"  # not a TIFF header
    plain = outcome(bytes(data), TransformOptions())
    assert outcome(bytes(data), OPTIONS["exif-transpose"]) == plain


def test_exif_orientation_is_ignored_unless_asked() -> None:
    data = _oriented(6)
    assert outcome(data, TransformOptions())[2] == (400, 240)
    plain, turned = (outcome(data, o, True)[6] for o in (OPTIONS["short-side"],
                                                          OPTIONS["exif-transpose-short-side"]))
    assert len(plain) == len(turned) == 427 * 256 * 3 and plain != turned


def _markers(data: bytes) -> list[int]:
    out, i = [], 2
    while data[i + 1] != 0xDA:
        out.append(data[i + 1])
        i += 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
    return out


def test_no_marker_of_the_original_reaches_the_output() -> None:
    """The same markers every time: the original's comment, EXIF, XMP and ICC profile stay
    behind (the output is re-encoded pixels; a camera's "quality = 75" would be wrong)."""
    for quirk in ("icc-and-comment", "exif-orientation-6", "xmp-orientation-8", "png-as-jpeg"):
        out = native.convert_native(QUIRKS[quirk](), TransformOptions()).jpeg
        assert _markers(out) == [0xE0, 0xDB, 0xDB, 0xC0, 0xC4, 0xC4, 0xC4, 0xC4], quirk


def test_the_original_is_described_as_pillow_describes_it() -> None:
    for quirk in ("landscape-420", "grayscale", "mpo", "cmyk", "png-as-jpeg", "adobe-rgb"):
        data = QUIRKS[quirk]()
        c = native.convert_native(data, TransformOptions())
        with Image.open(io.BytesIO(data)) as img:
            assert (c.original_size, c.original_mode, c.original_format) == (
                img.size, img.mode, img.format), quirk


@pytest.mark.parametrize("make,opts,words", [
    (QUIRKS["truncated"], TransformOptions(), "truncated JPEG"),
    (lambda: jpeg((400, 300), seed=5)[:-10], TransformOptions(), "truncated JPEG"),
    (lambda: jpeg((200, 150)), TransformOptions(max_pixels=200 * 150 - 1), "--max-pixels"),
    (lambda: encode(photo((2, 4000)), "JPEG"),
     TransformOptions(resize="short-side", max_pixels=10_000_000), "256x512000"),
])
def test_what_cannot_be_converted_fails_with_its_reason(make: Callable[[], bytes],
                                                        opts: TransformOptions,
                                                        words: str) -> None:
    with pytest.raises(ImageError, match=words):
        native.convert_native(make(), opts)


def test_a_jpeg_declaring_a_bomb_is_refused_before_decoding() -> None:
    data = bytearray(jpeg((64, 48), seed=6))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", 30_000, 30_000)
    status, message, *_ = frame(bytes(data), TransformOptions())
    assert status == native.FAILED and "decompression bomb" in message
    with pytest.raises(ImageError, match="bomb"):
        native.convert_native(bytes(data), TransformOptions())


def test_threads_convert_at_once_to_the_same_bytes() -> None:
    """Each thread has its own scratch, and the GIL is released while the C path runs."""
    blobs = [make() for make in QUIRKS.values()] * 3
    opts = [OPTIONS["default"], OPTIONS["exif-transpose-short-side"], OPTIONS["size-64-dct-scaled"]]
    jobs = [(b, o) for b in blobs for o in opts]
    alone = [outcome(b, o) for b, o in jobs]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda job: outcome(*job), jobs)) == alone


def test_a_fuzzed_exif_block_converts_or_fails_cleanly() -> None:
    """Random bytes in the EXIF segment (which the C path parses under --exif-transpose)."""
    base = _oriented(6, (160, 96))
    at = base.index(b"Exif\0\0")
    rng = np.random.default_rng(7)
    seen = set()
    for _ in range(400):
        data = bytearray(base)
        for _ in range(int(rng.integers(1, 6))):
            data[at + int(rng.integers(0, 40))] = int(rng.integers(0, 256))
        got = outcome(bytes(data), OPTIONS["exif-transpose"])
        seen.add(got[0] == "error" or got[1])
    assert (256, 256) in seen


@pytest.mark.parametrize("call,args,words", [
    ("convert", (b"", 0, 0, 1, 90, False, False, False, False, MAX, BOMB), "size"),
    ("convert", (b"", 256, 2, 1, 90, False, False, False, False, MAX, BOMB), "resize"),
    ("convert", (b"", 256, 0, 0, 90, False, False, False, False, MAX, BOMB), "filter"),
    ("convert", (b"", 256, 0, 9, 90, False, False, False, False, MAX, BOMB), "filter"),
    ("convert", (b"", 256, 0, 1, 0, False, False, False, False, MAX, BOMB), "quality"),
    ("convert", (b"", 256, 0, 1, 90, False, False, False, False, 0, BOMB), "max_pixels"),
    ("finish", (b"\0" * 11, 2, 2, 2, 2, 256, 0, 1, 90, False, False, MAX), "bytes"),
    ("finish", (b"", 0, 2, 2, 2, 256, 0, 1, 90, False, False, MAX), "at least 1"),
    ("finish", (b"\0" * 12, 2, 2, 2, 2, 256, 0, 1, 101, False, False, MAX), "quality"),
    ("frame", (b"", 256, 0, 7, MAX, False, False, BOMB), "filter"),
])
def test_the_extension_refuses_bad_arguments(call: str, args: tuple[object, ...],
                                             words: str) -> None:
    with pytest.raises(ValueError, match=words):
        getattr(ext, call)(*args)


# ---------------------------------------------------------------------------- the real sample


def _originals(real_data: Path) -> list[Path]:
    return sorted(p for p in real_data.rglob("*.JPEG")
                  if p.parent.name == "images" or "originals" in p.parts)


@pytest.mark.realdata
@pytest.mark.slow
@pytest.mark.parametrize("name,every", [("default", 1), ("filter-bilinear", 4),
                                        ("size-64-dct-scaled", 4), ("exif-transpose", 8),
                                        ("short-side", 8)])
def test_every_sample_original_converts_the_same_every_way(real_data: Path, name: str,
                                                           every: int,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """The real originals (sizes, subsamplings, ICC profiles, comments, EXIF, grayscale,
    progressive and the PNG named .JPEG as ImageNet has them): a region or the whole image
    decoded, or Pillow's decode, give the same bytes."""
    files = _originals(real_data)[::every]
    opts = OPTIONS[name]
    ours = {f.name: outcome(f.read_bytes(), opts) for f in files}
    whole = [f.name for f in files if outcome(f.read_bytes(), opts, False) != ours[f.name]]
    assert not whole, whole[:5]
    monkeypatch.setattr(native, "JPEG_MAGIC", b"never a prefix")
    pillow = [f.name for f in files if outcome(f.read_bytes(), opts) != ours[f.name]]
    assert not pillow, pillow[:5]
    paths = [frame(f.read_bytes(), opts)[-1] for f in files]
    if opts.resize == "center-crop":
        assert paths.count(REGION) > 0.85 * len(files), (paths.count(REGION), len(files))


def _sharpness(pixels: np.ndarray) -> float:
    """The mean absolute Laplacian of the luma."""
    y = pixels.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    lap = 4 * y[1:-1, 1:-1] - y[:-2, 1:-1] - y[2:, 1:-1] - y[1:-1, :-2] - y[1:-1, 2:]
    return float(np.abs(lap).mean())


def test_the_filters_keep_their_character() -> None:
    """Each filter is as much sharper (or softer) than bilinear as under Pillow's resize of
    the same decoded square: Lanczos sharpest of the antialiased ones, box the blockiest."""
    datas = [QUIRKS[q]() for q in ("landscape-420", "portrait-444", "draft-scaled",
                                   "elongated", "odd-size", "under-256")]
    ours, pillows = {}, {}
    for f in FILTER_NAMES:
        opts = TransformOptions(filter=f)
        ours[f] = sum(_sharpness(native.convert_native(d, opts, pixels=True).pixels)
                      for d in datas)
        pillows[f] = 0.0
        for d in datas:
            img = Image.open(io.BytesIO(d))
            img.draft("RGB", (256, 256))
            w, h = img.size
            s = min(w, h)
            box = ((w - s) // 2, (h - s) // 2, (w + s) // 2, (h + s) // 2)
            out = img.resize((256, 256), Image.Resampling[f.upper()], box=box)
            pillows[f] += _sharpness(np.asarray(out.convert("RGB")))
    for f in FILTER_NAMES:
        assert ours[f] / ours["bilinear"] == pytest.approx(pillows[f] / pillows["bilinear"],
                                                           rel=0.01), f
    assert ours["lanczos"] > ours["bicubic"] > ours["bilinear"]


def _scan(data: bytes) -> tuple[int, dict[str, object]]:
    """The extension's status and what reading ``data`` to its end found."""
    r = ext.convert(data, 256, 0, native.FILTER_CODES["lanczos"], 90, False, False, False,
                    False, MAX, BOMB)
    return r[0], r[-1]


def test_the_data_is_read_to_its_end_and_what_it_holds_is_reported() -> None:
    """Below the crop too: a file cut short, padded, or followed by other bytes is seen
    wherever the damage lies (the report the damage rule reads)."""
    whole = jpeg((300, 200), seed=40)
    status, scan = _scan(whole)
    assert status == native.CONVERTED
    assert scan == {"warnings": 0, "first": "", "eof": 0, "hit_marker": 0, "padding": 0,
                    "trailing": 0, "error": "", "refused": 0}
    assert _scan(whole + b"\0trailing")[1]["trailing"] == 9
    status, scan = _scan(whole[:-2] + bytes(70_000) + b"\xff\xd9")
    assert status == native.CONVERTED and 69_000 < scan["padding"] <= 70_000
    status, scan = _scan(whole[:len(whole) * 2 // 3] + b"\xff\xd9")
    assert status == native.CONVERTED and scan["hit_marker"] == 1
    assert "premature end of data segment" in str(scan["first"])
    status, scan = _scan(whole[:len(whole) * 2 // 3])
    assert status == native.FAILED and scan["eof"] == 1
    portrait = jpeg((200, 900), seed=41)  # the crop stops at row 550 of 900
    cut = portrait[:len(portrait) * 9 // 10] + b"\xff\xd9"
    assert frame(portrait, TransformOptions())[-1] == REGION
    assert _scan(cut)[1]["hit_marker"] == 1
