"""The C extension's guard rails (imgprep/_jpegcrop.c): every signed argument range-checked
in C and in ``jpegcrop.pack`` before a byte is touched; an error while libjpeg's
decompressor is being made lands in the extension's own handler (``setjmp`` comes first);
the whole-file check holds its memory to a cap whatever a header claims; the development
build treats every warning as an error."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from imgprep import jpegcrop
from tests.support import REPO, clean_env, jpeg

pytestmark = pytest.mark.skipif(not jpegcrop.AVAILABLE,
                                reason=f"crop-aware decoder: {jpegcrop.status()}")
C = jpegcrop._jpegcrop


def child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter (a crash there fails the test, not the test run)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          env=clean_env(PYTHONPATH=str(REPO), **env), capture_output=True,
                          text=True, timeout=120)


def declaring(width: int, height: int) -> bytes:
    """A small real JPEG whose frame header is patched to declare ``width`` x ``height``."""
    data = bytearray(jpeg((64, 48), seed=6))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def test_pack_refuses_a_box_whose_left_edge_is_minus_one() -> None:
    """left=-1, width=2 used to wrap to 1 through an unsigned parse, pass the bounds check
    and read about 16 GB past the buffer: now a ValueError in C and in ``jpegcrop.pack``."""
    run = child("""
        import numpy as np
        from imgprep import _jpegcrop
        src, out = np.zeros(64, np.uint8), np.zeros(6, np.uint8)
        try:
            _jpegcrop.pack(src, 4, -1, 0, 2, 1, out, False, False)
        except ValueError as e:
            print(e)
        """)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == ("the box must have x0, y0 >= 0 and width, height, "
                                  "src_width >= 1 (got x0=-1 y0=0 width=2 height=1 "
                                  "src_width=4)")
    with pytest.raises(ValueError, match=r"lies outside the source image \(4 pixels wide\)"):
        jpegcrop.pack(np.zeros(64, np.uint8), 4, (-1, 0, 1, 1), np.zeros(6, np.uint8),
                      flip=False, planar=False)


@pytest.mark.parametrize("args,words", [
    ((4, 0, -3, 1, 1), "x0, y0 >= 0"),
    ((4, 0, 0, 0, 1), "width, height, src_width >= 1"),
    ((0, 0, 0, 1, 1), "width, height, src_width >= 1"),
    ((4, 4, 0, 1, 1), "lies outside"),
    ((4, 0, 4, 1, 1), "lies outside"),
    ((2**61, 0, 0, 1, 1), "lies outside"),  # the stride would overflow
    ((4, 0, 2**62, 1, 1), "lies outside"),  # the row offset would overflow
    ((4, 0, 0, 2, 2), "out holds 6 bytes"),
])
def test_pack_checks_every_argument_in_signed_arithmetic(args: tuple[int, ...],
                                                         words: str) -> None:
    src, out = np.zeros(64, np.uint8), np.zeros(6, np.uint8)
    with pytest.raises(ValueError, match=words):
        C.pack(src, *args, out, False, False)
    with pytest.raises(OverflowError):
        C.pack(src, 4, 0, 2**70, 1, 1, out, False, False)


@pytest.mark.parametrize("region,words", [
    ((-1, 0, 4, 4), "x0 must be in"),
    ((0, -5, 4, 4), "y0 must be in"),
    ((3, 0, 3, 4), "x1 must be in"),
    ((0, 0, 4, 0), "y1 must be in"),
    ((0, 0, 2**40, 4), "x1 must be in"),
    ((2**32 - 1, 0, 2**32, 4), "x0 must be in"),  # once wrapped by an unsigned parse
])
def test_decode_checks_its_region_before_libjpeg_runs(region: tuple[int, int, int, int],
                                                       words: str) -> None:
    data, frame = jpeg((64, 48), seed=3), np.empty(64 * 48 * 4, np.uint8)
    with pytest.raises(ValueError, match=words):
        C.decode(data, frame, 1, *region)
    with pytest.raises(ValueError, match="scale must be 1, 2, 4 or 8"):
        C.decode(data, frame, 3, 0, 0, 4, 4)
    with pytest.raises(ValueError, match="the frame holds 100 bytes"):
        C.decode(data, np.empty(100, np.uint8), 1, 0, 0, 4, 4)


def test_the_whole_file_check_holds_its_memory_whatever_a_header_claims() -> None:
    """65000 x 65000 pixels of coefficients would be 25 GB: refused by the per-image budget
    at the header (1,709 bytes cannot hold that image), at once; the fast path's frame is
    refused by Pillow's bomb rule before it is made."""
    data = declaring(65_000, 65_000)
    w, h, code, report = C.probe(data, True)
    assert (w, h) == (65_000, 65_000) and code == 4 and report is not None
    assert report["refused"] == 1 and "too few for that image" in report["error"]
    assert jpegcrop.check(data).damage() == f"refused: {report['error']}"
    with pytest.raises(ValueError, match="a 65000x65000 frame is outside 1 .. 178956970"):
        jpegcrop.Frame().view(65_000, 65_000)


