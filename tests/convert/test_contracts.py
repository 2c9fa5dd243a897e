"""What crosses from the extension's C into Python is named: every entry answers with a
struct sequence of the module's own type, whose fields are read by name; its status codes
and limits are the module's constants, which the Python side reads rather than copies."""

from __future__ import annotations

import numpy as np
import pytest

from imgprep import augment, budget, jpegcrop
from imgprep.convert import native
from imgprep.sections import TransformOptions
from tests.support import jpeg

ext = pytest.importorskip("imgprep._jpegcrop", reason=f"C extension: {jpegcrop.status()}")


def _calls() -> dict[str, tuple[object, str]]:
    data, opts = jpeg((120, 90), seed=1), TransformOptions(size=64)
    rgb = np.zeros((90, 120, 3), np.uint8)
    frame = np.zeros(120 * 90 * 4, np.uint8)
    out = np.zeros((3, 32, 32), np.uint8)
    args = (opts.size, 0, native.FILTER_CODES[opts.filter], opts.quality)
    return {
        "probe": (ext.probe(data), "ProbeResult"),
        "probe-check": (ext.probe(data, True), "ProbeResult"),
        "decode": (ext.decode(data, frame, 1, 0, 0, 120, 90), "DecodeResult"),
        "convert": (ext.convert(data, *args, False, False, True, True, 10**8, 0),
                    "ConvertResult"),
        "finish": (ext.finish(rgb.tobytes(), 120, 90, 120, 90, *args, True, True, 10**8),
                   "ConvertResult"),
        "frame": (ext.frame(data, *args[:3], 10**8, False, False, 0), "FrameResult"),
        "sample": (ext.sample(data, 120, 90, (0, 0), (32, 32), None, (0, 0, 32, 32), False,
                              True, True, 0, out), "SampleResult"),
    }


@pytest.mark.parametrize("name", list(_calls()))
def test_every_entry_answers_with_a_named_result_of_the_modules_type(name: str) -> None:
    result, kind = _calls()[name]
    assert type(result) is getattr(ext, kind)
    fields = type(result).__match_args__
    assert len(fields) == len(result)
    assert [getattr(result, f) for f in fields] == list(result)


def test_the_results_say_what_they_did_by_name() -> None:
    calls = _calls()
    assert calls["convert"][0].status == ext.CONVERTED  # type: ignore[attr-defined]
    assert calls["convert"][0].out_width == 64  # type: ignore[attr-defined]
    assert calls["probe"][0].code == ext.PROBE_FAST  # type: ignore[attr-defined]
    assert calls["sample"][0].path == ext.SAMPLE_WHOLE  # type: ignore[attr-defined]
    assert calls["sample"][0].scan["trailing"] == 0  # type: ignore[attr-defined]


def test_the_python_side_reads_the_modules_codes_and_limits() -> None:
    assert (native.CONVERTED, native.DECLINED, native.FAILED) == (
        ext.CONVERTED, ext.DECLINED, ext.FAILED)
    assert (jpegcrop.SAMPLE_DONE, jpegcrop.SAMPLE_DECLINED, jpegcrop.SAMPLE_FAILED,
            jpegcrop.SAMPLE_REFUSED) == (ext.SAMPLE_DONE, ext.SAMPLE_DECLINED,
                                         ext.SAMPLE_FAILED, ext.SAMPLE_REFUSED)
    assert budget.LIMITS.max_scans == ext.BUDGET_MAX_SCANS
    codes = {ext.PROBE_FAST, ext.PROBE_PROGRESSIVE, ext.PROBE_COLOR, ext.PROBE_TAIL,
             ext.PROBE_BROKEN}
    assert len(codes) == 5 and ext.MAX_SIDE == 65500
    # the augmentation's op codes and filters: defined in imgprep/csrc/augment.h, read here
    assert augment._CODES == {name: getattr(ext, f"AUG_OP_{name.upper()}")
                              for name in augment.OPS}
    assert len(set(augment._CODES.values())) == len(augment.OPS)
    assert augment._FILTERS == {"nearest": ext.AUG_NEAREST, "bilinear": ext.AUG_BILINEAR,
                                "bicubic": ext.AUG_BICUBIC}
    # its kernels, numbered by augment.h (augment.KERNELS lists them in that order)
    assert [getattr(ext, f"AUG_KERNEL_{name.upper()}") for name in augment.KERNELS] == \
        list(range(len(augment.KERNELS)))
