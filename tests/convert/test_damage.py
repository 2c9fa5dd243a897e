"""Damage is never silent: a JPEG cut short, padded (a preallocated file written halfway) or
carrying large trailing data is an error in the error log, with its reason; one that
decodes whole with libjpeg's warnings converts and is listed in the warnings log, which the
summary counts (text and --json). The real sample's originals read whole, without a
warning, so its converted set does not change (tests/convert/test_golden.py)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from imgprep import imagefile, jpegcrop
from imgprep.convert.image import convert_image
from imgprep.errors import ImageError
from imgprep.inputs.synsets import imagenet_classes
from imgprep.sections import TransformOptions
from tests.support import encode, jpeg, photo, restart_out_of_order
from tests.support.cli import invoke

CLASSES = imagenet_classes()
W0, W1 = CLASSES.wnids[3], CLASSES.wnids[7]
WHOLE = jpeg((500, 375), seed=31)
CUT_SHORT = ("truncated JPEG: the data ends without an end-of-image marker (cut short, "
             "or written only in part)")


def half_written(data: bytes, zeros: int = 64 << 20) -> bytes:
    """The first half of ``data``, then zeros: a preallocated file written halfway."""
    return data[:len(data) // 2] + bytes(zeros)


def mpo() -> bytes:
    """Two pictures in one file: the second after the first's end-of-image marker."""
    buf = io.BytesIO()
    photo((320, 240), 15).save(buf, "MPO", save_all=True, append_images=[photo((320, 240), 16)])
    return buf.getvalue()


