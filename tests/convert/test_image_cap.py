"""``--max-image-bytes``: an image whose recorded size is over the cap is a bad image, named
and counted against ``--max-errors``, refused before anything of it is read, in every form;
so a run's memory does not depend on what an archive claims (docs/guarantees.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path
from typing import Any

import pytest

from bench.common import TreePeaks
from imgprep.convert.options import DEFAULT_MAX_IMAGE_BYTES
from imgprep.inputs.fakes import SampleSpec, make_fake
from tests.support import REPO, jpeg
from tests.support.cli import invoke

SPEC = SampleSpec(classes=3, per_class=5, val=0, seed=5)  # train only: FAST converts train
FORMS = ("ilsvrc", "kaggle", "kaggle-zip", "hf-parquet", "hf-targz", "wds")
FAST = ("--size", "32", "-q", "--json", "--split", "train", "-j", "1")
ZIP = "imagenet-object-localization-challenge.zip"
MIB = 1 << 20


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cap")
    return {form: Path(make_fake(form, root / form, SPEC).inputs[0]) for form in FORMS}


@pytest.fixture(scope="module")
def biggest(fakes: dict[str, Path]) -> tuple[int, set[str]]:
    """A cap that exactly the two largest train images exceed, and their keys (every form
    holds the same image bytes)."""
    sizes = sorted((p.stat().st_size, p.stem) for p in fakes["kaggle"].rglob("train/*/*.JPEG"))
    assert sizes[-3][0] < sizes[-2][0], "the fake set needs two images larger than the rest"
    return sizes[-3][0], {sizes[-2][1], sizes[-1][1]}


def logged(out: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in (out / "train-errors.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("form", FORMS)
def test_an_image_over_the_cap_is_a_bad_image_named_in_every_form(
        fakes: dict[str, Path], biggest: tuple[int, set[str]], tmp_path: Path,
        form: str) -> None:
    """Exactly the two images over the cap, or, in a parquet, every row of a row group that
    would take more than the cap to read (the finest unit pyarrow can leave unread)."""
    cap, keys = biggest
    r = invoke("convert", fakes[form], "-o", tmp_path / "out", *FAST,
               "--max-image-bytes", cap)
    assert r.exit_code == 1, r.output  # bad images, over --max-errors 0
    errors = logged(tmp_path / "out")
    for key in keys:
        assert any(key in e["source"] for e in errors), (key, errors)
    for e in errors:
        assert f"over --max-image-bytes ({cap:,}); not read" in e["reason"]
        assert e["key"] and e["key"] in e["source"], e  # the log names the member's key
        if form == "hf-parquet":
            assert e["reason"].startswith("its row group "), e
    if form != "hf-parquet":
        assert len(errors) == 2, errors
    again = invoke("convert", fakes[form], "-o", tmp_path / "out", *FAST,
                   "--max-image-bytes", cap, "--max-errors", len(errors))
    summary = json.loads(again.stdout)
    assert again.exit_code == 0 and summary["errors"] == len(errors)
    assert summary["samples"] == SPEC.classes * SPEC.per_class - len(errors)


def test_the_cap_is_an_option_with_a_default_well_above_imagenet() -> None:
    r = invoke("convert", "--help")
    assert "--max-image-bytes" in r.output and str(DEFAULT_MAX_IMAGE_BYTES) in r.output
    assert DEFAULT_MAX_IMAGE_BYTES >= 4 * 15_000_000  # the largest ILSVRC2012 JPEG: ~15 MB


SMALL = 400  # the bomb zip's real images: at about 1 ms each, workers that live long enough


class _ZeroDeflater:
    """Raw deflate of a member written as 1 MiB blocks of zeros: one block's deflate, ended
    by a full flush (so it stands alone), made once and given for every block; the same
    stream as deflating each block, in microseconds where deflating a GiB takes seconds."""

    ZERO = bytes(MIB)

    def __init__(self) -> None:
        deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
        self.block = deflate.compress(self.ZERO) + deflate.flush(zlib.Z_FULL_FLUSH)
        self.end = deflate.flush()
        inflate = zlib.decompressobj(-15)
        assert inflate.decompress(self.block * 2 + self.end) == self.ZERO * 2 and inflate.eof

    def compress(self, data: bytes) -> bytes:
        assert data == self.ZERO
        return self.block

    def flush(self) -> bytes:
        return self.end


def _bomb_zip(path: Path, members: int, size: int) -> Path:
    """Kaggle's zip with ``SMALL`` train images (enough to keep two workers busy for a
    while: the sampler must see them) and ``members`` zero-filled ones of ``size`` bytes
    (deflated to about a thousandth, by ``_ZeroDeflater``)."""
    top = "ILSVRC/Data/CLS-LOC/train/"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for k in range(SMALL):
            wnid = ("n01440764", "n01443537")[k % 2]
            zf.writestr(f"{top}{wnid}/{wnid}_{k}.JPEG", jpeg((320, 240), seed=k % 16))
        zero = bytes(MIB)
        for k in range(members):
            info = zipfile.ZipInfo(f"{top}n01440764/n01440764_9999{k}.JPEG",
                                   date_time=(2019, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(zipfile, "_get_compressor", lambda *_: _ZeroDeflater())
                with zf.open(info, "w", force_zip64=True) as w:
                    for _ in range(size // MIB):
                        w.write(zero)
    return path


def _measured(src: Path, out: Path, *extra: object) -> tuple[int, dict[str, Any], TreePeaks]:
    """Convert in a child process, its process tree sampled every 20 ms."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "imgprep", "convert", str(src), "-o", str(out), "-q",
           "--json", *map(str, extra)]
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    with TreePeaks([child.pid], every_s=0.02) as peaks:
        stdout, stderr = child.communicate(timeout=600)
    assert stdout, stderr
    return child.returncode, json.loads(stdout), peaks


@pytest.mark.slow
def test_a_zip_of_two_1_gib_zero_members_converts_on_2_workers_under_400_mb(
        tmp_path: Path) -> None:
    src = _bomb_zip(tmp_path / ZIP, members=2, size=1 << 30)
    assert src.stat().st_size < 16 * MIB
    code, summary, peaks = _measured(src, tmp_path / "out", "-j", 2, "--max-errors", 2)
    assert code == 0 and summary["samples"] == SMALL and summary["errors"] == 2
    assert peaks.procs >= 3  # the run and its two workers were sampled
    assert peaks.rss_kb < 400 * 1024, f"{peaks.rss_kb // 1024} MB summed over the run"
    for entry in logged(tmp_path / "out"):
        assert "its central directory records 1,073,741,824 bytes" in entry["reason"]
