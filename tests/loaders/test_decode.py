"""The extension's decode path: its pixels are Pillow's decode of the same image resampled by
imgprep's resampler, byte for byte, on every sample image and every quirk (whichever Pillow
is installed), and with pillow-simd the Pillow path's too; what libjpeg-turbo cannot decode
goes to Pillow; the loader's batches, errors and skips do not depend on which path made them
where the Pillow path's resize is pillow-simd's."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, features

from imgprep import jpegcrop, resample
from imgprep.job.world import World
from imgprep.shards.info import pil_info
from loaders import LoaderOptions
from loaders.decode import SampleDecoder
from loaders.shards import LoaderError, ShardLoader
from loaders.transforms import (
    SampleError,
    TrainTransform,
    Transform,
    ValTransform,
    apply,
    crop_box,
    pillow_decode,
    uniform,
)
from tests.support import jpeg
from tests.support.images import encode, photo
from tests.support.paths import REAL_DATA
from tests.support.shards import run_epoch, write_split

SAMPLE_IMAGES = REAL_DATA / "images"
pytestmark = pytest.mark.skipif(not jpegcrop.AVAILABLE,
                                reason=f"crop-aware decoder: {jpegcrop.status()}")
PILLOW_SIMD = pil_info(check_avx2=False).pillow_simd
# libjpeg-turbo releases conceal corrupt data differently: where PIL's is another release than
# the extension's, Pillow's pixels of a corrupt file are no reference for the extension's.
_LIB = jpegcrop.library()
SAME_LIBJPEG = _LIB is not None and features.version("libjpeg_turbo") == _LIB.version
needs_pillow_simd = pytest.mark.skipif(
    not PILLOW_SIMD, reason="the Pillow path resizes with the installed PIL, which is not "
    "pillow-simd: its bytes differ from the resampler's by a unit or two")

TRANSFORMS: dict[str, Transform] = {
    "train224": TrainTransform(),
    "train64-dct-scaled": TrainTransform(size=64),  # crops >= 2x the output: draft at 1/2..1/8
    "train-noflip": TrainTransform(size=48, scale=(0.5, 1.0), flip=False),
    "val224": ValTransform(),
    "val-resized": ValTransform(size=64, resize=73),
    "val-upscaled": ValTransform(size=224, resize=300),
}


def _truncated() -> bytes:
    data = jpeg((200, 150), seed=3)
    return data[: len(data) * 2 // 3]


def _corrupt_middle() -> bytes:
    data = bytearray(jpeg((256, 256), seed=4))
    mid = len(data) // 2
    data[mid:mid + 40] = bytes(b ^ 0x5A for b in data[mid:mid + 40])
    return bytes(data)


QUIRKS: dict[str, Callable[[], bytes]] = {
    "rgb-420": lambda: jpeg((256, 256), seed=1),
    "rgb-444": lambda: encode(photo((200, 130), 2), "JPEG", quality=95, subsampling=0),
    "rgb-422": lambda: encode(photo((130, 200), 5), "JPEG", quality=80, subsampling=1),
    "odd-size": lambda: jpeg((257, 131), seed=6),
    "tiny": lambda: jpeg((9, 7), seed=7),
    "grayscale": lambda: jpeg((180, 240), seed=8, mode="L"),
    "cmyk": lambda: jpeg((160, 120), seed=9, mode="CMYK"),
    "progressive": lambda: encode(photo((240, 180), 10), "JPEG", quality=90, progressive=True),
    "png-as-jpeg": lambda: encode(photo((120, 90), 11), "PNG"),
    "truncated": _truncated,
    "corrupt-middle": _corrupt_middle,
    "trailing-bytes": lambda: jpeg((150, 150), seed=12) + b"\x00garbage after EOI",
    "header-garbage": lambda: b"\xff\xd8\xff" + bytes(range(200)),
}
DECLINED = {"cmyk", "progressive", "png-as-jpeg", "truncated", "trailing-bytes",
            "header-garbage"}


def outcome(fn: Callable[[np.ndarray, np.random.Generator], None], shape: tuple[int, ...],
            seed: int) -> tuple[bytes | str, float]:
    """What one decode gives: the pixels or the error's type, and the rng's next draw (so
    that both paths are seen to consume the same draws)."""
    out, rng = np.full(shape, 7, np.uint8), np.random.default_rng([seed, 1])
    try:
        fn(out, rng)
        result: bytes | str = out.tobytes()
    except SampleError as e:
        result = type(e).__name__
    return result, float(rng.random())


def reference(data: bytes, t: Transform, rng: np.random.Generator, out: np.ndarray,
              planar: bool) -> None:
    """Pillow's whole decode (drafted as the Pillow path drafts it), then imgprep's
    resampler: what the extension's path must give, whichever Pillow is installed."""
    img, g, box = pillow_decode(data, t, rng)
    try:
        pixels = np.asarray(img)
    except OSError as e:
        raise SampleError(str(e)) from e
    left, top, right, bottom = g.crop
    whole = (0.0, 0.0, float(img.width), float(img.height))
    resample.resize(pixels, box or whole, g.resize or img.size, out,
                    window=(left, top, right - left, bottom - top), flip=g.flip, planar=planar)


