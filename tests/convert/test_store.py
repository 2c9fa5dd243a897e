"""``convert --store`` and ``--from-shards``: which member holds each image, what the
manifest says, that the stored pixels are the JPEG's own, and that verify, index, DALI's
index and stage-to-node keep working on stored-pixel shards."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from imgprep import jpegcrop
from imgprep.convert.fromshards import from_shards
from imgprep.convert.options import ConvertOptions
from imgprep.convert.run import convert
from imgprep.convert.store import stored_kind, unit_hash
from imgprep.errors import ManifestError, OutputError
from imgprep.job.world import World
from imgprep.rawformat import BY_NAME, read_header
from imgprep.sections import ManifestOptions, StoreOptions
from imgprep.shards.indexing import index_folder
from imgprep.shards.manifest import read_manifest
from imgprep.shards.tario import iter_samples
from imgprep.shards.verify import verify
from imgprep.stage.options import StageOptions
from imgprep.stage.run import stage_to_node
from tests.support.converted import TRAIN_TAR
from tests.support.rawstore import STORES, stored_sets

pytestmark = pytest.mark.skipif(not jpegcrop.AVAILABLE, reason="stored pixels need the "
                                "extension")


@pytest.fixture(scope="module")
def sets(converted: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
         ) -> dict[str, Path]:
    """Read-only: the shared JPEG conversion and its yuv420, rgb and mixed rewrites."""
    return stored_sets(converted["shards"], tmp_path_factory.mktemp("stored"))


def samples_of(folder: Path) -> dict[str, dict[str, bytes]]:
    m = read_manifest(folder, "train")
    return {k: f for s in m.shards for k, f in iter_samples(folder / s.name)}


def full_decode(jpeg: bytes) -> np.ndarray:
    """The extension's whole decode of ``jpeg`` at DCT scale 1, H x W x 3."""
    p = jpegcrop.probe(jpeg)
    out = np.empty((p.height, p.width, 3), np.uint8)
    jpegcrop.sample(jpeg, p.width, p.height, draft=None, resize=None, box=None,
                    crop=(0, 0, p.width, p.height), out=out, flip=False, planar=False,
                    whole=True)
    return out


def record_pixels(record: bytes) -> np.ndarray:
    from imgprep import rawpixels

    head = read_header(record)
    out = np.empty((head.height, head.width, 3), np.uint8)
    rawpixels.sample(record, head.width, head.height, resize=None, box=None,
                     crop=(0, 0, head.width, head.height), out=out, flip=False, planar=False)
    return out


def test_store_options_take_one_rule_and_only_shards() -> None:
    assert StoreOptions().stored is False and StoreOptions(mode="rgb").raw == "rgb"
    for bad in ({"mode": "mixed"}, {"mode": "mixed", "fraction": 0.5, "min_ratio": 0.2},
                {"mode": "yuv420", "fraction": 0.5}, {"mode": "mixed", "fraction": 1.5},
                {"mode": "mixed", "min_ratio": 0.0}, {"mode": "png"}):
        with pytest.raises(ValueError):
            StoreOptions(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="label list"):
        ConvertOptions(input=Path("x"), out=Path("y"), format="list",
                       store=StoreOptions(mode="yuv420"))


def test_the_manifest_records_the_store_and_a_jpeg_one_is_unchanged(sets: dict[str, Path]
                                                                     ) -> None:
    plain = json.loads((sets["jpeg"] / "train.json").read_text())
    assert not [k for k in plain["options"] if k.startswith("store_")]
    for mode, folder in sets.items():
        m = read_manifest(folder, "train")
        assert m.options.store.mode == mode
        back = ManifestOptions.from_json(m.options.to_json(), "x", fmt="shards", split="train")
        assert back == m.options
    mixed = json.loads((sets["mixed"] / "train.json").read_text())["options"]
    assert (mixed["store_mode"], mixed["store_raw"], mixed["store_fraction"]) == \
        ("mixed", "yuv420", 0.5)


def test_stored_pixels_are_the_jpegs_full_scale_decode(sets: dict[str, Path]) -> None:
    """Every record holds the pixels the JPEG shard's sample decodes to (yuv420: its planes,
    turned into RGB with libjpeg-turbo's upsampling and conversion: no difference at all)."""
    jpegs = samples_of(sets["jpeg"])
    for mode in ("yuv420", "rgb"):
        got = samples_of(sets[mode])
        assert got.keys() == jpegs.keys()
        ext = BY_NAME[mode].ext
        for key, fields in got.items():
            assert set(fields) == {ext, "cls", "json"}
            assert fields["cls"] == jpegs[key]["cls"] and fields["json"] == jpegs[key]["json"]
            assert np.array_equal(record_pixels(fields[ext]), full_decode(jpegs[key]["jpg"]))


def test_mixed_rules_pick_by_key_hash_and_by_bytes(sets: dict[str, Path]) -> None:
    got = samples_of(sets["mixed"])
    picked = {k for k, f in got.items() if "yuv420" in f}
    assert picked == {k for k in got if unit_hash(k) < 0.5} and 0 < len(picked) < len(got)
    jpegs = samples_of(sets["jpeg"])
    rule = StoreOptions(mode="mixed", min_ratio=0.12)
    yuv = BY_NAME["yuv420"]
    by_bytes = {k for k, f in jpegs.items() if stored_kind(rule, k, f["jpg"]) is not None}
    sizes = {k: len(f["jpg"]) for k, f in jpegs.items()}
    raw = read_header(next(iter(samples_of(sets["yuv420"]).values()))["yuv420"]).size
    assert by_bytes == {k for k, n in sizes.items() if n >= 0.12 * raw}
    assert stored_kind(StoreOptions(mode="mixed", fraction=1.0), "k", b"") == yuv


