"""What ``imgprep info`` reports (``imgprep.shards.info``): records whose ``asdict`` is the
JSON the command prints, the one-line warning when PIL is not the fast build, and the crop-aware
decoder's libjpeg-turbo (``imgprep.jpegcrop.library``), its SIMD on or off."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from imgprep import PilInfo, __version__, jpegcrop, pil_info, resample
from imgprep.shards.info import (
    FastDecode,
    Versions,
    decoder_warning,
    pil_warning,
    probe_decode,
    versions,
)
from imgprep.shards.manifest import read_manifest
from tests.support import REPO, clean_env, jpeg
from tests.support.cli import invoke
from tests.support.images import encode, photo
from tests.support.shards import write_split

LIB = jpegcrop.library()
FAST = PilInfo(pil_version="9.5.0.post1", pillow_simd=True, stock_pillow_installed=None,
               libjpeg_turbo=True, jpeg_version="8.0", core="/x/_imaging.so", cpu_avx2=True,
               avx2_build=True)


def test_pil_info_names_the_resamplers_kernel() -> None:
    kernel = resample.kernel() if resample.AVAILABLE else "unavailable"
    assert pil_info(check_avx2=False).resampler.startswith(kernel)


def test_pil_info_checks_the_avx2_build_only_when_asked() -> None:
    info = pil_info(check_avx2=False)
    assert info.avx2_build is None
    assert list(asdict(info)) == ["pil_version", "pillow_simd", "stock_pillow_installed",
                                  "pillow_simd_installed", "libjpeg_turbo", "jpeg_version",
                                  "core", "cpu_avx2", "avx2_build", "crop_decode", "resampler"]


@pytest.mark.parametrize(("change", "says"), [
    ({}, None),
    ({"avx2_build": None}, None),  # not checked: no warning
    ({"pillow_simd": False}, "PIL 9.5.0.post1 is not pillow-simd: "),
    ({"avx2_build": False}, "built without AVX2"),
    ({"libjpeg_turbo": False}, "not linked against libjpeg-turbo"),
])
def test_pil_warning_names_what_makes_decoding_slow(change: dict[str, Any],
                                                    says: str | None) -> None:
    warning = pil_warning(replace(FAST, **change))
    if says is None:
        assert warning is None
    else:
        assert warning is not None and says in warning


STOCK = replace(FAST, pil_version="13.0.0", pillow_simd=False, stock_pillow_installed="13.0.0",
                avx2_build=False)


def test_stock_pillow_alone_is_called_fine_for_the_loader_and_pillow_simd_optional() -> None:
    """A wheel's user: stock Pillow, no pillow-simd ever installed; nothing was replaced."""
    warning = pil_warning(STOCK, extension=True)
    assert warning is not None and warning.startswith("PIL 13.0.0 is stock Pillow: fine for the "
                                                      "loader, which decodes and resizes JPEGs "
                                                      "in imgprep's extension; ")
    assert "replaced" not in warning and "reinstall" not in warning
    assert "the Pillow-side work (PNG and CMYK images, crop_decode=False) runs ~2x slower" \
        in warning
    assert warning.endswith("pillow-simd is optional (a checkout's `make setup` builds it; "
                            "docs/install.md)")


def test_stock_pillow_over_pillow_simd_is_said_to_have_replaced_it() -> None:
    """A development environment where something pulled stock Pillow over pillow-simd."""
    warning = pil_warning(replace(STOCK, pillow_simd_installed="12.1.1.post0"), extension=True)
    assert warning is not None and warning.startswith(
        "PIL 13.0.0 is stock Pillow, installed over pillow-simd 12.1.1.post0 (its files "
        "replaced pillow-simd's): fine for the loader")
    assert warning.endswith("to have pillow-simd back, reinstall it (docs/install.md)")


def test_stock_pillow_without_the_extension_is_not_called_fine() -> None:
    warning = pil_warning(STOCK, extension=False)
    assert warning is not None and "fine" not in warning
    assert "without imgprep's extension the loader decodes and resizes every image with it" \
        in warning


