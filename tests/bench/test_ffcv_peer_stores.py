"""The FFCV peer's storage modes: a sample FFCV stores raw travels as imgprep's RGB record,
both sides digest the pixels FFCV keeps, and (with FFCV installed) a .beton of mixed jpg and
raw samples holds exactly those and serves epochs."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from bench import ffcv_peer
from bench.loader_stores import kept_raw
from imgprep import jpegcrop, rawpixels
from imgprep.rawformat import BY_NAME, HEADER
from tests.support.shards import tar_samples

pytestmark = pytest.mark.skipif(not jpegcrop.AVAILABLE, reason="needs the extension")


def test_a_raw_sample_is_digested_as_the_pixels_ffcv_keeps(converted: dict[str, Path],
                                                           tmp_path: Path) -> None:
    _, key, fields = tar_samples(converted["shards"])[0]
    record, _ = rawpixels.record(fields["jpg"], BY_NAME["rgb"])
    assert ffcv_peer.stored(record) == record[HEADER.size:]
    assert ffcv_peer.stored(fields["jpg"]) == fields["jpg"]
    n, digest = ffcv_peer.write_source(tmp_path / "src.bin", [(3, record), (4, fields["jpg"])])
    want = hashlib.sha256()
    for label, kept in ((3, record[HEADER.size:]), (4, fields["jpg"])):
        want.update(ffcv_peer.RECORD.pack(label, len(kept)) + kept)
    assert (n, digest) == (2, want.hexdigest())
    samples = list(ffcv_peer.shard_samples(converted["shards"], "train", lambda k: k == key))
    assert samples[0][1] == record and all(s[:4] != b"IPXL" for _, s in samples[1:])
    assert kept_raw(1.0, key) and not kept_raw(0.0, key)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get(ffcv_peer.ENV),
                    reason=f"{ffcv_peer.ENV} is not set (the python of a virtualenv with FFCV "
                           "1.0.2, docs/benchmarks.md#ffcv-peer)")
def test_a_proportion_beton_holds_the_same_images_raw(converted: dict[str, Path],
                                                      tmp_path: Path) -> None:
    peer, note = ffcv_peer.start(os.environ[ffcv_peer.ENV], tmp_path)
    assert peer is not None, note
    try:
        info = peer.write_beton(converted["shards"], "train", tmp_path, name="half",
                                raw=lambda key: kept_raw(0.5, key))
        rows = peer.open_loaders(info["beton"], 8, (1,), prefix="half")
        assert rows["half_1w"]()["images"] == info["samples"] // 8 * 8
    finally:
        peer.close()