def test_from_shards_writes_what_convert_writes(sample: Path, sets: dict[str, Path],
                                                tmp_path: Path) -> None:
    """convert --store from the originals and --from-shards from the JPEG shards give the
    same shard bytes; a rerun of --from-shards converts nothing, another store is refused
    without --overwrite, and a stored set is not a source."""
    direct = tmp_path / "direct"
    s = convert(ConvertOptions(input=sample / TRAIN_TAR, out=direct, num_shards=3, workers=2,
                               store=STORES["mixed"]))
    assert s.complete and not s.errors
    ours, theirs = read_manifest(direct, "train"), read_manifest(sets["mixed"], "train")
    assert [(e.name, e.bytes, e.sha256) for e in ours.shards] == \
        [(e.name, e.bytes, e.sha256) for e in theirs.shards]
    assert from_shards(sets["jpeg"], sets["mixed"], STORES["mixed"])[0].done is False
    with pytest.raises(OutputError, match="--overwrite"):
        from_shards(sets["jpeg"], sets["mixed"], STORES["rgb"])
    with pytest.raises(ManifestError, match="stored pixels already"):
        from_shards(sets["yuv420"], tmp_path / "again", STORES["rgb"])


def test_verify_checks_records_and_finds_a_flipped_byte(sets: dict[str, Path],
                                                        tmp_path: Path) -> None:
    for mode in ("yuv420", "mixed"):
        assert verify(sets[mode], workers=1).ok
    copy = shutil.copytree(sets["yuv420"], tmp_path / "copy")
    shard = copy / read_manifest(copy, "train").shards[0].name
    data = bytearray(shard.read_bytes())
    at = data.index(b"IPXL") + 16 + 1000  # a pixel of the first record
    data[at] ^= 0x01
    shard.write_bytes(bytes(data))
    rep = verify(copy, workers=1)
    assert not rep.ok and any("sha256" in p for p in rep.problems), rep.problems


def test_index_and_dali_index_list_the_stored_members(sets: dict[str, Path],
                                                      tmp_path: Path) -> None:
    copy = shutil.copytree(sets["mixed"], tmp_path / "copy")
    m = read_manifest(copy, "train")
    (copy / m.index.name).unlink()  # type: ignore[union-attr]
    done = index_folder(copy, dali=True, workers=1)
    assert done[0].samples == m.total_samples and done[0].dali == "v1.2"
    idx = (copy / m.shards[0].name.replace(".tar", ".idx")).read_text().splitlines()
    assert any(" yuv420 " in line for line in idx[1:]) and any(" jpg " in line for line in
                                                               idx[1:])
    assert verify(copy, workers=1).ok


def test_stage_to_node_copies_and_verifies_stored_shards(sets: dict[str, Path],
                                                         tmp_path: Path) -> None:
    src = sets["yuv420"]
    full = read_manifest(src, "train")
    for k in range(2):
        dst = tmp_path / f"node{k}"
        s = stage_to_node(StageOptions(src=src, dst=dst, mode="partition", verify="sha256"),
                          World().with_nodes(2, k))
        local = read_manifest(dst, "train")
        assert local.options.store == full.options.store
        assert s.bytes_written >= sum(e.bytes for e in local.shards) > 0
        assert verify(dst, workers=1).ok


def test_the_command_line_takes_the_store_and_refuses_half_a_rule(sets: dict[str, Path],
                                                                  tmp_path: Path) -> None:
    from click.testing import CliRunner

    from imgprep.cli.commands import cli

    run = CliRunner().invoke
    bad = run(cli, ["convert", str(sets["jpeg"]), "-o", str(tmp_path / "x"), "--store", "mixed"])
    assert bad.exit_code == 2 and "--raw-fraction or --raw-ratio" in bad.output
    listed = run(cli, ["convert", str(sets["jpeg"]), "-o", str(tmp_path / "x"), "--store",
                       "yuv420", "--format", "list"])
    assert listed.exit_code == 2 and "--format shards" in listed.output
    plain = run(cli, ["convert", str(sets["jpeg"]), "-o", str(tmp_path / "x"), "--from-shards"])
    assert plain.exit_code == 2 and "--store yuv420, rgb or mixed" in plain.output
    ok = run(cli, ["convert", str(sets["jpeg"]), "-o", str(tmp_path / "y"), "--from-shards",
                   "--store", "rgb", "--workers", "1", "--json"])
    assert ok.exit_code == 0, ok.output
    done = json.loads(ok.output.strip().splitlines()[-1])["splits"][0]
    assert done["stored"] == done["samples"] == read_manifest(sets["jpeg"], "train").total_samples


def test_preview_shows_stored_pixels_as_the_jpegs(sets: dict[str, Path], tmp_path: Path) -> None:
    from PIL import Image

    from imgprep.shards.preview import make_sheet

    sheets = {}
    for mode in ("jpeg", "yuv420", "mixed"):
        done = make_sheet(sets[mode], tmp_path / f"{mode}.png", n=6, seed=3)
        assert done.samples == 6
        sheets[mode] = np.asarray(Image.open(done.output).convert("RGB"), np.int16)
    for mode in ("yuv420", "mixed"):  # the same samples, the same pixels (one libjpeg apart)
        assert np.abs(sheets[mode] - sheets["jpeg"]).mean() < 0.5, mode