def same_as_pillow(data: bytes, t: Transform, channels_last: bool, seed: int,
                   decoder: SampleDecoder, corrupt: bool = False) -> bool:
    """The extension's path gives the reference's outcome (and, with pillow-simd, the
    Pillow path's); of a ``corrupt`` file, only the kind of outcome unless PIL runs the
    extension's libjpeg-turbo release."""
    shape = (t.size, t.size, 3) if channels_last else (3, t.size, t.size)
    fast = outcome(lambda o, r: decoder(data, r, o), shape, seed)
    ref = outcome(lambda o, r: reference(data, t, r, o, not channels_last), shape, seed)
    if corrupt and not SAME_LIBJPEG:
        return type(fast[0]) is type(ref[0]) and fast[1] == ref[1]
    if PILLOW_SIMD:
        slow = outcome(lambda o, r: apply(data, t, r, o, planar=not channels_last), shape, seed)
        return fast == ref == slow
    return fast == ref


@pytest.mark.parametrize("quirk", QUIRKS)
@pytest.mark.parametrize("name", TRANSFORMS)
def test_quirks_decode_as_pillow_does(quirk: str, name: str) -> None:
    data, t = QUIRKS[quirk](), TRANSFORMS[name]
    for channels_last in (False, True):
        decoder = SampleDecoder(t, channels_last=channels_last, fast=True)
        for seed in range(4):
            assert same_as_pillow(data, t, channels_last, seed, decoder,
                                  corrupt=quirk == "corrupt-middle"), (quirk, seed)
    if quirk in DECLINED:
        assert decoder.fast_count == 0
    elif quirk != "corrupt-middle":  # that one is decoded whole once libjpeg warns
        assert decoder.pillow_count == decoder.whole_count == 0
    if quirk in ("progressive", "trailing-bytes"):  # decoded whole by libjpeg-turbo
        assert decoder.whole_count > 0 and decoder.pillow_count == 0
    if quirk in ("cmyk", "png-as-jpeg"):
        assert decoder.pillow_count > 0


@pytest.mark.parametrize("name", TRANSFORMS)
def test_a_geometry_drawn_once_is_what_the_pillow_path_carries_out(name: str) -> None:
    """The transform draws a sample's geometry (train: its box, then its flip) from the
    generator and the image size alone; handed that geometry, the Pillow path draws nothing
    more and makes the pixels it makes when it draws for itself."""
    t, data = TRANSFORMS[name], QUIRKS["odd-size"]()
    shape = (3, t.size, t.size)
    for seed in range(6):
        own, given = np.empty(shape, np.uint8), np.empty(shape, np.uint8)
        rng, again = np.random.default_rng(seed), np.random.default_rng(seed)
        apply(data, t, rng, own)
        g = t.geometry(257, 131, again)
        assert rng.random() == again.random()  # the same draws, in the same order
        idle = np.random.default_rng(99)
        apply(data, t, idle, given, geometry=g)
        assert idle.random() == np.random.default_rng(99).random()  # nothing drawn
        assert np.array_equal(own, given)
        if isinstance(t, TrainTransform):
            box_rng = np.random.default_rng(seed)
            box = crop_box(257, 131, t, box_rng)
            assert g.box == box and g.flip == (t.flip and bool(box_rng.random() < 0.5))


def test_probe_names_why_it_declines() -> None:
    reasons = {q: jpegcrop.probe(QUIRKS[q]()).reason for q in QUIRKS}
    assert {q for q, r in reasons.items() if r is not None} == DECLINED
    assert "progressive" in str(reasons["progressive"])
    assert "CMYK" in str(reasons["cmyk"])
    assert "EOI" in str(reasons["truncated"]) and "EOI" in str(reasons["trailing-bytes"])
    p = jpegcrop.probe(QUIRKS["odd-size"]())
    assert (p.width, p.height) == (257, 131)