def test_versions_lists_imgprep_python_and_the_packages_in_order() -> None:
    v = versions()
    assert isinstance(v, Versions) and v.imgprep == __version__
    assert list(asdict(v)) == ["imgprep", "python", "platform", "numpy", "torch", "webdataset",
                               "tqdm", "click"]


@pytest.mark.skipif(not jpegcrop.AVAILABLE, reason=f"crop decode: {jpegcrop.status()}")
def test_probe_decode_counts_what_takes_the_pillow_path(tmp_path: Path) -> None:
    """A shard set written elsewhere, half of it progressive JPEGs: info says so."""
    progressive = encode(photo((64, 48), 1), "JPEG", progressive=True)
    write_split(tmp_path, "train", (6, 2),
                lambda i: progressive if i % 2 else jpeg((64, 48), seed=i))
    m = read_manifest(tmp_path, "train")
    assert probe_decode(tmp_path, m) == FastDecode(
        probed=6, fast=3, declined={"progressive or arithmetic-coded": 3})
    assert (two := probe_decode(tmp_path, m, limit=2)) is not None and two.probed == 2
    (tmp_path / m.shards[0].name).unlink()
    assert probe_decode(tmp_path, m) is None


def lib_record(**change: Any) -> jpegcrop.Library:
    base = {"version": "2.1.5", "bundled": True, "simd": True, "extension": "/x/_jpegcrop.so"}
    return jpegcrop.Library(**{**base, **change})


@pytest.mark.parametrize(("lib", "says"), [
    (lib_record(), None),
    (lib_record(bundled=False, simd=None), None),  # a system library: SIMD not known, no alarm
    (lib_record(simd=False), "libjpeg-turbo 2.1.5 runs without its SIMD kernels (/x/"),
    (None, "the crop-aware decoder is "),
])
def test_decoder_warning_names_a_missing_decoder_or_simd_off(
        lib: jpegcrop.Library | None, says: str | None) -> None:
    warning = decoder_warning(lib)
    assert warning == says if says is None else warning is not None and says in warning


@pytest.mark.skipif(not jpegcrop.AVAILABLE, reason=f"crop decode: {jpegcrop.status()}")
def test_the_extension_reports_its_libjpeg_turbo_and_simd() -> None:
    """make setup and the wheel link libjpeg-turbo in: SIMD is known, and on (x86-64 always
    has SSE2); a build against the system's library says it cannot tell."""
    lib = jpegcrop.library()
    assert lib is not None and lib.version is not None
    assert re.fullmatch(r"\d+\.\d+\.\d+", lib.version)
    assert Path(lib.extension).name.startswith("_jpegcrop") and Path(lib.extension).is_file()
    assert lib.simd is (True if lib.bundled else None)
    assert f"libjpeg-turbo {lib.version}" in jpegcrop.status()


def simd_in_child(**env: str) -> Any:
    code = ("import json, dataclasses; from imgprep import jpegcrop; "
            "print(json.dumps(dataclasses.asdict(jpegcrop.library())))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env=clean_env(PYTHONPATH=str(REPO), **env))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(LIB is None or not LIB.bundled,
                    reason=f"crop decode: {jpegcrop.status()}: not a libjpeg-turbo linked in, "
                           "so no SIMD switch to see (make setup links one in)")
def test_simd_off_is_reported_off() -> None:
    """libjpeg-turbo's own switch turns its kernels off: the report follows it, so a test
    that wants SIMD on can fail."""
    assert simd_in_child()["simd"] is True
    assert simd_in_child(JSIMD_FORCENONE="1")["simd"] is False


def test_info_strict_fails_when_the_decoders_simd_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jpegcrop, "library", lambda: lib_record(simd=False))
    r = invoke("info", "--strict", "--json")
    assert r.exit_code == 1
    assert json.loads(r.stdout)["libjpeg"]["simd"] is False
    assert "runs without its SIMD kernels" in r.stderr
