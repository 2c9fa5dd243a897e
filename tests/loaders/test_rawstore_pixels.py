"""The pixels of stored-pixel samples against the JPEG shard's, on real ImageNet images.

Stored pixels are the JPEG's full-scale decode. So:

- the YUV 4:2:0 record, turned into RGB by the loader's path (chroma upsampling and colour
  conversion fused into the resampler's rows), is the extension's libjpeg-turbo decode of the
  JPEG exactly: the bound on the conversion and upsampling against libjpeg-turbo's is 0;
- a loader crop from stored pixels equals the JPEG path's wherever that decodes at DCT scale
  1 (every 224 px random-resized crop of a 256 px shard image: no difference at all);
- where the JPEG path drafts (a small output from a large crop: it decodes at 1/2, 1/4 or
  1/8 and resamples that, while stored pixels resample the full-scale image), the two differ
  by the draft's loss: measured here, and bounded (mean absolute difference over the images
  within ``MEAN_BOUND`` levels of 255, every image's within ``IMAGE_BOUND``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from imgprep import jpegcrop, rawpixels
from imgprep.convert import native
from imgprep.rawformat import BY_NAME, read_header
from imgprep.sections import TransformOptions
from loaders.decode import SampleDecoder
from loaders.transforms import TrainTransform, ValTransform

pytestmark = pytest.mark.skipif(not (jpegcrop.AVAILABLE and native.AVAILABLE),
                                reason="stored pixels need the extension")
EVERY = 40  # one sample image in 40: 25 of the 1000
MEAN_BOUND = 2.5  # measured 1.06-1.92 (384 px short side), 0.11-1.59 (256 px)
IMAGE_BOUND = 6.0  # measured at most 4.55
DRAWS = 3


@pytest.fixture(scope="module", params=[(256, "center-crop"), (384, "short-side")],
                ids=["256-crop", "384-short"])
def jpegs(request: pytest.FixtureRequest, real_data: Path) -> list[bytes]:
    """Real sample images converted as convert makes them (256 px centre crop, or 384 px on
    the short side: large enough that small outputs draft)."""
    size, resize = request.param
    opts = TransformOptions(size=size, resize=resize)
    files = sorted((real_data / "images").glob("*.JPEG"))[::EVERY]
    return [native.convert_native(f.read_bytes(), opts).jpeg for f in files]


def test_yuv420_rows_are_libjpeg_turbos_decode(jpegs: list[bytes]) -> None:
    for jpeg in jpegs:
        p = jpegcrop.probe(jpeg)
        want = np.empty((p.height, p.width, 3), np.uint8)
        jpegcrop.sample(jpeg, p.width, p.height, draft=None, resize=None, box=None,
                        crop=(0, 0, p.width, p.height), out=want, flip=False, planar=False,
                        whole=True)
        for kind in ("yuv420", "rgb"):
            rec, made = rawpixels.record(jpeg, BY_NAME[kind])
            assert made.name == kind and read_header(rec).size == len(rec)
            got = np.empty_like(want)
            rawpixels.sample(rec, p.width, p.height, resize=None, box=None,
                             crop=(0, 0, p.width, p.height), out=got, flip=False, planar=False)
            assert np.array_equal(got, want), kind


def diffs(jpegs: list[bytes], transform: TrainTransform | ValTransform) -> list[float]:
    """Per image and draw, the mean absolute difference of the JPEG path's row and the
    yuv420 record's, same geometry."""
    decode = SampleDecoder(transform)
    out = []
    for jpeg in jpegs:
        rec, _ = rawpixels.record(jpeg, BY_NAME["yuv420"])
        for seed in range(DRAWS):
            a = np.empty((3, transform.size, transform.size), np.uint8)
            b = np.empty_like(a)
            decode(jpeg, np.random.default_rng(seed), a)
            decode(rec, np.random.default_rng(seed), b)
            out.append(float(np.abs(a.astype(np.int16) - b).mean()))
    assert decode.raw_count == len(out) and decode.fast_count + decode.whole_count == len(out)
    return out


def test_at_dct_scale_one_the_crop_is_the_jpeg_paths(jpegs: list[bytes]) -> None:
    assert max(diffs(jpegs, TrainTransform(size=224))) == 0.0


@pytest.mark.parametrize("transform", [TrainTransform(size=64), TrainTransform(size=112),
                                       ValTransform(size=64)], ids=["rrc64", "rrc112", "val64"])
def test_where_the_jpeg_path_drafts_the_difference_is_bounded(
        jpegs: list[bytes], transform: TrainTransform | ValTransform) -> None:
    d = diffs(jpegs, transform)
    assert np.mean(d) <= MEAN_BOUND and max(d) <= IMAGE_BOUND, (np.mean(d), max(d))


def test_every_kernel_makes_the_same_bytes(jpegs: list[bytes]) -> None:
    """The portable loops and the SIMD ones (the YUV rows' and the resampler's) agree."""
    from imgprep import resample

    kernels = [resample.KERNELS.index(k) for k in resample.kernels()]
    t = TrainTransform(size=96)
    rng = np.random.default_rng(0)
    for jpeg in jpegs[:8]:
        for kind in ("yuv420", "rgb"):
            rec, _ = rawpixels.record(jpeg, BY_NAME[kind])
            head = read_header(rec)
            g = t.geometry(head.width, head.height, rng)
            rows = []
            for k in kernels:
                out = np.empty((t.size, t.size, 3), np.uint8)
                rawpixels.sample(rec, head.width, head.height, resize=g.resize, box=g.box,
                                 crop=g.crop, out=out, flip=g.flip, planar=False, kernel=k)
                rows.append(out)
            assert all(np.array_equal(rows[0], r) for r in rows[1:]), kind