DAMAGED = {
    "half-written": (half_written(WHOLE), r"padded JPEG: the image data is followed by \d+ "
                     r"bytes that are not image data and no end-of-image marker \(over 65536: "
                     r"a file written only in part, such as a preallocated one\)"),
    "half-then-a-little-padding": (half_written(WHOLE, 2048), re.escape(CUT_SHORT)),
    "cut-short": (WHOLE[:len(WHOLE) * 3 // 4], re.escape(CUT_SHORT)),
    "no-end-marker": (WHOLE[:-2], re.escape(CUT_SHORT)),
    "cut-then-closed": (WHOLE[:len(WHOLE) // 2] + b"\xff\xd9", re.escape(
        "truncated JPEG: the entropy-coded data ends before the image's last block "
        "(premature end of data segment)")),
    "padded-before-the-end-marker": (WHOLE[:-2] + bytes(100_000) + b"\xff\xd9",
                                     r"padded JPEG: the image data is followed by \d+ bytes "
                                     r"that are not image data before a marker \(over 65536: "
                                     r"a file written only in part, such as a preallocated "
                                     r"one\)"),
    "large-trailing-data": (WHOLE + bytes(65_537), re.escape(
        "JPEG with 65537 bytes of trailing data after its end-of-image marker (over 65536: "
        "another file, or padding)")),
    "progressive-cut-short": (
        (p := encode(photo((300, 200), 20), "JPEG", quality=90, progressive=True))[
            :len(p) * 2 // 3], re.escape(CUT_SHORT)),
}
WARNED = {
    "restart-out-of-order": (restart_out_of_order(), r"^libjpeg: Corrupt JPEG data: found "
                             r"marker 0xd\d instead of RST\d( \(and \d+ more\))?$"),
    "stray-bytes-before-the-end": (WHOLE[:-2] + bytes(40) + b"\xff\xd9",
                                   r"^libjpeg: Corrupt JPEG data: \d+ extraneous bytes "
                                   r"before marker 0xd9$"),
    "small-trailing-data": (WHOLE + bytes(65_536),
                            r"^65536 bytes after the end-of-image marker$"),
}


@pytest.mark.parametrize("crop_decode", [True, False])
@pytest.mark.parametrize("name", DAMAGED)
def test_a_damaged_jpeg_is_an_error_naming_the_damage(name: str, crop_decode: bool) -> None:
    data, reason = DAMAGED[name]
    with pytest.raises(ImageError) as e:
        convert_image(data, TransformOptions(), crop_decode=crop_decode)
    assert re.fullmatch(reason, str(e.value)), str(e.value)


@pytest.mark.parametrize("name", WARNED)
def test_a_jpeg_that_decodes_whole_with_warnings_converts_with_them(name: str) -> None:
    data, warning = WARNED[name]
    fast = convert_image(data, TransformOptions())
    assert re.fullmatch(warning, fast.warning), fast.warning
    whole = convert_image(data, TransformOptions(), crop_decode=False)
    assert (fast.jpeg, fast.warning) == (whole.jpeg, whole.warning)


def test_what_is_whole_and_plain_converts_without_a_warning() -> None:
    """A clean JPEG, a grayscale one, CMYK ones, a PNG named .JPEG and an MPO (whose other
    pictures follow the first's end-of-image marker) are all quiet."""
    cmyk = photo((120, 90), 5).convert("CMYK")
    for data in (WHOLE, jpeg((300, 200), seed=2, mode="L"), encode(cmyk, "JPEG"),
                 encode(photo((120, 90), 6), "PNG"), mpo()):
        for crop_decode in (True, False):
            assert convert_image(data, TransformOptions(), crop_decode=crop_decode).warning == ""
    assert jpegcrop.check(mpo()).trailing > 0  # what the MPO rule forgives


def test_without_the_extension_the_end_of_image_marker_is_still_checked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jpegcrop, "_jpegcrop", None)
    monkeypatch.setattr(jpegcrop, "AVAILABLE", False)
    scan = imagefile.jpeg_scan
    assert scan(half_written(WHOLE)).damage() == CUT_SHORT
    assert scan(WHOLE + bytes(70_000)).damage() is not None
    assert scan(WHOLE + b"tail").notes() == "4 bytes after the end-of-image marker"
    assert scan(WHOLE) == jpegcrop.Scan()
    # the first end-of-image marker after the last scan counts, not a stray FF D9 later on
    second = WHOLE + jpeg((300, 200), seed=9)
    assert scan(second).trailing == len(second) - len(WHOLE) < 65536
    assert scan(second).damage() is None


# ---------------------------------------------------------------------------- end to end


def class_tree(root: Path, extra: dict[str, bytes]) -> Path:
    """``root/train/<wnid>/``: three good JPEGs in each of two classes, and ``extra`` (by
    key) in the first."""
    for k, wnid in enumerate((W0, W1)):
        folder = root / "train" / wnid
        folder.mkdir(parents=True)
        for j in range(3):
            (folder / f"{wnid}_{j}.JPEG").write_bytes(jpeg((96, 72), seed=10 * k + j))
    for key, data in extra.items():
        (root / "train" / W0 / f"{key}.JPEG").write_bytes(data)
    return root / "train"


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def test_a_half_written_jpeg_fails_the_run_and_is_logged_with_its_reason(tmp_path: Path) -> None:
    """Case 3: the first half of a JPEG, then 64 MiB of zeros, converted silently before
    (exit 0, a smeared picture in the shard); now exit 1 naming the error log, whose line
    names the file and why; with --max-errors 1 the rest converts without it."""
    key = f"{W0}_halfway"
    src = class_tree(tmp_path, {key: half_written(WHOLE)})
    out = tmp_path / "out"
    cap = ("--max-image-bytes", 128 << 20)  # past the default cap: the decoder must find it
    r = invoke("convert", src, "-o", out, "-j", 1, "-q", "--json", *cap)
    assert r.exit_code == 1, r.output
    log = out / "train-errors.jsonl"
    assert f"imgprep: error: 1 images of train failed (> --max-errors 0); see {log}" in r.stderr
    (entry,) = lines(log)
    assert (entry["key"], entry["source"]) == (key, f"{src}/{W0}/{key}.JPEG")
    assert re.fullmatch(DAMAGED["half-written"][1], entry["reason"]), entry["reason"]
    r = invoke("convert", src, "-o", out, "-j", 1, "-q", "--json", "--max-errors", 1, *cap)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    summary = summary[0] if isinstance(summary, list) else summary
    assert (summary["samples"], summary["errors"], summary["warnings"]) == (6, 1, 0)


def test_warned_images_convert_and_the_summary_counts_the_warnings_log(tmp_path: Path) -> None:
    warned = {f"{W0}_{name}": data for name, (data, _) in WARNED.items()}
    src = class_tree(tmp_path, warned)
    out = tmp_path / "out"
    r = invoke("convert", src, "-o", out, "-j", 1, "--shard-size", 4)
    assert r.exit_code == 0, r.output
    log = out / "train-warnings.jsonl"
    assert f"3 images converted whole with warnings (libjpeg's, or bytes after the image); " \
           f"see {log}" in r.stdout
    entries = lines(log)
    assert sorted(e["key"] for e in entries) == sorted(warned)
    for e in entries:
        name = e["key"].removeprefix(f"{W0}_")
        assert e["source"] == f"{src}/{W0}/{e['key']}.JPEG"
        assert re.fullmatch(WARNED[name][1], e["warning"]), e
    assert not (out / "train-errors.jsonl").exists()
    rerun = invoke("convert", src, "-o", out, "-j", 1, "--shard-size", 4, "-q", "--json")
    assert rerun.exit_code == 0, rerun.output
    summary = json.loads(rerun.stdout)
    summary = summary[0] if isinstance(summary, list) else summary
    assert (summary["samples"], summary["tasks_resumed"], summary["warnings"],
            summary["warning_log"]) == (9, summary["tasks"], 3, str(log))
    assert lines(log) == entries  # the rerun's log, from the task records
