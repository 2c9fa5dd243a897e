"""The sample index (``imgprep.shards.index``): written by convert, rebuilt by ``imgprep index``
from tar headers alone, and refused by the loader when it is missing, truncated, altered, from
another conversion or pointing past the end of a shard (each error names the file and the
command that fixes it)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from imgprep.cli.commands import cli
from imgprep.errors import ManifestError, ShardError
from imgprep.inputs.synsets import imagenet_classes
from imgprep.job.world import World
from imgprep.sections import ManifestOptions
from imgprep.shards.index import encode_index, read_index, write_index
from imgprep.shards.layout import LayoutBuilder, scan_layout
from imgprep.shards.manifest import Manifest, ShardEntry, read_manifest, write_manifest
from imgprep.shards.writers import ShardWriter
from loaders import LoaderOptions
from loaders.errors import LoaderError
from loaders.shards import ShardLoader
from loaders.transforms import ValTransform
from tests.support import jpeg

SIZES = (5, 3, 4)


def make_set(folder: Path, seed: int = 0, meta: bool = True) -> Manifest:
    """Shards of SIZES samples (jpg, cls and maybe json members) with manifest and index."""
    folder.mkdir(parents=True, exist_ok=True)
    entries, layouts, i = [], [], 0
    for k, n in enumerate(SIZES):
        with ShardWriter(folder / f"train-{k:06d}.tar") as w:
            for _ in range(n):
                fields = {"jpg": jpeg((48 + i, 40), seed=i + seed), "cls": str(i).encode()}
                if meta:
                    fields["json"] = json.dumps({"i": i, "pad": "x" * (i * 90)}).encode()
                w.add(f"n01440764_{i:05d}", fields)
                i += 1
        entries.append(ShardEntry(w.path.name, w.samples, w.bytes, w.sha256))
        layouts.append(w.layout())
    m = Manifest(split="train", format="shards", total_samples=i,
                 classes=imagenet_classes().to_json(), mean=[0.5] * 3, std=[0.25] * 3,
                 options=ManifestOptions(format="shards", split="train"),
                 tool_version="test", shards=entries,
                 index=write_index(folder, "train", entries, layouts))
    write_manifest(folder, m)
    return m


def labels(folder: Path) -> list[int]:
    loader = ShardLoader(folder, "train", World(),
                         LoaderOptions(batch_size=4, workers=0, tail="uneven",
                                       transform=ValTransform(size=32, resize=40)))
    return sorted(int(x) for _, lab in loader for x in lab)


@pytest.fixture
def indexed(tmp_path: Path) -> Path:
    make_set(tmp_path / "set")
    return tmp_path / "set"


def test_writer_layout_equals_header_scan_and_tarfile(indexed: Path) -> None:
    """The offsets the writer records are where tarfile finds every member's data."""
    m = read_manifest(indexed, "train")
    for s in m.shards:
        scanned = scan_layout(indexed / s.name)
        with tarfile.open(indexed / s.name) as tf:
            members = [(t.offset_data, t.size) for t in tf]
        assert list(zip(scanned.offset.tolist(), scanned.size.tolist(), strict=True)) == members
        assert scanned.counts.tolist() == [3] * s.samples
    ix = read_index(indexed, m)
    off, size = ix.members("jpg")
    assert len(off) == sum(SIZES) and (off > 0).all() and (size > 0).all()


def test_loader_reads_every_sample_through_the_index(indexed: Path) -> None:
    assert labels(indexed) == list(range(sum(SIZES)))


