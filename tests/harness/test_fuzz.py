"""The fuzz harness and the extension under it: mutated real JPEGs never crash the extension
and give the full decode's pixels or a clean decline, in the normal build here and in the
AddressSanitizer + UBSan build in a child (20,000 inputs or 2 minutes, whichever comes
first); the runner keeps what breaks any target's promise, so new C joins with a target."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from harness.fuzz import sanitize
from harness.fuzz.convert import convert_target
from harness.fuzz.extension import jpegcrop_target, load_extension
from harness.fuzz.mutate import MUTATORS, segments
from harness.fuzz.run import case, fuzz
from harness.fuzz.seeds import load_seeds
from harness.fuzz.target import Mismatch
from imgprep import jpegcrop
from tests.support import REAL_DATA, jpeg

needs_extension = pytest.mark.skipif(not jpegcrop.AVAILABLE,
                                     reason=f"crop-aware decoder: {jpegcrop.status()}")
SANITIZED_INPUTS, SANITIZED_SECONDS = 20_000, 120.0


@pytest.fixture(scope="module")
def seeds() -> list[bytes]:
    """The real sample's JPEGs where it is present (synthetic photos otherwise)."""
    return load_seeds(REAL_DATA)[0]


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
    assert "ERROR: AddressSanitizer" not in out.stderr and "runtime error" not in out.stderr
