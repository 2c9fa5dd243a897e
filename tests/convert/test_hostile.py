"""Hostile and broken inputs, end to end, each checked for the three guarantees.

Every case goes through what a user runs: the ``imgprep`` command line (click's CliRunner, in
this process, so that faults can be injected with monkeypatch), and for manifests and label
lists also the loaders. For each case the test asserts:

(a) a clear message naming the offending file (and member or line): the CLI's one
    ``imgprep: error:`` line with the documented exit code (1: errors over --max-errors or
    problems found by verify, 3: could not run), an ``ImgprepError`` from the loaders, or, for
    a bad image or member inside an otherwise good run, its entry in ``<split>-errors.jsonl``;
(b) nothing written outside the output folder: the whole test folder is snapshotted (names,
    bytes, link targets) before and after, the working directory is moved deep inside it so
    that a relative or ``..`` write would land where the snapshot sees it, and the targets of
    escaping member names are checked to be absent;
(c) nothing lost from the rest of the run: every good image is in the output shards (read
    back with plain ``tarfile`` and compared with its own conversion), the good shards still
    load, or, when the whole run is refused, the same run with the input fixed completes in
    the same folder.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result
from PIL import Image

from imgprep.cli.commands import cli
from imgprep.convert.image import convert_image
from imgprep.errors import ImgprepError
from imgprep.inputs.devkit import devkit_wnids
from imgprep.inputs.synsets import imagenet_classes
from imgprep.job.world import World
from imgprep.sections import TransformOptions
from imgprep.shards.writers import header_bytes
from imgprep.stage import fill as stage
from loaders import LoaderError, LoaderOptions, ShardLoader, ValTransform, make_loader
from tests.support import (
    convert_sample,
    encode,
    jpeg,
    photo,
    published_label,
    tar_bytes,
    write_tar,
)

CLASSES = imagenet_classes()
W0, W1, W2 = CLASSES.wnids[10], CLASSES.wnids[500], CLASSES.wnids[900]
WNIDS = (W0, W1, W2)
SMALL = ValTransform(size=32, resize=32)  # loaders decode tiny crops: the data is what matters
ESCAPE = f"{W0}_escape"  # the stem of every member name that tries to leave the archive
ABSOLUTE = Path("/tmp/imgprep-hostile-absolute")  # where an absolute member name points


# ---------------------------------------------------------------------------- shared helpers


def run(*args: object) -> Result:
    """``imgprep ARGS`` in this process, so that monkeypatched faults reach it."""
    return CliRunner().invoke(cli, [str(a) for a in args])


def error_line(r: Result, code: int, *names: object) -> str:
    """Guarantee (a) for a refused run: exit ``code``, no traceback, and exactly one
    ``imgprep: error:`` line on stderr that names each of ``names``."""
    assert r.exit_code == code, f"exit {r.exit_code}, expected {code}: {r.output}"
    assert r.exception is None or type(r.exception) is SystemExit, repr(r.exception)
    found = [ln for ln in r.stderr.splitlines() if ln.startswith("imgprep: error: ")]
    assert len(found) == 1 and "Traceback" not in r.output, r.stderr
    for name in names:
        assert str(name) in found[0], (name, found[0])
    return found[0]


def problem_lines(r: Result) -> list[str]:
    return [ln for ln in r.stderr.splitlines() if ln.startswith("imgprep: problem: ")]


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: files by content hash, symbolic links by target (never
    followed), folders and special files by kind."""
    entries: dict[str, str] = {}
    for folder, subdirs, files in os.walk(root):
        for name in subdirs + files:
            p = Path(folder, name)
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                entries[rel] = f"link to {os.readlink(p)}"
            elif p.is_dir():
                entries[rel] = "folder"
            elif p.is_file():
                entries[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                entries[rel] = "special file"
    return entries


def outside(before: dict[str, str], after: dict[str, str], *inside: str) -> list[str]:
    """Guarantee (b): the entries that appeared, vanished or changed anywhere but in the
    ``inside`` folders (paths relative to the snapshot root)."""
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    return sorted(k for k in changed
                  if not any(k == d or k.startswith(f"{d}/") for d in inside))


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test folder; the working directory is four levels inside it, so that a relative
    write, even up to three ``..`` deep, lands where the snapshot sees it."""
    cwd = tmp_path / "cwd" / "a" / "b" / "c"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    return tmp_path


@cache
def good_images(wnid: str, n: int = 3) -> tuple[tuple[str, bytes], ...]:
    """``n`` small distinct JPEG members of class ``wnid``, named like ILSVRC2012 train files."""
    k = WNIDS.index(wnid)
    return tuple((f"{wnid}_{j}.JPEG", jpeg((96, 72), seed=100 * k + j)) for j in range(n))


def originals(*wnids: str) -> dict[str, tuple[str, bytes]]:
    """key -> (wnid, original bytes) of the good images of ``wnids``."""
    return {Path(n).stem: (w, data) for w in wnids for n, data in good_images(w)}


def shard_samples(out: Path, split: str) -> dict[str, dict[str, bytes]]:
    """key -> {extension: bytes} of every shard of ``split`` in ``out``, read with tarfile."""
    samples: dict[str, dict[str, bytes]] = {}
    for path in sorted(out.glob(f"{split}-*.tar")):
        with tarfile.open(path) as tf:
            for m in tf:
                f = tf.extractfile(m)
                assert f is not None, f"{path}: {m.name} is not a regular member"
                key, _, ext = m.name.partition(".")
                samples.setdefault(key, {})[ext] = f.read()
    return samples


def check_outputs(out: Path, labels: dict[str, str], split: str = "train",
                  sources: dict[str, bytes] | None = None) -> dict[str, dict[str, bytes]]:
    """Guarantee (c): the manifest and its shards hold exactly the keys of ``labels`` (key ->
    wnid), each a 256x256 RGB JPEG with its class index; a key in ``sources`` holds exactly
    the conversion of those original bytes (the right member was read). Returns the samples."""
    m = json.loads((out / f"{split}.json").read_text("utf-8"))
    assert sorted(s["name"] for s in m["shards"]) == sorted(
        p.name for p in out.glob(f"{split}-*.tar"))
    samples = shard_samples(out, split)
    assert sorted(samples) == sorted(labels)
    assert m["total_samples"] == len(samples)
    for key, fields in samples.items():
        assert int(fields["cls"]) == CLASSES.index(labels[key]), key
        with Image.open(io.BytesIO(fields["jpg"])) as img:
            assert (img.format, img.mode, img.size) == ("JPEG", "RGB", (256, 256)), key
        if sources and key in sources:
            assert fields["jpg"] == convert_image(sources[key], TransformOptions()).jpeg, key
    return samples


def logged(out: Path, split: str = "train") -> list[dict[str, str]]:
    return [json.loads(ln) for ln in (out / f"{split}-errors.jsonl").read_text().splitlines()]


def convert_args(src: Path, out: Path, *extra: object) -> list[object]:
    return ["convert", src, "-o", out, "-j", 1, "-q", "--json", "--shard-size", 3, *extra]


def refused_then_finished(src: Path, out: Path, errors: int) -> dict[str, Any]:
    """A run with bad items: exit 1 naming the error log, no manifest; the same run with
    --max-errors raised to ``errors`` finishes from the records. Returns its summary."""
    log = out / "train-errors.jsonl"
    error_line(run(*convert_args(src, out)), 1, log, "--max-errors 0")
    assert not (out / "train.json").exists()
    r = run(*convert_args(src, out, "--max-errors", errors))
    assert r.exit_code == 0, r.output
    summary: dict[str, Any] = json.loads(r.stdout)
    assert summary["errors"] == errors and summary["tasks_resumed"] == summary["tasks"]
    m = json.loads((out / "train.json").read_text("utf-8"))
    assert (m["errors"], m["error_log"]) == (errors, log.name)
    return summary


# ---------------------------------------------------------------------------- images


_WHOLE = jpeg((400, 300), seed=5)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` but which holds one row of pixels:
    a decompression bomb's shape, a few hundred bytes."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grayscale
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(bytes(width + 1))) + _chunk(b"IEND", b""))


def jpeg_declaring(width: int, height: int) -> bytes:
    """A small JPEG whose SOF0 marker is patched to declare ``width`` x ``height``."""
    data = bytearray(jpeg((64, 48), seed=6))
    sof = data.index(b"\xff\xc0")  # length (2 bytes), precision (1), height (2), width (2)
    assert struct.unpack(">HH", data[sof + 5:sof + 9]) == (48, 64)  # the fields patched
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def without_adobe_marker(data: bytes) -> bytes:
    """``data`` with its APP14 "Adobe" segment cut out (CMYK then reads as plain, uninverted)."""
    at = data.index(b"\xff\xee")  # APP14: marker, length (2 bytes), "Adobe", ...
    assert data[at + 4:at + 9] == b"Adobe"
    length = struct.unpack(">H", data[at + 2:at + 4])[0]
    stripped = data[:at] + data[at + 2 + length:]
    with Image.open(io.BytesIO(stripped)) as img:
        assert img.mode == "CMYK" and "adobe" not in img.info
    return stripped


def sixteen_bit_png() -> bytes:
    arr = np.asarray(photo((120, 90), seed=7).convert("L"), dtype=np.uint16) * 257
    data = encode(Image.fromarray(arr), "PNG")
    with Image.open(io.BytesIO(data)) as img:
        assert img.mode.startswith("I;16")
    return data


def palette_with_transparency() -> bytes:
    img = photo((120, 90), seed=8).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    data = encode(img, "PNG", transparency=3)
    with Image.open(io.BytesIO(data)) as back:
        assert back.mode == "P" and "transparency" in back.info
    return data


def exif_rotated() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    return encode(photo((160, 90), seed=9), "JPEG", exif=exif.tobytes())


@dataclass(frozen=True)
class ImageCase:
    """One image among good ones in a train tar. ``words``: the error log's reason holds one
    of them (empty: the image is valid and must convert to a 256x256 RGB sample); ``whole``: a
    truncation that can still decode every scanline, in which case it may convert, but only
    to exactly what the whole file gives (Pillow refuses any image short of pixel data)."""

    make: Callable[[], bytes]
    words: tuple[str, ...] = ()
    whole: bytes | None = None


IMAGES = {
    "zero-bytes": ImageCase(lambda: b"", ("empty file",)),
    "truncated-at-10": ImageCase(lambda: _WHOLE[:10], ("truncated",)),
    "truncated-at-200": ImageCase(lambda: _WHOLE[:200], ("truncated",)),
    "truncated-at-half": ImageCase(lambda: _WHOLE[:len(_WHOLE) // 2], ("truncated",)),
    "truncated-last-2-bytes": ImageCase(lambda: _WHOLE[:-2], ("truncated",), _WHOLE),
    "garbage-named-jpeg": ImageCase(
        lambda: np.random.default_rng(3).integers(0, 256, 4000, dtype=np.uint8).tobytes(),
        ("not an image",)),
    "html-error-page": ImageCase(
        lambda: b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n"
                b"<body>This photo is no longer available</body></html>\n", ("html page",)),
    "bomb-png-30000x30000": ImageCase(lambda: png_declaring(30_000, 30_000), ("bomb",)),
    "bomb-jpeg-30000x30000": ImageCase(lambda: jpeg_declaring(30_000, 30_000), ("bomb",)),
    "bomb-jpeg-10000x10000": ImageCase(lambda: jpeg_declaring(10_000, 10_000),
                                       ("--max-pixels",)),
    "1x1": ImageCase(lambda: jpeg((1, 1), seed=10)),
    "1x10000": ImageCase(lambda: jpeg((1, 10_000), seed=11)),
    "16-bit-png": ImageCase(sixteen_bit_png),
    "cmyk-with-adobe-marker": ImageCase(lambda: jpeg((120, 90), seed=12, mode="CMYK")),
    "cmyk-without-adobe-marker": ImageCase(
        lambda: without_adobe_marker(jpeg((120, 90), seed=12, mode="CMYK"))),
    "palette-with-transparency": ImageCase(palette_with_transparency),
    "exif-rotated": ImageCase(exif_rotated),
}


@pytest.mark.parametrize("case", [pytest.param(c, id=k) for k, c in IMAGES.items()])
def test_hostile_image(box: Path, case: ImageCase) -> None:
    hostile = f"{W0}_hostile"
    data = case.make()
    w0 = good_images(W0)
    (box / "src").mkdir()
    src = write_tar(box / "src" / "ILSVRC2012_img_train.tar", [
        (f"{W0}.tar", tar_bytes([*w0[:2], (f"{hostile}.JPEG", data), *w0[2:]])),
        (f"{W1}.tar", tar_bytes(good_images(W1)))])
    out = box / "out"
    good = originals(W0, W1)
    labels = {k: w for k, (w, _) in good.items()}
    sources = {k: b for k, (_, b) in good.items()}
    before = snapshot(box)

    first = run(*convert_args(src, out))
    if first.exit_code == 0:
        assert not case.words or case.whole is not None, f"a bad image was converted: {data[:40]!r}"
        samples = check_outputs(out, {**labels, hostile: W0}, sources=sources)
        assert not (out / "train-errors.jsonl").exists()
        meta = json.loads(samples[hostile]["json"])
        with Image.open(io.BytesIO(data)) as img:
            assert meta["original_size"] == list(img.size) and meta["original_mode"] == img.mode
        if case.whole is not None:  # decoded completely: the same output as the whole file
            whole = convert_image(case.whole, TransformOptions()).jpeg
            assert samples[hostile]["jpg"] == whole
    else:
        assert case.words, f"a valid image failed the run: {first.output}"
        refused_then_finished(src, out, 1)
        (entry,) = logged(out)
        assert (entry["source"], entry["key"]) == (f"{src}/{W0}.tar/{hostile}.JPEG", hostile)
        assert any(w in entry["reason"].lower() for w in case.words), entry["reason"]
        check_outputs(out, labels, sources=sources)
    assert outside(before, snapshot(box), "out") == []


# ---------------------------------------------------------------------------- archives


def _entry(name: str, **fields: Any) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    for k, v in fields.items():
        setattr(info, k, v)
    return info


def _outer(folder: Path, replace: dict[str, tuple[str, bytes]] | None = None) -> Path:
    """ILSVRC2012_img_train.tar in ``folder``/src: one class tar per wnid, good images only,
    except the (member name, bytes) that ``replace`` gives for some wnids."""
    members = [(replace or {}).get(w, (f"{w}.tar", tar_bytes(good_images(w)))) for w in WNIDS]
    (folder / "src").mkdir(exist_ok=True)
    return write_tar(folder / "src" / "ILSVRC2012_img_train.tar", members)


def _inner(folder: Path, wnid: str, members: list[Any]) -> tuple[str, bytes]:
    """The class tar of ``wnid`` holding ``members`` (links and devices too), built aside."""
    (folder / "build").mkdir(exist_ok=True)
    return f"{wnid}.tar", write_tar(folder / "build" / f"{wnid}.tar", members).read_bytes()


def with_member(member: tuple[str, bytes] | tarfile.TarInfo) -> Callable[[Path], Path]:
    """A train tar with ``member`` in the middle of W0's class tar."""
    def build(folder: Path) -> Path:
        w0 = list(good_images(W0))
        return _outer(folder, {W0: _inner(folder, W0, [*w0[:2], member, *w0[2:]])})
    return build


def with_class_tar(wnid: str, name: str, data: Callable[[], bytes]) -> Callable[[Path], Path]:
    """A train tar whose class tar of ``wnid`` is the member ``name`` holding ``data()``."""
    return lambda folder: _outer(folder, {wnid: (name, data())})


def _cut_class_tar() -> bytes:
    """W1's class tar cut in the middle of its last image's data."""
    whole = tar_bytes(good_images(W1))
    last = good_images(W1)[-1][1]
    return whole[:whole.rindex(last) + len(last) // 2]


def _gzipped_train_tar(folder: Path) -> Path:
    src = _outer(folder)
    src.write_bytes(gzip.compress(src.read_bytes()))
    return src


@dataclass(frozen=True)
class ArchiveCase:
    """A train tar with one hostile feature, written by ``build(test folder)``.

    ``refused``: one (path in the tar, word of the reason) per error-log entry, the run going
    on without them; ``lost``: good keys that go down with a refused container; ``fatal``:
    words of the one error line when the whole input is refused (exit 3), and ``fix`` repairs
    the input as that line says, after which the run must convert everything.
    """

    build: Callable[[Path], Path]
    refused: tuple[tuple[str, str], ...] = ()
    lost: frozenset[str] = frozenset()
    fatal: tuple[str, ...] = ()
    fix: Callable[[Path], None] | None = None


def _regular(name: str) -> tuple[str, bytes]:
    return name, jpeg((48, 32), seed=77)


W1_KEYS = frozenset(Path(n).stem for n, _ in good_images(W1))
ARCHIVES = {
    "dotdot-member": ArchiveCase(with_member(_regular(f"../{ESCAPE}.JPEG")),
                                 ((f"{W0}.tar/../{ESCAPE}.JPEG", "'..'"),)),
    "dotdot-deep-member": ArchiveCase(with_member(_regular(f"x/../../../{ESCAPE}.JPEG")),
                                      ((f"{W0}.tar/x/../../../{ESCAPE}.JPEG", "'..'"),)),
    "dotdot-class-tar": ArchiveCase(
        with_class_tar(W1, f"../{W1}.tar", lambda: tar_bytes(good_images(W1))),
        ((f"../{W1}.tar", "'..'"),), W1_KEYS),
    "absolute-member": ArchiveCase(with_member(_regular(f"{ABSOLUTE}/{ESCAPE}.JPEG")),
                                   ((f"{W0}.tar/{ABSOLUTE}/{ESCAPE}.JPEG", "absolute"),)),
    "symlink-member": ArchiveCase(
        with_member(_entry(f"{ESCAPE}_sym.JPEG", type=tarfile.SYMTYPE, linkname="/etc/passwd")),
        ((f"{W0}.tar/{ESCAPE}_sym.JPEG", "link"),)),
    "symlink-dir-member": ArchiveCase(
        with_member(_entry(f"{ESCAPE}_dir", type=tarfile.SYMTYPE, linkname="../../..")),
        ((f"{W0}.tar/{ESCAPE}_dir", "link"),)),
    "hardlink-member": ArchiveCase(
        with_member(_entry(f"{ESCAPE}_hard.JPEG", type=tarfile.LNKTYPE,
                           linkname=f"{W0}_0.JPEG")),
        ((f"{W0}.tar/{ESCAPE}_hard.JPEG", "link"),)),
    "char-device-member": ArchiveCase(
        with_member(_entry(f"{ESCAPE}_chr.JPEG", type=tarfile.CHRTYPE, devmajor=1, devminor=3)),
        ((f"{W0}.tar/{ESCAPE}_chr.JPEG", "device"),)),
    "block-device-member": ArchiveCase(
        with_member(_entry(f"{ESCAPE}_blk.JPEG", type=tarfile.BLKTYPE, devmajor=8)),
        ((f"{W0}.tar/{ESCAPE}_blk.JPEG", "device"),)),
    "fifo-member": ArchiveCase(
        with_member(_entry(f"{ESCAPE}_fifo.JPEG", type=tarfile.FIFOTYPE)),
        ((f"{W0}.tar/{ESCAPE}_fifo.JPEG", "fifo"),)),
    "duplicate-member-name": ArchiveCase(
        with_member(_regular(f"{W0}_0.JPEG")),  # the first one is kept
        ((f"{W0}.tar/{W0}_0.JPEG", "duplicate key"),)),
    "duplicate-key-in-two-class-tars": ArchiveCase(
        with_class_tar(W1, f"{W1}.tar", lambda: tar_bytes(
            [*good_images(W1), _regular(f"{W0}_1.JPEG")])),
        ((f"{W1}.tar/{W0}_1.JPEG", "duplicate key"),)),
    "truncated-class-tar": ArchiveCase(
        with_class_tar(W1, f"{W1}.tar", _cut_class_tar),
        ((f"{W1}.tar/{W1}_2.JPEG", "truncated"),), frozenset({f"{W1}_2"})),
    "garbage-class-tar": ArchiveCase(
        with_class_tar(W1, f"{W1}.tar", lambda: b"this is no tar\n" * 300),
        ((f"{W1}.tar", "not a readable tar"),), W1_KEYS),
    "gzipped-class-tar": ArchiveCase(
        with_class_tar(W1, f"{W1}.tar", lambda: gzip.compress(tar_bytes(good_images(W1)))),
        ((f"{W1}.tar", "gzip"),), W1_KEYS),
    "gzipped-train-tar": ArchiveCase(
        _gzipped_train_tar, fatal=("ILSVRC2012_img_train.tar", "gzip", "gunzip"),
        fix=lambda p: p.write_bytes(gzip.decompress(p.read_bytes()))),
}

# Listing in a fresh interpreter: its peak RSS over the baseline is what listing costs.
LISTING_PROBE = """
import json, resource, sys
from pathlib import Path
from imgprep.inputs.sources import list_source

def vm(field):
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith(field))

base = vm("VmRSS:")
listing = list_source(Path(sys.argv[1]))
print(json.dumps({"images": len(listing), "errors": len(listing.errors),
                  "first": listing.key_str(0), "last": listing.key_str(len(listing) - 1),
                  "sorted": bool((listing.key[:-1] < listing.key[1:]).all()),
                  "grew": vm("VmHWM:") - base}))
"""
MANY = 100_000


def escaped(box: Path) -> list[str]:
    """Files named like an escaping member wherever a naive extractor could have put them
    outside the test folder (inside it, the snapshot sees everything)."""
    spots = [box.parent, box.parent.parent, Path("/"), Path("/tmp"), ABSOLUTE]
    return sorted(str(p) for d in spots if d.is_dir() for p in d.glob(f"{ESCAPE}*"))


def check_listing_is_bounded(box: Path) -> None:
    """100,000 tiny members: listed completely, in order, within 200 MB of memory."""
    (box / "src").mkdir()
    src = box / "src" / "ILSVRC2012_img_val.tar"
    with open(src, "wb") as f:
        for i in range(MANY, 0, -1):  # reverse order: the listing must sort them
            f.write(header_bytes(f"ILSVRC2012_val_{i:08d}.JPEG", 0))
        f.write(bytes(1024))
    before = snapshot(box)
    proc = subprocess.run([sys.executable, "-c", LISTING_PROBE, str(src)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert (got["images"], got["errors"], got["sorted"]) == (MANY, 0, True)
    assert (got["first"], got["last"]) == ("ILSVRC2012_val_00000001", f"ILSVRC2012_val_{MANY:08d}")
    assert got["grew"] < 200 << 20, f"listing grew the process by {got['grew'] >> 20} MB"
    assert outside(before, snapshot(box)) == []


@pytest.mark.parametrize("case", [
    *(pytest.param(c, id=k) for k, c in ARCHIVES.items()),
    pytest.param(None, id="100000-tiny-members"),
])
def test_hostile_archive(box: Path, case: ArchiveCase | None) -> None:
    if case is None:
        check_listing_is_bounded(box)
        return
    assert escaped(box) == []
    src = case.build(box)
    out = box / "out"
    good = originals(*WNIDS)
    before = snapshot(box)
    if case.fatal:
        error_line(run(*convert_args(src, out)), 3, src, *case.fatal)
        assert not out.exists() or not any(out.iterdir())  # nothing converted, nothing half
        assert outside(before, snapshot(box), "out") == []
        assert case.fix is not None
        case.fix(src)
        assert run(*convert_args(src, out)).exit_code == 0
    else:
        refused_then_finished(src, out, len(case.refused))
        entries = sorted((e["source"], e["reason"]) for e in logged(out))
        expected = sorted((f"{src}/{path}", word) for path, word in case.refused)
        assert [s for s, _ in entries] == [s for s, _ in expected]
        for (_, reason), (_, word) in zip(entries, expected, strict=True):
            assert word in reason, reason
        assert outside(before, snapshot(box), "out") == []
    kept = {k: v for k, v in good.items() if k not in case.lost}
    check_outputs(out, {k: w for k, (w, _) in kept.items()},
                  sources={k: b for k, (_, b) in kept.items()})
    assert escaped(box) == []


# ---------------------------------------------------------------------------- ground truth




def published_wnid(n: int) -> str:
    """The published class of ``ILSVRC2012_val_%08d`` n."""
    return CLASSES.wnids[published_label(n)]


# Six published validation images with their published classes (convert compares every
# ILSVRC2012_val_* name with them).
VAL = {f"ILSVRC2012_val_{i:08d}": published_wnid(i) for i in range(1, 7)}
DEVKIT_ID = {w: i for i, w in enumerate(devkit_wnids(), 1)}  # the devkit's own (fixed) IDs
GT, MAP, CAFFE, KAGGLE = ("ILSVRC2012_validation_ground_truth.txt", "map_clsloc.txt", "val.txt",
                          "LOC_val_solution.csv")


def devkit(ids: list[object] | None = None, map_extra: str = "") -> dict[str, str]:
    """The devkit pair: one ID a line (default: the true ones) and map_clsloc.txt."""
    lines = ids if ids is not None else [DEVKIT_ID[w] for w in VAL.values()]
    mapping = "".join(f"{w} {DEVKIT_ID[w]} class_{k}\n" for k, w in enumerate(CLASSES.wnids))
    return {GT: "".join(f"{i}\n" for i in lines), MAP: mapping + map_extra}


def caffe(rows: list[tuple[str, object]] | None = None) -> dict[str, str]:
    """Caffe val.txt: ``name index`` a line (default: the true labels)."""
    rows = rows if rows is not None else [(k, CLASSES.index(w)) for k, w in VAL.items()]
    return {CAFFE: "".join(f"{k}.JPEG {i}\n" for k, i in rows)}


def kaggle(rows: list[tuple[str, str]] | None = None) -> dict[str, str]:
    """Kaggle LOC_val_solution.csv (default: the true labels)."""
    rows = rows if rows is not None else list(VAL.items())
    return {KAGGLE: "ImageId,PredictionString\n" + "".join(
        f"{k},{w} 10 20 30 40\n" for k, w in rows)}


TRUE = [(k, CLASSES.index(w)) for k, w in VAL.items()]
TRUE_IDS: list[object] = [DEVKIT_ID[w] for w in VAL.values()]
K2, K4, K6 = "ILSVRC2012_val_00000002", "ILSVRC2012_val_00000004", "ILSVRC2012_val_00000006"


@dataclass(frozen=True)
class LabelCase:
    """Ground truth for six val images, as {file name: text} passed as --labels in order.
    ``words``: what the one error line (exit 3) names; none: every image is converted with
    its true label. ``fixed``: the same form, correct, for the rerun after a refusal."""

    files: Callable[[], dict[str, str]]
    fixed: Callable[[], dict[str, str]]
    words: tuple[str, ...] = ()


LABELS = {
    "devkit-missing-entry": LabelCase(
        lambda: devkit(TRUE_IDS[:-1]), devkit,
        (f"{K6}.JPEG", "ILSVRC2012_img_val.tar", "no label")),
    "devkit-extra-entries": LabelCase(
        lambda: devkit([*TRUE_IDS, *(DEVKIT_ID[published_wnid(n)] for n in (7, 8))]), devkit),
    "devkit-duplicate-id-in-map": LabelCase(
        lambda: devkit(map_extra=f"{W2} {DEVKIT_ID[W1]} again\n"), devkit,
        (f"{MAP}:{len(CLASSES) + 1}", "listed twice")),
    "devkit-id-out-of-range": LabelCase(
        lambda: devkit([*TRUE_IDS[:2], 1001, *TRUE_IDS[3:]]), devkit,
        (f"{GT}:3", "devkit ID 1001")),
    "devkit-id-zero": LabelCase(
        lambda: devkit([TRUE_IDS[0], 0, *TRUE_IDS[2:]]), devkit, (f"{GT}:2", "devkit ID 0")),
    "caffe-missing-entry": LabelCase(lambda: caffe([r for r in TRUE if r[0] != K4]), caffe,
                                     (f"{K4}.JPEG", "ILSVRC2012_img_val.tar", "no label")),
    "caffe-extra-entry": LabelCase(
        lambda: caffe([*TRUE, ("ILSVRC2012_val_00000099", published_label(99))]), caffe),
    "caffe-duplicate-same-label": LabelCase(lambda: caffe([*TRUE, TRUE[1]]), caffe),
    "caffe-duplicate-conflicting": LabelCase(
        lambda: caffe([*TRUE, (K2, 999)]), caffe, (f"{CAFFE}:7", K2, "labelled both")),
    "caffe-index-1000": LabelCase(lambda: caffe([*TRUE[:2], (TRUE[2][0], 1000), *TRUE[3:]]),
                                  caffe, (f"{CAFFE}:3", "class index 1000")),
    "caffe-index-negative": LabelCase(lambda: caffe([*TRUE[:2], (TRUE[2][0], -1), *TRUE[3:]]),
                                      caffe, (f"{CAFFE}:3", "class index -1")),
    "kaggle-missing-entry": LabelCase(lambda: kaggle([r for r in VAL.items() if r[0] != K2]),
                                      kaggle, (f"{K2}.JPEG", "no label")),
    "kaggle-duplicate-conflicting": LabelCase(
        lambda: kaggle([*VAL.items(), (K4, CLASSES.wnids[0])]), kaggle,
        (f"{KAGGLE}:8", K4, "labelled both")),
    "kaggle-unknown-wnid": LabelCase(
        lambda: kaggle([*list(VAL.items())[:2], (K2[:-1] + "3", "n99999999"),
                        *list(VAL.items())[3:]]), kaggle, (f"{KAGGLE}:4", "n99999999")),
}


def write_truth(folder: Path, files: dict[str, str]) -> list[object]:
    """Write the ground-truth files in ``folder``; the ``--labels`` options naming them."""
    folder.mkdir(exist_ok=True)
    args: list[object] = []
    for name, text in files.items():
        (folder / name).write_text(text)
        args += ["--labels", folder / name]
    return args


@pytest.mark.parametrize("case", [pytest.param(c, id=k) for k, c in LABELS.items()])
def test_hostile_labels(box: Path, case: LabelCase) -> None:
    (box / "src").mkdir()
    images = {k: jpeg((80, 60), seed=i) for i, k in enumerate(VAL)}
    src = write_tar(box / "src" / "ILSVRC2012_img_val.tar",
                    [(f"{k}.JPEG", data) for k, data in images.items()])
    out = box / "out"
    labels = write_truth(box / "truth", case.files())
    before = snapshot(box)
    r = run(*convert_args(src, out, *labels))
    if case.words:
        error_line(r, 3, *case.words)
        assert not list(out.glob("val*")), "a refused run left output behind"
        assert outside(before, snapshot(box), "out") == []
        r = run(*convert_args(src, out, *write_truth(box / "fixed", case.fixed())))
    else:
        assert outside(before, snapshot(box), "out") == []
    assert r.exit_code == 0, r.output
    check_outputs(out, VAL, "val", sources=images)


# ---------------------------------------------------------------------------- manifests


@pytest.fixture(scope="module")
def converted_nine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The nine good images of three classes converted into 4 shards (read-only: tests damage
    copies)."""
    folder = tmp_path_factory.mktemp("converted")
    _outer(folder)
    return convert_sample(folder / "src", folder / "shards", train_shards=4, workers=1)


def copy_converted(converted: Path, dest: Path) -> Path:
    return Path(shutil.copytree(converted, dest, ignore=shutil.ignore_patterns(".imgprep")))


def manifest_of(folder: Path) -> dict[str, Any]:
    m: dict[str, Any] = json.loads((folder / "train.json").read_text("utf-8"))
    return m


def shard_loader(folder: Path, world: World) -> ShardLoader:
    """One rank's in-process loader, one sample a batch, every sample once."""
    return ShardLoader(folder, "train", world,
                       LoaderOptions(batch_size=1, workers=0, tail="uneven", transform=SMALL))


def rank_labels(loader: ShardLoader) -> list[int]:
    """Every label the loader yields over its epoch."""
    return [int(y) for _, labels in loader for y in labels]


def rank_shards(loader: ShardLoader) -> set[str]:
    """The shards the loader's rank reads in its epoch, from its plan (nothing is read)."""
    return {loader.shards.names[i] for group in loader.plan().worker_shards for i in group}


def expected_labels() -> Counter[int]:
    return Counter(CLASSES.index(w) for w, _ in originals(*WNIDS).values())


def _edit_manifest(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], str]:
    def damage(folder: Path) -> str:
        m = manifest_of(folder)
        change(m)
        (folder / "train.json").write_text(json.dumps(m))
        return "train.json"
    return damage


def _wrong_sha256(folder: Path) -> str:
    m = manifest_of(folder)
    m["shards"][1]["sha256"] = hashlib.sha256(b"something else").hexdigest()
    (folder / "train.json").write_text(json.dumps(m))
    return str(m["shards"][1]["name"])


def _missing_shard(folder: Path) -> str:
    name = str(manifest_of(folder)["shards"][1]["name"])
    (folder / name).unlink()
    return name


def _invalid_json(folder: Path) -> str:
    text = (folder / "train.json").read_text("utf-8")
    (folder / "train.json").write_text(text[:len(text) // 2])  # cut short, as by bit rot
    return "train.json"


@dataclass(frozen=True)
class ManifestCase:
    """``damage(folder)`` breaks a copy of a good conversion and names what it broke.

    ``fatal``: words every reader of the manifest names when refusing it (verify, info and
    stage-to-node exit 3; the loader raises); otherwise shard 1 is damaged: verify reports
    it (``problem``), stage-to-node stops on it (``stage``), and ``loader_fails`` says whether
    the rank that reads it fails (checksums are verify's and stage-to-node's job, not the
    loader's, which reads what the manifest counts).
    """

    damage: Callable[[Path], str]
    fatal: tuple[str, ...] = ()
    problem: str = ""
    stage: str = ""
    loader_fails: bool = False


MANIFESTS = {
    "wrong-sha256": ManifestCase(_wrong_sha256, problem="sha256 differs",
                                 stage="sha256"),
    "missing-shard": ManifestCase(_missing_shard, problem="missing", stage="vanished",
                                  loader_fails=True),
    "unknown-format-version": ManifestCase(
        _edit_manifest(lambda m: m.update(format_version=2)),
        fatal=("format version 2", "not supported")),
    "invalid-json": ManifestCase(_invalid_json, fatal=("not valid JSON",)),
}


@pytest.mark.parametrize("case", [pytest.param(c, id=k) for k, c in MANIFESTS.items()])
def test_hostile_manifest(box: Path, converted_nine: Path, case: ManifestCase) -> None:
    data = copy_converted(converted_nine, box / "data")
    original = (data / "train.json").read_bytes()
    hit = case.damage(data)
    dst = box / "node"
    before = snapshot(box)

    verify = run("verify", data, "-q", "--json")
    info = run("info", data, "--json")
    staging = run("stage-to-node", "--src", data, "--dst", dst, "--jobs", 1, "-q", "--json")
    if case.fatal:
        for r in (verify, info, staging):
            error_line(r, 3, data / hit, *case.fatal)
        with pytest.raises(ImgprepError, match="train.json") as refused:
            make_loader(data, "train", World(),
                        LoaderOptions(batch_size=4, workers=0, transform=SMALL))
        assert all(w in str(refused.value) for w in case.fatal), refused.value
        assert outside(before, snapshot(box)) == []  # refused before anything was written
        (data / "train.json").write_bytes(original)  # the shards are intact: nothing lost
        assert run("verify", data, "-q").exit_code == 0
        assert Counter(rank_labels(shard_loader(data, World()))) == expected_labels()
        return

    shards = {s["name"]: s["samples"] for s in manifest_of(data)["shards"]}
    lines = problem_lines(verify)
    assert verify.exit_code == 1 and len(lines) == 1, verify.stderr
    assert hit in lines[0] and case.problem in lines[0], lines[0]
    report = json.loads(verify.stdout)  # every other shard was read and decoded
    assert (report["checked"], report["samples"]) == (4, sum(shards.values()) - shards[hit])
    summary = json.loads(info.stdout)["manifests"][0]  # info describes, it does not check
    assert info.exit_code == 0 and summary["samples"] == sum(shards.values())

    error_line(staging, 3, data / hit, case.stage)
    assert not (dst / hit).exists() and not (dst / "train.json").exists()
    staged = sorted(p.name for p in dst.glob("*.tar"))
    assert staged == [s["name"] for s in manifest_of(data)["shards"][:1]]  # --jobs 1: in order
    for name in staged:
        assert (dst / name).read_bytes() == (converted_nine / name).read_bytes()
    assert not list(dst.rglob(".tmp-*"))
    assert outside(before, snapshot(box), "node") == []

    got: Counter[int] = Counter()
    for rank in (0, 1):
        loader = shard_loader(data, World(rank=rank, world_size=2, local_rank=rank,
                                          local_world_size=2))
        names = rank_shards(loader)
        if case.loader_fails and hit in names:
            with pytest.raises(LoaderError, match=f"rank {rank}: .*{hit}") as failed:
                rank_labels(loader)
            assert "\n" not in str(failed.value)
            continue
        labels = rank_labels(loader)  # the good shards still load, all of them
        assert len(labels) == sum(loader.plan().worker_samples)  # every planned sample
        got.update(labels)
    if not case.loader_fails:
        assert got == expected_labels()


# ---------------------------------------------------------------------------- label lists


GOOD_LINES = [f"img/{i}.jpg {i}" for i in range(4)]


@dataclass(frozen=True)
class ListCase:
    """A Chainer list over four good images: ``text`` (``{secret}``: an image outside the
    root); ``line``: the hostile line's number, and ``words`` what its refusal names (none:
    the list is valid and every entry loads with its label). ``verify_ok``: whether
    ``imgprep verify`` passes it (it also refuses what Chainer's LabeledImageDataset would)."""

    text: str
    line: int = 0
    words: tuple[str, ...] = ()
    verify_ok: bool = False


def _hostile_line(line: str) -> str:
    return "\n".join([*GOOD_LINES[:2], line, *GOOD_LINES[2:]]) + "\n"


LISTS = {
    "dotdot-path": ListCase(_hostile_line("../secret.jpg 5"), 3, ("outside",)),
    "dotdot-through-subfolder": ListCase(_hostile_line("img/../../secret.jpg 5"), 3,
                                         ("outside",)),
    "absolute-path": ListCase(_hostile_line("{secret} 5"), 3, ("outside",)),
    "symlink-leaving-root": ListCase(_hostile_line("img/link.jpg 5"), 3, ("outside",)),
    "space-in-path": ListCase(_hostile_line("img/my photo.jpg 5"), 3, ("expected 'path label'",)),
    "missing-label": ListCase(_hostile_line("img/0.jpg"), 3, ("expected 'path label'",)),
    "label-not-an-integer": ListCase(_hostile_line("img/0.jpg cat"), 3,
                                     ("expected 'path label'",)),
    "label-float": ListCase(_hostile_line("img/0.jpg 1.5"), 3, ("expected 'path label'",)),
    "label-out-of-range": ListCase(_hostile_line("img/0.jpg 1000"), 3, ("outside 0..999",)),
    "label-negative": ListCase(_hostile_line("img/0.jpg -1"), 3, ("label -1",)),
    "not-utf8": ListCase(_hostile_line("img/caf\xe9.jpg 5"), 3, ("UTF-8",)),
    "trailing-whitespace": ListCase("".join(f"{ln}  \t\n" for ln in GOOD_LINES), verify_ok=True),
    "tab-separated": ListCase("".join(f"{ln.replace(' ', chr(9))}\n" for ln in GOOD_LINES),
                              verify_ok=True),
    "crlf-line-ends": ListCase("".join(f"{ln}\r\n" for ln in GOOD_LINES), verify_ok=True),
    "blank-lines": ListCase("\n" + "\n   \n".join(GOOD_LINES) + "\n\n"),
}


def list_root(box: Path) -> Path:
    """``box``/lists/img/{0..3}.jpg (256x256 RGB, as converted), a secret image beside the
    root, and img/link.jpg, a symbolic link to it."""
    root = box / "lists"
    (root / "img").mkdir(parents=True)
    for i in range(4):
        (root / "img" / f"{i}.jpg").write_bytes(jpeg((256, 256), seed=40 + i))
    (root / "img" / "my photo.jpg").write_bytes(jpeg((256, 256), seed=44))
    (box / "secret.jpg").write_bytes(jpeg((256, 256), seed=45))
    (root / "img" / "link.jpg").symlink_to(box / "secret.jpg")
    return root


def list_labels(path: Path) -> list[int]:
    """The labels of every batch of ``path`` through ``loaders.make_loader`` (val: in order)."""
    loader = make_loader(path, "val", World(),
                         LoaderOptions(batch_size=4, workers=0, transform=SMALL), num_classes=1000)
    return [int(y) for images, labels in loader for y in labels if images.any()]


@pytest.mark.parametrize("case", [pytest.param(c, id=k) for k, c in LISTS.items()])
def test_hostile_label_list(box: Path, case: ListCase) -> None:
    root = list_root(box)
    lst = root / "l.txt"
    lst.write_bytes(case.text.format(secret=box / "secret.jpg").encode("latin-1"))
    before = snapshot(box)
    if case.words:
        with pytest.raises(ImgprepError) as refused:
            list_labels(lst)
        msg = str(refused.value)
        assert f"{lst}:{case.line}" in msg and "\n" not in msg, msg
        assert all(w in msg for w in case.words), msg
        kept = case.text.splitlines()
        del kept[case.line - 1]
        good = root / "good.txt"
        good.write_text("\n".join(kept) + "\n")
        assert list_labels(good) == [0, 1, 2, 3]  # the rest of the list is fine
        good.unlink()
    else:
        assert list_labels(lst) == [0, 1, 2, 3]
    verify = run("verify", lst, "-q", "--json")
    if case.verify_ok:
        assert verify.exit_code == 0 and not problem_lines(verify), verify.stderr
    else:
        assert verify.exit_code == 1, verify.output
        assert all(ln.startswith("imgprep: problem: l.txt:") for ln in problem_lines(verify))
        if case.line:
            assert f"l.txt:{case.line}:" in problem_lines(verify)[0], verify.stderr
    assert outside(before, snapshot(box)) == []


# ---------------------------------------------------------------------------- staging


def read_only(monkeypatch: pytest.MonkeyPatch, folder: Path) -> Path:
    """Make writes under ``folder`` fail with EROFS, as on a read-only mount, and return it.
    The tests run as root, whom chmod does not stop, so the file-system calls are refused."""
    real_mkdir, real_open = os.mkdir, os.open
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def refuse(path: Any) -> None:
        if Path(os.path.abspath(path)).is_relative_to(folder):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    def mkdir(path: Any, mode: int = 0o777, **kw: Any) -> None:
        refuse(path)
        real_mkdir(path, mode, **kw)

    def open_(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if flags & writes:
            refuse(path)
        return real_open(path, flags, mode, **kw)

    folder.chmod(0o555)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "open", open_)
    return folder


def disk_full_at(monkeypatch: pytest.MonkeyPatch, dst: Path, shard: str) -> Path:
    """The disk under ``dst`` fills up while ``shard`` is being copied (ENOSPC from the
    kernel copy); returns ``dst``."""
    real = os.copy_file_range

    def copy(src: int, dst: int, count: int, *args: Any) -> int:
        if os.readlink(f"/proc/self/fd/{dst}").endswith(f".tmp-{shard}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(src, dst, count, *args)

    monkeypatch.setattr(os, "copy_file_range", copy)
    return dst


def little_free_space(monkeypatch: pytest.MonkeyPatch, dst: Path) -> Path:
    """Only 1000 bytes free under ``dst`` (returned): the check before copying must stop."""
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    return dst


def _symlinked_dst(box: Path, target: str) -> Path:
    (box / target).mkdir(exist_ok=True)
    (box / "node").symlink_to(box / target)
    return box / "node"


def _planted_tmp_link(box: Path, victim: str) -> Path:
    """A --dst holding a symbolic link at the temporary name of shard 0, pointing outside."""
    dst = box / "node"
    dst.mkdir()
    (dst / ".tmp-train-000000.tar").symlink_to(box / victim)
    return dst


def _link_after_sweep(box: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A link at shard 0's temporary name that the sweep does not see (planted after it)."""
    monkeypatch.setattr(stage, "sweep_tmp", lambda folder, keep=(): 0)
    return _planted_tmp_link(box, "victim.tar")


def _fresh_dst(box: Path) -> Path:
    (box / "node").mkdir()
    return box / "node"


@dataclass(frozen=True)
class StageCase:
    """``arrange(test folder, monkeypatch)`` prepares --dst (returned) and any fault.
    ``words``: what the one error line (exit 3) names, after which the rerun without the
    fault must finish (none: staging succeeds at once); ``lands``: the folder (relative to
    the test folder) where staged files appear; ``kept``: shards a failed run leaves staged."""

    arrange: Callable[[Path, pytest.MonkeyPatch], Path]
    words: tuple[str, ...] = ()
    lands: str = "node"
    kept: int = 0


STAGING = {
    "dst-is-symlink": StageCase(lambda box, mp: _symlinked_dst(box, "nvme"), lands="nvme"),
    "dst-symlink-to-source": StageCase(lambda box, mp: _symlinked_dst(box, "server"),
                                       ("--dst", "is the source folder"), lands=""),
    "dangling-tmp-symlink": StageCase(lambda box, mp: _planted_tmp_link(box, "victim.tar")),
    "tmp-symlink-to-file": StageCase(lambda box, mp: _planted_tmp_link(box, "secret.jpg")),
    "tmp-symlink-planted-after-sweep": StageCase(
        _link_after_sweep, ("cannot write train-000000.tar", "symbolic links", "rerun")),
    "read-only": StageCase(lambda box, mp: read_only(mp, _fresh_dst(box)),
                           ("Read-only file system", ".imgprep-stage", "writable")),
    "full-disk-before-copy": StageCase(lambda box, mp: little_free_space(mp, _fresh_dst(box)),
                                       ("1.00 kB free", "4 shards", "another --dst")),
    "full-disk-mid-copy": StageCase(
        lambda box, mp: disk_full_at(mp, _fresh_dst(box), "train-000002.tar"),
        ("disk full writing train-000002.tar", "rerun"), kept=2),
}


@pytest.mark.parametrize("case", [pytest.param(c, id=k) for k, c in STAGING.items()])
def test_hostile_staging(box: Path, converted_nine: Path, case: StageCase,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    server = copy_converted(converted_nine, box / "server")
    (box / "secret.jpg").write_bytes(b"not to be overwritten\n")
    dst = case.arrange(box, monkeypatch)
    before = snapshot(box)
    args = ("stage-to-node", "--src", server, "--dst", dst, "--jobs", 1, "-q", "--json")
    r = run(*args)
    if case.words:
        error_line(r, 3, dst, *case.words)
        assert outside(before, snapshot(box), case.lands or "-") == []
        if case.lands:
            assert not (dst / "train.json").exists() and not list(dst.rglob(".tmp-*"))
            staged = sorted(dst.glob("train-*.tar"))
            assert len(staged) == case.kept
            for p in staged:  # what was staged is whole
                assert p.read_bytes() == (server / p.name).read_bytes()
        cwd = Path.cwd()
        monkeypatch.undo()  # the fault is gone (and the disk is writable again)
        monkeypatch.chdir(cwd)
        if not case.lands:
            assert run("verify", server, "-q").exit_code == 0  # the source is untouched
            return
        dst.chmod(0o755)
        before = snapshot(box)
        r = run(*args)
    assert r.exit_code == 0, r.output
    assert outside(before, snapshot(box), case.lands) == []
    for p in dst.glob("train-*.tar"):
        assert p.is_file() and not p.is_symlink(), p
    assert run("verify", dst, "-q").exit_code == 0
    assert Counter(rank_labels(shard_loader(dst, World()))) == expected_labels()