def test_index_command_rebuilds_it_byte_identical(indexed: Path) -> None:
    before = (indexed / "train-index.bin").read_bytes()
    m = read_manifest(indexed, "train")
    write_manifest(indexed, replace(m, index=None))
    (indexed / "train-index.bin").unlink()
    with pytest.raises(ManifestError, match=f"lists no sample index.*imgprep index {indexed}"):
        labels(indexed)
    r = CliRunner().invoke(cli, ["index", str(indexed), "--json", "--workers", "2"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out == {"folder": str(indexed), "workers": 2, "splits": [{
        "split": "train", "index": "train-index.bin", "bytes": len(before),
        "shards": len(SIZES), "samples": sum(SIZES), "dali": None}]}
    assert (indexed / "train-index.bin").read_bytes() == before
    assert read_manifest(indexed, "train") == m
    assert labels(indexed) == list(range(sum(SIZES)))


def test_convert_writes_the_index(sample: Path, tmp_path: Path) -> None:
    from imgprep.convert.options import ConvertOptions
    from imgprep.convert.run import convert

    out = tmp_path / "conv"
    convert(ConvertOptions(input=sample / "ILSVRC2012_img_train.tar", out=out, num_shards=3))
    m = read_manifest(out, "train")
    assert m.index is not None and m.index.name == "train-index.bin"
    data = (out / "train-index.bin").read_bytes()
    scanned = encode_index("train", m.shards, [scan_layout(out / s.name) for s in m.shards])
    assert data == scanned  # the writer's offsets are the tar headers' offsets
    assert len(labels(out)) == m.total_samples


# ---------------------------------------------------------------------------- hostile


def _truncate(folder: Path) -> None:
    p = folder / "train-index.bin"
    p.write_bytes(p.read_bytes()[:-7])


def _alter(folder: Path) -> None:
    p = folder / "train-index.bin"
    data = bytearray(p.read_bytes())
    data[-40] ^= 0x10
    p.write_bytes(bytes(data))


def _foreign(folder: Path) -> None:
    other = folder.parent / "other"
    make_set(other, seed=7, meta=False)
    shutil.copy2(other / "train-index.bin", folder / "train-index.bin")


def _missing(folder: Path) -> None:
    (folder / "train-index.bin").unlink()


HOSTILE = {"truncated": (_truncate, "truncated"), "altered": (_alter, "altered"),
           "other-conversion": (_foreign, "another conversion"),
           "missing": (_missing, "cannot read index")}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_damaged_index_is_refused_naming_file_and_fix(indexed: Path, case: str) -> None:
    damage, words = HOSTILE[case]
    damage(indexed)
    with pytest.raises(ManifestError) as e:
        labels(indexed)
    text = str(e.value)
    assert words in text and "train-index.bin" in text and f"imgprep index {indexed}" in text
    r = CliRunner().invoke(cli, ["index", str(indexed)])  # the fix the message names
    assert r.exit_code == 0, r.output
    assert labels(indexed) == list(range(sum(SIZES)))


def test_offsets_past_the_end_of_a_shard_are_refused(indexed: Path) -> None:
    """An index that checks out (re-signed in the manifest) but points past a shard's end."""
    m = read_manifest(indexed, "train")
    layouts = [scan_layout(indexed / s.name) for s in m.shards]
    bad = layouts[1]
    layouts[1] = replace(bad, offset=bad.offset + np.uint64(m.shards[1].bytes))
    big = [replace(s, bytes=s.bytes * 3) if i == 1 else s for i, s in enumerate(m.shards)]
    entry = write_index(indexed, "train", big, layouts)  # claims a bigger shard 1...
    write_manifest(indexed, replace(m, index=entry))
    with pytest.raises(ManifestError, match="another conversion.*train-000001.tar"):
        labels(indexed)
    data = bytearray((indexed / "train-index.bin").read_bytes())
    head = json.loads(data[16:16 + int.from_bytes(data[12:16], "little")])
    head["shards"][1][2] = m.shards[1].bytes  # ...now the real size, offsets still past it
    text = json.dumps(head, sort_keys=True).encode()
    text += b" " * (int.from_bytes(data[12:16], "little") - len(text))
    data[16:16 + len(text)] = text
    (indexed / "train-index.bin").write_bytes(bytes(data))
    write_manifest(indexed, replace(m, index=replace(
        entry, sha256=hashlib.sha256(bytes(data)).hexdigest())))
    with pytest.raises(ManifestError, match="past the end of shard train-000001.tar") as e:
        labels(indexed)
    assert f"imgprep index {indexed}" in str(e.value)


def test_shard_changed_after_indexing_is_named(indexed: Path) -> None:
    """A shard rewritten in place with the same size but other members: the header check
    names the shard and both fixes."""
    m = read_manifest(indexed, "train")
    path = indexed / m.shards[0].name
    data = bytearray(path.read_bytes())
    data[100:108] = b"0000777\0"  # the first member's mode field: its checksum no longer fits
    path.write_bytes(bytes(data))
    with pytest.raises(LoaderError, match="train-000000.tar.*imgprep index"):
        labels(indexed)


def test_shard_written_by_another_tar_writer_reads_through_the_full_header_check(
        indexed: Path) -> None:
    """Headers imgprep did not write (mtime, owner names) take the checksum path, not the
    byte-for-byte one, and read the same samples."""
    m = read_manifest(indexed, "train")
    path = indexed / m.shards[1].name
    with tarfile.open(path) as tf:
        members = [(ti, tf.extractfile(ti).read()) for ti in tf]  # type: ignore[union-attr]
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for ti, data in members:
            ti.mtime, ti.uname, ti.gname, ti.uid = 1_700_000_000, "someone", "staff", 501
            tf.addfile(ti, io.BytesIO(data))
    assert path.stat().st_size == m.shards[1].bytes
    assert labels(indexed) == list(range(sum(SIZES)))


def test_index_command_refuses_a_label_list_folder(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    r = CliRunner().invoke(cli, ["index", str(tmp_path / "x")])
    assert r.exit_code == 3 and "no manifest" in r.output


def test_layout_builder_groups_members_and_refuses_what_the_index_cannot_hold() -> None:
    b = LayoutBuilder()
    b.add("dir/k1.jpg", 512, 10)
    b.add_member("k1", "cls", 1536, 1)
    b.add_member("k2", "jpg", 2560, 20)
    lay = b.layout()
    assert lay.exts == ("jpg", "cls")
    assert lay.counts.tolist() == [2, 1]
    assert lay.offset.tolist() == [512, 1536, 2560] and lay.ext.tolist() == [0, 1, 0]
    many = LayoutBuilder()
    for j in range(255):
        many.add_member("k", f"e{j}", j * 1024, 1)
    with pytest.raises(ShardError, match="sample k: too many members"):
        many.add_member("k", "e0", 0, 1)
    with pytest.raises(ShardError, match="sample k2: too many members"):
        many.add_member("k2", "e255", 0, 1)
