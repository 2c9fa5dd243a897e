"""Every chroma sampling libjpeg-turbo decodes (each component's factors 1..4 x 1..4, at most
10 blocks an MCU, the full-size factors a whole multiple of each: 311 combinations) gives
the same pixels from a region decode as from the whole image's, at every DCT scale, in the
loader's decode, its one-call sample and convert; and a conversion of such images gives the
same shards whatever the worker count. libjpeg-turbo 2.1.5's ``jpeg_crop_scanline`` left 2x4
and 4x2 components part-upsampled at scales 1/2 and 1/4 (uninitialised memory in the
region), which the build's backport (tools/libjpeg_turbo.py) mends."""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from imgprep import jpegcrop
from imgprep.convert import native
from imgprep.inputs.synsets import imagenet_classes
from imgprep.sections import TransformOptions
from tests.support import photo
from tests.support.cli import invoke

ext = pytest.importorskip("imgprep._jpegcrop", reason=f"C extension: {jpegcrop.status()}")


def _legal() -> list[tuple[int, ...]]:
    out = []
    for f in itertools.product(range(1, 5), repeat=6):
        hs, vs = f[0::2], f[1::2]
        blocks = sum(h * v for h, v in zip(hs, vs, strict=True))
        if blocks <= 10 and all(max(hs) % h == 0 and max(vs) % v == 0
                                for h, v in zip(hs, vs, strict=True)):
            out.append(f)
    return out


SAMPLINGS = _legal()


@functools.cache
def sampled(factors: tuple[int, ...], size: tuple[int, int] = (203, 157)) -> bytes:
    """A photo-like JPEG whose Y, Cb and Cr are sampled (h, v) as ``factors`` say."""
    w, h = size
    rgb = np.asarray(photo(size, sum(factors)).convert("RGB"))
    return bytes(ext.encode(rgb.tobytes(), w, h, 3, 90, factors))


def test_the_combinations_are_the_ones_libjpeg_turbo_decodes() -> None:
    assert len(SAMPLINGS) == 311
    assert (1, 1, 2, 4, 1, 1) in SAMPLINGS and (4, 2, 1, 1, 1, 1) in SAMPLINGS
    assert (4, 4, 1, 1, 1, 1) not in SAMPLINGS  # 18 blocks an MCU: illegal
    assert (3, 1, 2, 1, 1, 1) not in SAMPLINGS  # 3 is not a multiple of 2: not decoded


@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_a_region_decodes_to_the_whole_decodes_pixels_for_every_sampling(scale: int) -> None:
    bad = []
    for f in SAMPLINGS:
        data = sampled(f)
        sw, sh = -(-203 // scale), -(-157 // scale)
        whole = np.zeros(sw * sh * 4, np.uint8)
        ext.decode(data, whole, scale, 0, 0, sw, sh)
        want = whole.reshape(sh, sw, 4)[..., :3]
        for x0, x1, y0 in ((sw // 3, sw * 2 // 3, 0), (1, sw // 2, sh // 3),
                           (sw // 2, sw, sh // 2)):
            frame = np.full(sw * sh * 4, 77, np.uint8)  # not what any decode writes
            ext.decode(data, frame, scale, x0, y0, max(x1, x0 + 1), sh)
            got = frame.reshape(sh, sw, 4)[y0:, x0:x1, :3]
            if not np.array_equal(got, want[y0:, x0:x1]):
                bad.append((f, (x0, x1, y0)))
    assert not bad, f"{len(bad)} regions differ, first {bad[:5]}"


@pytest.mark.parametrize("size", [200, 150, 80, 40])  # DCT scales 1, 2, 4, 8 of 480x360
def test_convert_gives_the_same_bytes_from_a_region_or_the_whole_for_every_sampling(
        size: int) -> None:
    opts = TransformOptions(size=size)
    bad = []
    for f in SAMPLINGS:
        data = sampled(f, (480, 360))
        region = native.convert_native(data, opts, pixels=True)
        whole = native.convert_native(data, opts, crop_decode=False, pixels=True)
        if region.jpeg != whole.jpeg:
            bad.append(f)
    assert not bad, f"{len(bad)} samplings differ, first {bad[:5]}"


def test_the_loaders_sample_gives_the_same_row_from_a_region_or_the_whole() -> None:
    rng = np.random.default_rng(3)
    bad = []
    for f in SAMPLINGS:
        data = sampled(f, (480, 360))
        for _ in range(3):
            x0, y0 = int(rng.integers(0, 300)), int(rng.integers(0, 200))
            box = (x0, y0, x0 + int(rng.integers(40, 180)), y0 + int(rng.integers(40, 160)))
            draft = (-(-480 * 56 // (box[2] - box[0])), -(-360 * 56 // (box[3] - box[1])))
            rows = []
            for whole in (False, True):
                out = np.zeros((3, 56, 56), np.uint8)
                done = jpegcrop.sample(data, 480, 360, draft=draft, resize=(56, 56), box=box,
                                       crop=(0, 0, 56, 56), out=out, flip=False, planar=True,
                                       whole=whole)
                assert done.status == jpegcrop.SAMPLE_DONE, done.message
                rows.append(out)
            if not np.array_equal(*rows):
                bad.append((f, box))
    assert not bad, f"{len(bad)} samples differ, first {bad[:5]}"


def test_images_of_every_sampling_convert_to_the_same_shards_on_1_and_2_workers(
        tmp_path: Path) -> None:
    src = tmp_path / "train"
    wnids = imagenet_classes().wnids[:3]
    for i, f in enumerate(SAMPLINGS):
        folder = src / wnids[i % 3]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{wnids[i % 3]}_{i}.JPEG").write_bytes(sampled(f, (300, 220)))
    trees = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        r = invoke("convert", src, "-o", out, "-j", workers, "-q", "--json", "--shard-size",
                   "64", "--split", "train")
        assert r.exit_code == 0, r.output
        summary = json.loads(r.stdout)
        assert summary["errors"] == 0 and summary["samples"] == len(SAMPLINGS), summary
        trees.append({p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()})
    assert trees[0] == trees[1]
    assert sum(name.endswith(".tar") for name in trees[0]) == 5


def test_a_region_one_column_wide_decodes_to_the_whole_decodes_pixels() -> None:
    """A sliver of one or two columns (widened to two or three) was upsampled differently by
    libjpeg-turbo at the image's left edge (a fuzz finding): regions are now at least 8
    columns wide."""
    rng = np.random.default_rng(0)
    bad = []
    for w in range(17, 48):
        h = 24
        rgb = rng.integers(0, 256, (h, w, 3), np.uint8)
        data = bytes(ext.encode(rgb.tobytes(), w, h, 3, 90))
        whole = np.zeros(w * h * 4, np.uint8)
        ext.decode(data, whole, 1, 0, 0, w, h)
        for x0 in range(w):
            frame = np.zeros(w * h * 4, np.uint8)
            ext.decode(data, frame, 1, x0, 5, x0 + 1, 6)
            got, want = frame.reshape(h, w, 4)[5, x0], whole.reshape(h, w, 4)[5, x0]
            if not np.array_equal(got[:3], want[:3]):
                bad.append((w, x0))
    assert not bad, bad[:10]
