"""What ``imgprep info`` reports (``imgprep.shards.info``): records whose ``asdict`` is the
JSON the command prints, and the one-line warning when PIL is not the fast build."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from imgprep import PilInfo, __version__, jpegcrop, pil_info, resample
from imgprep.shards.info import Versions, pil_warning, probe_decode, versions
from imgprep.shards.manifest import read_manifest
from tests.support import jpeg
from tests.support.images import encode, photo
from tests.support.shards import write_split

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
                                  "libjpeg_turbo", "jpeg_version", "core", "cpu_avx2",
                                  "avx2_build", "crop_decode", "resampler"]


@pytest.mark.parametrize(("change", "says"), [
    ({}, None),
    ({"avx2_build": None}, None),  # not checked: no warning
    ({"pillow_simd": False}, "PIL 9.5.0.post1 is not pillow-simd: "),
    ({"pillow_simd": False, "stock_pillow_installed": "10.0"},
     "(stock Pillow is installed and replaced it)"),
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
    assert probe_decode(tmp_path, m) == {
        "probed": 6, "fast": 3, "declined": {"progressive or arithmetic-coded": 3}}
    assert probe_decode(tmp_path, m, limit=2)["probed"] == 2
    (tmp_path / m.shards[0].name).unlink()
    assert probe_decode(tmp_path, m) == {}