@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_any_region_holds_the_full_decode(scale: int) -> None:
    """Random regions, at every DCT scale and chroma subsampling, grayscale too, against
    Pillow's full decode at that scale: the crop's edge columns and the rows after a skip
    keep the full decode's upsampling context; reading on to the end of the file (``whole``)
    changes no pixel of the region and finds nothing wrong with a clean file."""
    rng = np.random.default_rng(scale)
    frame = jpegcrop.Frame()
    images = [(size, sub, mode) for size in [(256, 256), (500, 375), (333, 517), (64, 48)]
              for sub, mode in [(2, "RGB"), (1, "RGB"), (0, "RGB"), (2, "L")]]
    for seed, (size, subsampling, mode) in enumerate(images):
        data = encode(photo(size, seed).convert(mode), "JPEG", quality=90,
                      subsampling=subsampling)
        img = Image.open(io.BytesIO(data))
        img.draft("RGB", (size[0] // scale, size[1] // scale))
        full = np.asarray(img.convert("RGB"))
        p = jpegcrop.probe(data)
        h, w = full.shape[:2]
        assert jpegcrop.draft_scale(*size, (size[0] // scale, size[1] // scale)) * w >= size[0]
        for k in range(8):
            x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
            x1, y1 = int(rng.integers(x0 + 1, w + 1)), int(rng.integers(y0 + 1, h + 1))
            got, scan = frame.decode(data, p, -(-size[0] // w), (x0, y0, x1, y1),
                                     whole=k % 2 == 1)
            assert got is not None and got.size == (w, h) and scan == jpegcrop.Scan()
            region = np.asarray(got)[y0:y1, x0:x1, :3]
            assert np.array_equal(region, full[y0:y1, x0:x1]), (size, subsampling, mode,
                                                                (x0, y0, x1, y1))


def test_draft_scale_is_pillows() -> None:
    for size, req in [((500, 375), (224, 224)), ((2000, 1500), (224, 224)),
                      ((256, 256), (300, 300)), ((4000, 3000), (200, 900))]:
        img = Image.open(io.BytesIO(jpeg(size)))
        img.draft("RGB", req)
        s = jpegcrop.draft_scale(*size, req)
        assert img.size == (-(-size[0] // s), -(-size[1] // s))


@pytest.mark.parametrize("planar", [True, False])
@pytest.mark.parametrize("flip", [True, False])
def test_pack_is_the_pixel_array_cropped_mirrored_and_laid_out(planar: bool,
                                                               flip: bool) -> None:
    img = photo((37, 23), 3).convert("RGB")
    hwc = np.asarray(img)
    box = (5, 2, 30, 21)
    want = hwc[box[1]:box[3], box[0]:box[2]]
    want = want[:, ::-1] if flip else want
    want = want.transpose(2, 0, 1) if planar else want
    out = np.empty(want.shape, np.uint8)
    jpegcrop.pack(img, 37, box, out, flip=flip, planar=planar)
    assert np.array_equal(out, want)
    frame = np.zeros((23, 37, 4), np.uint8)
    frame[..., :3] = hwc
    jpegcrop.pack(frame.reshape(-1), 37, box, out, flip=flip, planar=planar)
    assert np.array_equal(out, want)
    with pytest.raises(ValueError, match="outside"):
        jpegcrop.pack(img, 37, (5, 2, 38, 21), out, flip=flip, planar=planar)


REAL_CASES = [("train224", False), ("train224", True), ("train64-dct-scaled", True),
              ("val224", False), ("val-resized", True)]


@pytest.mark.realdata
@pytest.mark.slow
@pytest.mark.parametrize("part,name,channels_last", [(k, *c) for k, c in enumerate(REAL_CASES)])
def test_every_sample_image_decodes_as_pillow_does(part: int, name: str,
                                                   channels_last: bool) -> None:
    """The 1,000 real originals (sizes, subsamplings and encoders as ImageNet has them) and
    the same images as 256 px shards hold them: each case takes every fifth image, so that
    the cases together decode each image once (each path three times: the extension, the
    reference and Pillow's)."""
    if not SAMPLE_IMAGES.is_dir():
        pytest.skip(f"{SAMPLE_IMAGES} is absent (the real sample images)")
    t = TRANSFORMS[name]
    decoder = SampleDecoder(t, channels_last=channels_last, fast=True)
    files = sorted(SAMPLE_IMAGES.iterdir())
    differ = []
    for i in range(part, len(files), len(REAL_CASES)):
        data = files[i].read_bytes()
        if i % 4 == 0:  # a quarter again as a 256 px shard holds it
            data = encode(Image.open(files[i]).convert("RGB").resize((256, 256)), "JPEG",
                          quality=90)
        if not same_as_pillow(data, t, channels_last, i, decoder):
            differ.append(files[i].name)
    checked = len(range(part, len(files), len(REAL_CASES)))
    assert not differ, differ[:5]
    assert decoder.fast_count > 0.9 * checked, (decoder.fast_count, decoder.pillow_count)


# ---------------------------------------------------------------------------- in the loader


@pytest.fixture(scope="module")
def quirky(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A train split of 24 samples: every quirk above among good JPEGs."""
    folder = tmp_path_factory.mktemp("quirky")
    quirks = list(QUIRKS.values())
    write_split(folder, "train", (9, 8, 7),
                lambda i: quirks[i % len(quirks)]() if i % 2 else jpeg((256, 256), seed=i))
    return folder


def loader_outcome(folder: Path, workers: int, on_error: str, ranks: int = 2
                   ) -> list[object]:
    results: list[object] = []
    for rank in range(ranks):
        world = World(rank=rank, world_size=ranks, local_rank=rank, local_world_size=ranks)
        loader = ShardLoader(folder, "train", world, LoaderOptions(
            batch_size=2, workers=workers, transform=TrainTransform(size=40), on_error=on_error))
        try:
            results.append([torch.cat([b[0].flatten(), b[1]]) for b in run_epoch(loader, 1)])
            results.append(loader.skipped)
        except LoaderError as e:  # its words, not the worker's traceback (lines of code)
            results.append(str(e).strip().splitlines()[-1])
    return results


@needs_pillow_simd
@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("workers", [0, 2])
def test_loader_is_the_same_with_the_fallback_forced(quirky: Path, workers: int, on_error: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches, skipped counts and error messages (under both on_error policies) do not
    depend on the decode path: the workers inherit the forced fallback."""
    fast = loader_outcome(quirky, workers, on_error)
    monkeypatch.setattr(jpegcrop, "AVAILABLE", False)
    slow = loader_outcome(quirky, workers, on_error)
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow, strict=True):
        if isinstance(a, list):
            assert isinstance(b, list) and len(a) == len(b)
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        else:
            assert a == b
    if on_error == "raise":
        assert any(isinstance(x, str) and any(w in x for w in (
            "cannot decode", "not a decodable", "truncated JPEG")) for x in fast)
    else:
        assert sum(x for x in fast if isinstance(x, int)) > 0


def test_crop_decode_false_decodes_every_image_the_pillow_way(quirky: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """``crop_decode=False``: no JPEG is even probed for the extension's path, and with
    pillow-simd the batches are the same."""
    def run(crop_decode: bool | None) -> list[torch.Tensor]:
        loader = ShardLoader(quirky, "train", World(), LoaderOptions(
            batch_size=2, workers=0, transform=TrainTransform(size=40), on_error="skip",
            crop_decode=crop_decode))
        return [torch.cat([b[0].flatten(), b[1]]) for b in run_epoch(loader, 1)]

    default = run(None)

    def refuse(data: bytes) -> None:
        raise AssertionError("probed a JPEG with crop_decode=False")

    monkeypatch.setattr(jpegcrop, "probe", refuse)
    pillow = run(False)
    assert len(default) == len(pillow)
    if PILLOW_SIMD:  # whose resize is the resampler's, byte for byte
        assert all(torch.equal(a, b) for a, b in zip(default, pillow, strict=True))


def test_crop_decode_true_is_refused_where_the_extension_is_not_built(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert LoaderOptions(batch_size=2, crop_decode=True).crop_decode
    monkeypatch.setattr(jpegcrop, "AVAILABLE", False)
    with pytest.raises(ValueError, match="crop_decode=True, but the crop-aware decoder is"):
        LoaderOptions(batch_size=2, crop_decode=True)
    assert LoaderOptions(batch_size=2, crop_decode=False).crop_decode is False


@pytest.mark.parametrize("low, high", [(0.08, 1.0), (-0.2876820724517809, 0.2876820724517809),
                                       (0.5, 0.5), (-3.0, 7.25)])
def test_uniform_is_numpys_uniform_draw_for_draw(low: float, high: float) -> None:
    """The crop draw's ``uniform`` gives ``Generator.uniform``'s doubles, bit for bit, and
    leaves the stream where it leaves it: the boxes, and every pinned batch, do not move."""
    ours, numpys = np.random.default_rng(7), np.random.default_rng(7)
    got = [uniform(ours, low, high) for _ in range(50_000)]
    want = numpys.uniform(low, high, 50_000).tolist()
    assert got == want
    assert ours.integers(1 << 62) == numpys.integers(1 << 62)
