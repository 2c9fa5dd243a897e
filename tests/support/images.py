"""Images, tars and ground truth made on the fly: synthetic photos, plain and nested tars, the
published validation labels."""

from __future__ import annotations

import functools
import gzip
import io
import tarfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PIL import Image

from imgprep.inputs.fakeset import synthetic_photo
from imgprep.inputs.synsets import imagenet_val_labels


def published_label(n: int) -> int:
    """The published class index of ``ILSVRC2012_val_%08d`` n."""
    return int(imagenet_val_labels()[n - 1])


def published_val_txt(numbers: Iterable[int], offset: int = 0, sep: str = " ") -> str:
    """Caffe ``val.txt`` lines for ``ILSVRC2012_val_%08d.JPEG`` of ``numbers``, each with its
    published label plus ``offset``."""
    return "".join(f"ILSVRC2012_val_{n:08d}.JPEG{sep}{published_label(n) + offset}\n"
                   for n in numbers)


def photo(size: tuple[int, int] = (160, 120), seed: int = 0) -> Image.Image:
    """The synthetic photo of ``seed``: a new image each call (callers may draw on it), from
    pixels drawn once per process (the fixtures of many files ask for the same ones)."""
    return Image.frombytes("RGB", size, _photo_pixels((size[0], size[1]), seed))


@functools.lru_cache(maxsize=256)
def _photo_pixels(size: tuple[int, int], seed: int) -> bytes:
    return synthetic_photo(np.random.default_rng(seed), size).tobytes()


def encode(img: Image.Image, fmt: str = "JPEG", **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def jpeg(size: tuple[int, int] = (160, 120), seed: int = 0, mode: str = "RGB") -> bytes:
    """A small synthetic JPEG in ``mode`` (RGB, L or CMYK), encoded once per process."""
    return _jpeg((size[0], size[1]), seed, mode)


@functools.lru_cache(maxsize=2048)
def _jpeg(size: tuple[int, int], seed: int, mode: str) -> bytes:
    return encode(photo(size, seed).convert(mode), "JPEG", quality=90)


def restart_out_of_order() -> bytes:
    """A JPEG whose middle restart marker has the wrong number: libjpeg warns, resyncs, and
    decodes every row."""
    data = bytearray(encode(photo((380, 260), 12), "JPEG", quality=90, restart_marker_rows=1))
    scan = data.index(b"\xff\xda")
    rst = [i for i in range(scan, len(data) - 1)
           if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]
    i = rst[len(rst) // 2]
    data[i + 1] = 0xD0 + (data[i + 1] - 0xD0 + 3) % 8
    return bytes(data)


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


def devkit_archive(path: Path, truth: bytes, extra: Iterable[tarfile.TarInfo] = (),
                   compress: bool = True) -> Path:
    """``ILSVRC2012_devkit_t12.tar.gz`` as image-net.org ships it, around the ground truth
    ``truth``: a folder, COPYING, data/meta.mat (made-up bytes: never read), the ground truth,
    an evaluation script, then ``extra`` members (a file's data is ``x`` bytes)."""
    top = "ILSVRC2012_devkit_t12"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        folder = tarfile.TarInfo(top)
        folder.type = tarfile.DIRTYPE
        tf.addfile(folder)
        for name, data in ((f"{top}/COPYING", b"licence\n"),
                           (f"{top}/data/meta.mat", bytes(range(256)) * 40),
                           (f"{top}/data/ILSVRC2012_validation_ground_truth.txt", truth),
                           (f"{top}/evaluation/eval_flat.m", b"% matlab\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for info in extra:
            tf.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    data = buf.getvalue()
    path.write_bytes(gzip.compress(data, mtime=0) if compress else data)
    return path


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
