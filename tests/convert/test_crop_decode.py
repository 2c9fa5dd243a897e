"""Convert's crop-aware decode gives the whole-image path's bytes: on every real sample
original, on every quirk, under every transform option; what it declines takes the
whole-image path; a frame's pixels outside what the resample reads never matter."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imgprep import jpegcrop
from imgprep.convert import image
from imgprep.convert.image import FILTERS, Converted, convert_image
from imgprep.errors import ImageError
from imgprep.sections import FILTER_NAMES, TransformOptions
from tests.support import encode, jpeg, photo

pytestmark = pytest.mark.skipif(not jpegcrop.AVAILABLE,
                                reason=f"crop-aware decoder: {jpegcrop.status()}")


def _corrupt(data: bytes, at: float) -> bytes:
    """``data`` with 40 bytes XOR-ed at fraction ``at`` of its length."""
    out = bytearray(data)
    i = int(len(out) * at)
    out[i:i + 40] = bytes(b ^ 0x5A for b in out[i:i + 40])
    return bytes(out)


def _restart_out_of_order() -> bytes:
    """A JPEG whose middle restart marker has the wrong number: libjpeg warns and resyncs."""
    data = bytearray(encode(photo((380, 260), 12), "JPEG", quality=90, restart_marker_rows=1))
    scan = data.index(b"\xff\xda")
    rst = [i for i in range(scan, len(data) - 1)
           if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]
    i = rst[len(rst) // 2]
    data[i + 1] = 0xD0 + (data[i + 1] - 0xD0 + 3) % 8
    return bytes(data)


def _exif_rotated() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6
    return encode(photo((400, 240), 13), "JPEG", quality=90, exif=exif.tobytes())


def _with_icc_and_comment() -> bytes:
    """A JPEG with an ICC profile (carried in the source's info, never applied) and a
    comment (which the whole-image path's output keeps)."""
    return encode(photo((420, 300), 14), "JPEG", quality=90, icc_profile=b"\0" * 128,
                  comment=b"made by a camera")


def _mpo() -> bytes:
    buf = io.BytesIO()
    photo((320, 240), 15).save(buf, "MPO", save_all=True, append_images=[photo((320, 240), 16)])
    return buf.getvalue()


QUIRKS: dict[str, Callable[[], bytes]] = {
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
    "exif-orientation-6": _exif_rotated,
    "grayscale": lambda: jpeg((300, 200), seed=17, mode="L"),
    "cmyk": lambda: jpeg((300, 200), seed=18, mode="CMYK"),
    "adobe-rgb": lambda: encode(photo((300, 200), 19), "JPEG", quality=90, keep_rgb=True),
    "progressive": lambda: encode(photo((300, 200), 20), "JPEG", quality=90, progressive=True),
    "mpo": _mpo,
    "png-as-jpeg": lambda: encode(photo((300, 200), 21), "PNG"),
    "truncated": lambda: (d := jpeg((300, 200), seed=22))[: len(d) * 2 // 3],
    "restart-out-of-order": _restart_out_of_order,
    "corrupt-middle": lambda: _corrupt(jpeg((400, 300), seed=23), 0.5),
    "corrupt-below-the-crop": lambda: _corrupt(jpeg((200, 600), seed=24), 0.93),
    "trailing-bytes": lambda: jpeg((300, 200), seed=25) + b"\x00garbage after EOI",
    "header-garbage": lambda: b"\xff\xd8\xff" + bytes(range(200)),
    "empty": lambda: b"",
}
# the baseline YCbCr JPEGs that the crop-aware path takes under the default options, and
# what it declines (corrupt data goes either way: only the bytes are promised)
TAKEN = {"landscape-420", "portrait-444", "landscape-422", "draft-scaled", "elongated",
         "odd-size", "under-256", "one-column", "restart-markers", "icc-and-comment",
         "exif-orientation-6", "square", "tiny", "grayscale"}
DECLINED = {"cmyk", "adobe-rgb", "progressive", "mpo", "png-as-jpeg",
            "truncated", "restart-out-of-order", "trailing-bytes", "header-garbage", "empty"}

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


def test_outcome_compares_every_field_of_a_conversion() -> None:
    assert [f.name for f in fields(Converted)] == [
        "jpeg", "image", "original_size", "original_mode", "original_format", "warning"]


def outcome(data: bytes, opts: TransformOptions, crop_decode: bool) -> tuple[object, ...]:
    """Everything a conversion gives (the bytes, the image the statistics read, the facts
    kept about the original), or the error's message."""
    try:
        c = convert_image(data, opts, crop_decode=crop_decode)
    except ImageError as e:
        return ("error", str(e))
    return (c.jpeg, c.image.mode, c.image.size, c.image.tobytes(), c.image.info,
            c.original_size, c.original_mode, c.original_format, c.warning)


@pytest.fixture
def poisoned(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """Every frame filled with a pattern before its decode (so pixels outside the decoded
    region cannot match by luck); yields a list that records, per conversion, whether the
    crop-aware path made it."""
    view, crop_decoded = jpegcrop.Frame.view, image._crop_decoded
    taken: list[bool] = []

    def poisoned_view(self: jpegcrop.Frame, width: int, height: int
                      ) -> tuple[np.ndarray, Image.Image]:
        buf, img = view(self, width, height)  # Frame.decode asks for it before decoding
        buf.fill(0xA5)
        return buf, img

    def spy(data: bytes, img: Image.Image, opts: TransformOptions) -> object:
        got = crop_decoded(data, img, opts)
        taken.append(got[0] is not None)
        return got

    monkeypatch.setattr(jpegcrop.Frame, "view", poisoned_view)
    monkeypatch.setattr(image, "_crop_decoded", spy)
    yield taken


@pytest.mark.parametrize("name", OPTIONS)
def test_every_quirk_converts_to_the_same_bytes_either_way(name: str,
                                                           poisoned: list[bool]) -> None:
    opts = OPTIONS[name]
    for quirk, make in QUIRKS.items():
        data = make()
        poisoned.clear()
        fast = outcome(data, opts, crop_decode=True)
        assert fast == outcome(data, opts, crop_decode=False), quirk
        if name == "default" and quirk in TAKEN:
            assert poisoned == [True], quirk
        elif name == "default" and quirk in DECLINED:
            assert True not in poisoned, quirk


def test_the_forced_whole_image_path_never_decodes_a_region(poisoned: list[bool]) -> None:
    for make in QUIRKS.values():
        outcome(make(), TransformOptions(), crop_decode=False)
    assert poisoned == []


def test_what_the_path_declines_under_other_options(poisoned: list[bool],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    data = QUIRKS["landscape-420"]()
    for opts in (OPTIONS["short-side"], OPTIONS["exif-transpose"]):
        outcome(data, opts, crop_decode=True)
    assert poisoned == [True, False]  # short-side decodes all of it, into the same frame
    outcome(QUIRKS["draft-scaled"](), OPTIONS["size-64-dct-scaled"], crop_decode=True)
    assert poisoned[-1] is True
    monkeypatch.setattr(image, "FRAME_PIXELS", 500 * 375 - 1)  # a frame never grows past it
    assert outcome(data, TransformOptions(), True) == outcome(data, TransformOptions(), False)
    assert poisoned[-1] is False


@pytest.mark.parametrize("resample", FILTER_NAMES)
def test_a_resample_reads_nothing_beyond_its_reach(resample: str) -> None:
    """Pixels outside ``jpegcrop.reach`` of a box may hold anything: the resample is the
    same."""
    rng = np.random.default_rng(len(resample))
    src = np.asarray(photo((300, 220), 30).convert("RGBX"))
    h, w = src.shape[:2]
    for _ in range(20):
        x0, y0 = int(rng.integers(0, w - 1)), int(rng.integers(0, h - 1))
        box = (x0, y0, int(rng.integers(x0 + 1, w + 1)), int(rng.integers(y0 + 1, h + 1)))
        out = (int(rng.integers(1, 400)), int(rng.integers(1, 400)))
        support = image.FILTER_SUPPORT[resample]
        rx = jpegcrop.reach(box[0], box[2], out[0], w, support)
        ry = jpegcrop.reach(box[1], box[3], out[1], h, support)
        junk = np.full_like(src, 0x5A)
        junk[ry[0]:ry[1], rx[0]:rx[1]] = src[ry[0]:ry[1], rx[0]:rx[1]]
        want = Image.fromarray(src, "RGBX").resize(out, FILTERS[resample], box=box)
        got = Image.fromarray(junk, "RGBX").resize(out, FILTERS[resample], box=box)
        assert got.tobytes() == want.tobytes(), (box, out)


def test_a_frame_keeps_views_for_a_few_sizes_only() -> None:
    """A frame keeps a Pillow view per image size, the last ``VIEWS`` sizes: originals come
    in thousands of sizes."""
    frame = jpegcrop.Frame()
    sizes = [(11, 30 - i) for i in range(jpegcrop.Frame.VIEWS + 1)]  # the buffer never grows
    first = [frame.view(*s)[1] for s in sizes[:jpegcrop.Frame.VIEWS]]
    assert all(frame.view(*s)[1] is v for s, v in zip(sizes, first, strict=False))
    frame.view(*sizes[-1])
    assert len(frame._images) == 1
    assert frame.view(*sizes[0])[1] is not first[0]


# ---------------------------------------------------------------------------- the real sample


def _originals(real_data: Path) -> list[Path]:
    return sorted(p for p in real_data.rglob("*.JPEG")
                  if p.parent.name == "images" or "originals" in p.parts)


@pytest.mark.realdata
@pytest.mark.slow
@pytest.mark.parametrize("name,every", [("default", 1), ("filter-bilinear", 4),
                                        ("filter-box", 4), ("size-64-dct-scaled", 4),
                                        ("size-512-upscaled", 4), ("quality-50", 4),
                                        ("exif-transpose", 8), ("short-side", 8)])
def test_every_sample_original_converts_to_the_same_bytes_either_way(
        real_data: Path, name: str, every: int, poisoned: list[bool]) -> None:
    """The real originals (sizes, subsamplings, ICC profiles, comments, EXIF, grayscale and
    the PNG named .JPEG as ImageNet has them): every one under the default options, a share
    of them under the others."""
    files = _originals(real_data)[::every]
    opts = OPTIONS[name]
    differ = [f.name for f in files
              if outcome(f.read_bytes(), opts, True) != outcome(f.read_bytes(), opts, False)]
    assert not differ, differ[:5]
    if opts.resize == "center-crop" and not opts.exif_transpose:
        assert sum(poisoned) > 0.85 * len(files), (sum(poisoned), len(files))
    if name == "default":
        assert len(files) > 1000