SHIM = r"""
#include <stdio.h>
#include <jpeglib.h>
#include <jerror.h>
/* libjpeg's constructor, failing as it does when it cannot allocate its memory manager */
void jpeg_CreateDecompress(j_decompress_ptr cinfo, int version, size_t structsize) {
    (void)version; (void)structsize;
    cinfo->mem = NULL;
    cinfo->err->msg_code = JERR_OUT_OF_MEMORY;
    cinfo->err->msg_parm.i[0] = 7;
    (*cinfo->err->error_exit)((j_common_ptr)cinfo);
}
"""


def test_an_error_while_the_decompressor_is_made_lands_in_the_handler(tmp_path: Path) -> None:
    """``jpeg_create_decompress`` itself may fail (no memory, another libjpeg version): with
    ``setjmp`` set after it, its error jumped to an unset buffer and crashed; set before,
    probe declines and decode raises, naming libjpeg's message."""
    lib = jpegcrop.library()
    if lib is not None and lib.bundled:
        pytest.skip("the extension links its own libjpeg-turbo with private symbols: no "
                    "preloaded library can replace its constructor")
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build libjpeg's failing constructor")
    (tmp_path / "shim.c").write_text(SHIM)
    shim = tmp_path / "libfailcreate.so"
    built = subprocess.run([cc, "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "shim.c")],
                           capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"cannot build the shim (libjpeg headers?): {built.stderr[-300:]}")
    run = child("""
        import numpy as np
        from imgprep import _jpegcrop
        from tests.support import jpeg
        data = jpeg((64, 48), seed=3)
        print(_jpegcrop.probe(data)[2], _jpegcrop.probe(data, True)[3]["error"])
        try:
            _jpegcrop.decode(data, np.empty(64 * 48 * 4, np.uint8), 1, 0, 0, 8, 8)
        except ValueError as e:
            print(e)
        """, LD_PRELOAD=str(shim))
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == ["4 Insufficient memory (case 7)",
                                       "cannot decode the JPEG (Insufficient memory (case 7))"]


@pytest.mark.slow
def test_the_development_build_treats_every_warning_as_an_error(tmp_path: Path) -> None:
    """``make ext`` (``IMGPREP_STRICT_BUILD=1``) compiles with -Wall -Wextra -Werror and
    fails rather than leaving the extension out; the source builds clean that way."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    built = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "tmp")], cwd=REPO, capture_output=True, text=True,
        env=clean_env(IMGPREP_STRICT_BUILD="1"), timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    compile_line = next(ln for ln in built.stdout.splitlines() if "_jpegcrop.c" in ln)
    assert {"-Wall", "-Wextra", "-Werror"} <= set(compile_line.split()), compile_line
    assert list((tmp_path / "lib" / "imgprep").glob("_jpegcrop*.so"))
    broken = tmp_path / "src"
    shutil.copytree(REPO / "imgprep", broken / "imgprep",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(REPO / "setup.py", broken)
    shutil.copy(REPO / "pyproject.toml", broken)
    source = broken / "imgprep" / "_jpegcrop.c"
    source.write_text(source.read_text().replace(
        "static PyObject *pack(", "static int unused_by_anything;\nstatic PyObject *pack("))
    failed = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"],
                            cwd=broken, capture_output=True, text=True,
                            env=clean_env(IMGPREP_STRICT_BUILD="1"), timeout=300)
    assert failed.returncode != 0 and "unused_by_anything" in failed.stdout + failed.stderr
