"""The fuzz harness and the extension under it: mutated real JPEGs never crash the extension
and give the full decode's pixels or a clean decline (through the decoder, convert, the
loader's call, stored-pixel records made of them, and the augmentation ops given pictures
made of them), in the normal build here and in the AddressSanitizer + UBSan build in a
child (20,000 inputs or 2 minutes, whichever comes first); the runner keeps what breaks any
target's promise, so new C joins with a target.
The seeds and mutators reach the per-image budget's limits (sampling factors, scan counts,
declared sizes, zero quantisation tables), and no call into the extension takes more CPU
than the budget allows."""

from __future__ import annotations

import io
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness.fuzz import sanitize
from harness.fuzz.augment import augment_target
from harness.fuzz.convert import convert_target
from harness.fuzz.extension import jpegcrop_target, load_extension
from harness.fuzz.mutate import (
    LEGAL_SAMPLINGS,
    MAX_BYTES,
    MUTATORS,
    declared_size,
    sampling_factors,
    scan_counts,
    scans,
    segments,
    zero_quant,
)
from harness.fuzz.progressive import progressive
from harness.fuzz.rawsample import raw_target, train_geometry, val_geometry, yuv_as_rgb
from harness.fuzz.run import case, fuzz
from harness.fuzz.sample import sample_target
from harness.fuzz.seeds import PROGRESSIVE_SIZE, SAMPLINGS, load_seeds
from harness.fuzz.target import Mismatch, bounded
from imgprep import budget, jpegcrop
from tests.support import REAL_DATA, jpeg, photo

needs_extension = pytest.mark.skipif(not jpegcrop.AVAILABLE,
                                     reason=f"crop-aware decoder: {jpegcrop.status()}")
SANITIZED_INPUTS, SANITIZED_SECONDS = 20_000, 120.0


@pytest.fixture(scope="module")
def seeds() -> list[bytes]:
    """The real sample's JPEGs where it is present (synthetic photos otherwise), and the
    unusual samplings and long progressions where the extension is built."""
    return load_seeds(REAL_DATA, load_extension(None) if jpegcrop.AVAILABLE else None)[0]


def _factors(data: bytes) -> tuple[int, ...]:
    """The frame header's (h, v) of each component, in order."""
    marker, s, _e = next(seg for seg in segments(data) if 0xC0 <= seg[0] <= 0xC2)
    n = data[s + 9]
    return tuple(f for i in range(n) for f in (data[s + 11 + 3 * i] >> 4,
                                               data[s + 11 + 3 * i] & 15))


@needs_extension
def test_the_seeds_hold_unusual_samplings_and_long_progressions_that_decode_clean(
        seeds: list[bytes]) -> None:
    mod = load_extension(None)
    assert len(LEGAL_SAMPLINGS) == 311 and set(SAMPLINGS) <= set(LEGAL_SAMPLINGS)
    by_factors = {_factors(s): s for s in seeds}
    assert set(SAMPLINGS) <= set(by_factors)
    long = [s for s in seeds if budget.prescan(s).scans > 50]
    assert sorted(budget.prescan(s).scans for s in long) == [53, 103, 190]
    for data in [*(by_factors[f] for f in SAMPLINGS), *long]:
        w, h, _code, rep = mod.probe(data, True)
        assert rep["warnings"] == 0 and rep["error"] == "", rep
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            assert img.size == (w, h)
    assert {mod.probe(s)[:2] for s in long} == {PROGRESSIVE_SIZE}


def test_a_progression_of_any_length_decodes_to_the_same_pixels() -> None:
    img = photo((45, 30), 3)
    made = {(band, dc): progressive(img, band=band, dc_bits=dc)
            for band, dc in ((1, 0), (7, 3), (63, 13), (64 // 3, 1))}
    pixels = set()
    for (band, dc), data in made.items():
        assert budget.prescan(data).scans == 1 + dc + 3 * -(-63 // band)
        with Image.open(io.BytesIO(data)) as got:
            assert got.info.get("progressive") and got.size == (45, 30)
            pixels.add(got.convert("RGB").tobytes())
    assert len(pixels) == 1
    close = np.asarray(Image.open(io.BytesIO(made[1, 0])), np.int16)
    assert np.abs(close - np.asarray(img.convert("RGB"), np.int16)).mean() < 4
    with pytest.raises(ValueError):
        progressive(img, band=0, dc_bits=0)


def test_every_mutator_is_reproducible_and_changes_real_bytes(seeds: list[bytes]) -> None:
    for name, mutator in MUTATORS.items():
        made = [mutator(seeds[i % len(seeds)], np.random.default_rng(i), seeds)
                for i in range(12)]
        again = [mutator(seeds[i % len(seeds)], np.random.default_rng(i), seeds)
                 for i in range(12)]
        assert made == again, name
        assert sum(m != seeds[i % len(seeds)] for i, m in enumerate(made)) >= 6, name
    assert case(seeds, 3, 17)[:2] == case(seeds, 3, 17)[:2]


def test_segments_walk_a_jpeg_from_its_start_to_the_scan() -> None:
    segs = segments(jpeg((40, 30), seed=1))
    assert segs[0][1] == 2 and segs[-1][0] == 0xDA
    assert {0xDB, 0xC0, 0xC4} <= {m for m, _s, _e in segs}
    assert all(a[2] == b[1] for a, b in zip(segs, segs[1:], strict=False))


def test_scans_are_found_as_the_budget_counts_them() -> None:
    buf = io.BytesIO()
    photo((64, 48), 2).save(buf, "JPEG", progressive=True, restart_marker_rows=1)
    data = buf.getvalue()
    found = scans(data)
    assert len(found) == budget.prescan(data).scans == 10
    assert all(data[s:s + 2] == b"\xff\xda" for s, _e in found)
    assert found[-1][1] == len(data) - 2  # the last ends at the end-of-image marker


def test_repeated_scans_reach_past_the_scan_limit_within_the_size_bound() -> None:
    data = progressive(photo((64, 48), 4), band=1, dc_bits=0)
    made = [scan_counts(data, np.random.default_rng(i), []) for i in range(60)]
    counts = [budget.prescan(m).scans for m in made]
    assert all(len(m) <= MAX_BYTES for m in made)
    assert any(c > budget.LIMITS.max_scans for c in counts), counts
    assert any(c < 190 for c in counts) and any(190 < c <= 500 for c in counts), counts


def test_declared_sizes_land_on_both_sides_of_the_bytes_rule() -> None:
    data = jpeg((64, 48), seed=3)
    within = past = 0
    for i in range(80):
        layout = budget.prescan(declared_size(data, np.random.default_rng(i), []))
        most = budget.LIMITS.blocks_per_byte * len(data)
        within += most // 2 < layout.blocks <= most
        past += most < layout.blocks <= most * 2
    assert within >= 10 and past >= 10, (within, past)


def test_zero_quant_and_sampling_factors_rewrite_only_their_fields() -> None:
    data = jpeg((64, 48), seed=5)
    zeroed = [zero_quant(data, np.random.default_rng(i), []) for i in range(30)]
    assert all(len(z) == len(data) for z in zeroed)
    assert sum(budget.prescan(z).zero_table is not None for z in zeroed) >= 20
    factors = {_factors(sampling_factors(data, np.random.default_rng(i), []))
               for i in range(60)}
    assert any(f in LEGAL_SAMPLINGS for f in factors)
    assert any(v == 0 or v > 4 for f in factors for v in f), factors
    assert all(len(f) == 6 for f in factors)


def test_a_call_over_its_cpu_time_is_a_finding() -> None:
    def spin(seconds: float, fail: bool = False) -> int:
        t0 = time.process_time()
        while time.process_time() - t0 < seconds:
            pass
        if fail:
            raise ValueError("declined")
        return 7

    assert bounded(1.0, "quick", lambda: spin(0.0)) == 7
    with pytest.raises(ValueError):
        bounded(1.0, "quick", lambda: spin(0.0, True))
    for fail in (False, True):
        with pytest.raises(Mismatch, match="slow took 0.1. s of CPU, over 0.05 s"):
            bounded(0.05, "slow", lambda: spin(0.1, fail))  # noqa: B023 - called at once


def test_the_runner_keeps_each_input_that_breaks_a_promise(seeds: list[bytes],
                                                          tmp_path: Path) -> None:
    """Any callable is a target: a Mismatch or an exception is a finding with its input."""
    def picky(data: bytes, rng: np.random.Generator) -> str:
        if len(data) % 7 == 0:
            raise Mismatch("length divisible by 7")
        if len(data) % 11 == 0:
            raise KeyError("eleven")
        return "fine"

    report = fuzz(picky, seeds, inputs=300, seed=5, keep=tmp_path / "kept",
                  in_flight=tmp_path / "now.jpg")
    assert report.inputs == 300 and sum(report.outcomes.values()) == 300
    assert report.outcomes["mismatch"] > 0 and report.outcomes["exception"] > 0
    assert len(report.findings) == report.outcomes["mismatch"] + report.outcomes["exception"]
    assert {f.problem for f in report.findings} == {"length divisible by 7",
                                                    "KeyError: 'eleven'"}
    kept = sorted((tmp_path / "kept").iterdir())
    assert len(kept) == len(report.findings)
    first = report.findings[0]
    assert case(seeds, 5, first.number)[1] == next(
        p.read_bytes() for p in kept if p.name.startswith(f"5-{first.number}-"))
    assert (tmp_path / "now.jpg").read_bytes() == case(seeds, 5, 299)[1]


@needs_extension
def test_mutated_jpegs_decode_as_pillow_does_or_are_declined(seeds: list[bytes]) -> None:
    report = fuzz(jpegcrop_target(load_extension(None)), seeds, inputs=3_000, seed=1)
    assert report.findings == []
    got = report.outcomes
    assert got["decoded"] > 100 and got["decoded:warned"] > 100, got
    assert got["declined:tail"] > 100 and got["declined:broken"] > 100, got


@needs_extension
def test_mutated_jpegs_convert_the_same_from_a_region_or_whole_or_fail_cleanly(
        seeds: list[bytes]) -> None:
    report = fuzz(convert_target(load_extension(None)), seeds, inputs=2_000, seed=2)
    assert report.findings == []
    got = report.outcomes
    assert got["convert:converted"] > 100 and got["convert:failed"] > 100, got
    assert got["convert:declined"] > 100, got


@needs_extension
def test_mutated_jpegs_sample_the_same_from_a_region_or_whole_or_are_refused_with_a_reason(
        seeds: list[bytes]) -> None:
    report = fuzz(sample_target(load_extension(None)), seeds, inputs=2_000, seed=3)
    assert report.findings == []
    got = report.outcomes
    assert got["sample:done"] > 100 and got["sample:refused"] > 20, got


@needs_extension
def test_stored_records_of_mutated_jpegs_sample_as_the_jpeg_path_and_damaged_ones_are_refused(
        seeds: list[bytes]) -> None:
    report = fuzz(raw_target(load_extension(None)), seeds, inputs=4_000, seed=4)
    assert report.findings == []
    got = report.outcomes
    assert got["raw:yuv420:sampled"] > 30 and got["raw:rgb24:sampled"] > 100, got
    assert got["raw:forged:sampled"] > 1000 and got["raw:forged:damaged-sampled"] > 100, got
    assert sum(n for k, n in got.items() if k.endswith("damaged-refused")) > 1000, got
    assert got["raw:yuv420:damaged-refused"] > 5 and got["raw:rgb24:damaged-refused"] > 50, got


@needs_extension
def test_the_raw_targets_yuv_reference_is_libjpeg_turbos_decode(seeds: list[bytes]) -> None:
    """The numpy conversion the target holds forged YUV records to gives the RGB24 record
    of the same JPEG (libjpeg-turbo's own decode), at every size (chroma 1 or 2 columns wide
    is replicated, not fancy-upsampled) and on the real seeds."""
    mod = load_extension(None)
    rng = np.random.default_rng(0)
    jpegs = [bytes(mod.encode(rng.integers(0, 256, (h, w, 3), np.uint8).tobytes(), w, h, 3,
                              90, (2, 2, 1, 1, 1, 1)))
             for w, h in ((1, 1), (1, 7), (7, 1), (3, 3), (4, 5), (6, 2), (17, 9), (33, 31))]
    checked = 0
    for data in jpegs + seeds:
        yuv, rgb = (mod.raw_record(data, mode, 0) for mode in (mod.RAW_YUV420, mod.RAW_RGB24))
        if yuv.mode == mod.RAW_YUV420:
            assert yuv_as_rgb(yuv.record) == rgb.record, (yuv.width, yuv.height)
            checked += 1
    assert checked >= len(jpegs) + 10, checked


@needs_extension
def test_a_crop_far_outside_the_image_is_refused_before_it_is_planned(
        seeds: list[bytes]) -> None:
    """A crop's corners are checked before the reach is computed from them (their product
    with a side overflowed int64 first, which UBSan reports); the fuzz targets' refusals
    carry these crops into the sanitizer build."""
    mod = load_extension(None)
    data = seeds[0]
    w, h = mod.probe(data)[:2]
    record = mod.raw_record(data, mod.RAW_RGB24, 0).record
    out = bytearray(8 * 8 * 3)
    for crop in ((2**62, 0, 2**62 + 8, 8), (0, 2**62, 8, 2**62 + 8), (-(2**63), 0, 8, 8),
                 (0, 0, 2**63 - 1, 8)):
        with pytest.raises(ValueError, match="the crop .* must be a non-empty box"):
            mod.sample(data, w, h, (0, 0), (8, 8), None, crop, False, False, False, 0, out)
        with pytest.raises(ValueError, match="the crop .* must be a non-empty box"):
            mod.raw_sample(record, w, h, (8, 8), None, crop, False, False, 0, out)
    assert out == bytearray(8 * 8 * 3)


def test_the_raw_targets_geometry_is_the_loaders_transforms() -> None:
    """The target mirrors the loader's draws (it must not import the loaders and their
    frameworks into the sanitized child): the same geometry from the same generator."""
    from loaders.transforms import TrainTransform, ValTransform

    for i, (w, h) in enumerate([(1, 1), (1, 300), (300, 1), (7, 5), (500, 375), (64, 64)]):
        for size in (1, 7, 224):
            for low in (0.08, 1.0):
                a, b = np.random.default_rng(i), np.random.default_rng(i)
                for _ in range(20):
                    want = TrainTransform(size=size, scale=(low, 1.0)).geometry(w, h, a)
                    assert train_geometry(w, h, size, low, b) == (
                        want.resize, want.box, want.crop, want.flip)
            for resize in {size, 3 * size, min(w, h)} - {0}:
                if resize >= size:
                    want = ValTransform(size=size, resize=resize).geometry(w, h, None)
                    assert val_geometry(w, h, size, resize) == (want.resize, want.box,
                                                                want.crop, want.flip)


@needs_extension
def test_random_op_lists_augment_alike_by_kernel_and_layout_or_are_refused_untouched(
        seeds: list[bytes]) -> None:
    report = fuzz(augment_target(load_extension(None)), seeds, inputs=3_000, seed=5)
    assert report.findings == []
    got = report.outcomes
    assert got["augment:applied"] > 1500 and got["augment:empty"] > 50, got
    for limit in ("kind", "arity", "arg", "posterize", "filter", "fill", "ops", "size",
                  "kernel"):
        assert got[f"augment:refused:{limit}"] > 30, (limit, got)


class _Broken:
    """The extension with one call made wrong, to show that the targets see it."""

    def __init__(self, mod: object, **calls: object) -> None:
        self._mod, self._calls = mod, calls

    def __getattr__(self, name: str) -> object:
        return self._calls.get(name, getattr(self._mod, name))


@needs_extension
def test_the_raw_and_augment_targets_find_a_call_that_breaks_a_promise(
        seeds: list[bytes]) -> None:
    mod = load_extension(None)

    def portable_off_by_one(*args: object) -> object:
        r = mod.raw_sample(*args)
        if isinstance(args[-1], int) and args[-1] == 0:
            np.asarray(args[-2]).reshape(-1)[0] ^= 1
        return r

    def writes_first(out: np.ndarray, *args: object) -> object:
        out.reshape(-1)[0] ^= 1
        return mod.augment(out, *args)

    for target, problem in (
            (raw_target(_Broken(mod, raw_sample=portable_off_by_one)),
             "the portable resampler's row differs"),
            (augment_target(_Broken(mod, augment=writes_first)),
             "after changing the image")):
        report = fuzz(target, seeds, inputs=300, seed=6)
        assert any(problem in f.problem for f in report.findings), report.findings[:3]


@needs_extension
def test_the_budget_refuses_what_the_new_mutators_make_with_its_reason(
        seeds: list[bytes]) -> None:
    """A zero quantisation table, more than 500 scans, more blocks than the bytes hold:
    probe's check says refused with the budget's words."""
    mod = load_extension(None)
    seq = next(s for s in seeds if _factors(s) == (2, 4, 1, 1, 1, 1))
    long = next(s for s in seeds if budget.prescan(s).scans == 190)
    first, end = scans(long)[1]
    many = long[:end] + long[first:end] * 400 + long[end:]
    sof = next(s for m, s, _e in segments(seq) if m == 0xC0)
    forged = bytearray(seq)
    forged[sof + 5:sof + 9] = struct.pack(">HH", 4000, 4000)
    dqt = next(s for m, s, _e in segments(seq) if m == 0xDB)
    zero = seq[:dqt + 5] + b"\x00" + seq[dqt + 6:]
    for data, words in ((zero, "quantisation table 0 holds a 0"),
                        (many, "a JPEG of more than 500 scans"),
                        (bytes(forged), "too few for that image")):
        rep = mod.probe(data, True)[3]
        assert rep["refused"] == 1 and words in rep["error"], rep
        assert budget.refusal(budget.prescan(data), len(data)) == rep["error"]


@pytest.mark.slow
def test_the_sanitizer_build_survives_twenty_thousand_inputs(tmp_path: Path) -> None:
    why = sanitize.toolchain()
    if why is not None:
        pytest.skip(f"no sanitizer build here: {why}")
    module = sanitize.build(tmp_path)
    linked = subprocess.run(["ldd", str(module)], capture_output=True, text=True).stdout
    assert "libasan" in linked and "libubsan" in linked, linked
    out = sanitize.run(module, inputs=SANITIZED_INPUTS, seconds=SANITIZED_SECONDS, seed=7)
    assert out.report is not None, f"the sanitized child died ({out.returncode}):\n{out.stderr}"
    assert out.returncode == 0 and out.report["findings"] == [], out.report
    inputs, seconds = out.report["inputs"], out.report["seconds"]
    assert isinstance(inputs, int) and isinstance(seconds, float)
    assert inputs >= SANITIZED_INPUTS or seconds >= SANITIZED_SECONDS, out.report
    outcomes = out.report["outcomes"]
    assert isinstance(outcomes, dict)
    for target in ("convert", "sample", "raw", "augment"):  # every target had its inputs
        assert sum(n for k, n in outcomes.items() if k.startswith(f"{target}:")) > 100, target
    assert "ERROR: AddressSanitizer" not in out.stderr and "runtime error" not in out.stderr
