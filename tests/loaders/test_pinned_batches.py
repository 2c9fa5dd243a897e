"""The loaders' bytes do not drift: a small shard set and label list built here give the batch
digests and resume states recorded before the loader's options were passed as one record and
its crop geometry drawn in one place. A change that alters them must be meant (a new
``ORDER_VERSION`` or pixel version), not a side effect of moving code.

Each case is one loader configuration: shards or a label list, replicate or partition,
contiguous or channels_last rows, train or val transforms, the tails, order version 1, and
a resume mid-epoch from a state written before the change (on the same World, and elastic on
another). The batches are the extension's (its libjpeg-turbo and resampler: the same bytes
whichever Pillow is installed), and, with ``crop_decode=False``, the Pillow path's where PIL
is pillow-simd, whose resize the resampler equals byte for byte. The states are those
written before the pixel version was recorded, which resume; a state now also names its
pixel version. Where the fixture's files come out other bytes (another PIL's JPEG
encoder), the case skips, naming the digest it got.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from imgprep.job.world import World
from imgprep.shards.info import pil_info
from loaders import (
    Loader,
    LoaderOptions,
    TrainTransform,
    Transform,
    ValTransform,
    make_loader,
)
from tests.support import jpeg
from tests.support.shards import UNEQUAL_SIZES, write_label_list, write_split

TOTAL = sum(UNEQUAL_SIZES)  # 57 samples
# The fixture's JPEG files, all of them in sample order (what the pins below were made from).
INPUTS = "65ce71de4cfe8b14af01ca8316ae0a355dde6685c5ac0f1cd714d5a05974414a"


def image(i: int) -> bytes:
    """Sample ``i``: sizes vary, so crop boxes, DCT scales and the val resize all vary."""
    return jpeg((96 + (i * 37) % 160, 80 + (i * 53) % 170), seed=1000 + i)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pinned")
    write_split(out, "train", UNEQUAL_SIZES, image)
    write_split(out, "val", UNEQUAL_SIZES, image)
    write_label_list(out / "list", TOTAL, image)
    return out


def inputs_digest() -> str:
    h = hashlib.sha256()
    for i in range(TOTAL):
        h.update(image(i))
    return h.hexdigest()


def world(rank: int, nodes: int, local: int) -> World:
    return World(rank=rank, world_size=nodes * local, local_rank=rank % local,
                 local_world_size=local, node_rank=rank // local, num_nodes=nodes)


@dataclass(frozen=True)
class Case:
    """One loader: where it reads, its World (rank of nodes x local) and its options."""

    data: str  # "shards" or "list"
    split: str
    rank: int = 1
    nodes: int = 2
    local: int = 2
    workers: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    def loader(self, folder: Path) -> Loader:
        path = folder / "list" / "train.txt" if self.data == "list" else folder
        options = {k: v for k, v in self.options.items() if k != "mode"}
        return make_loader(path, self.split, world(self.rank, self.nodes, self.local),
                           LoaderOptions(batch_size=3, workers=self.workers, seed=7, **options),
                           mode=self.options.get("mode"))


TRAIN: Transform = TrainTransform(size=24)
VAL: Transform = ValTransform(size=24, resize=28)
CASES = {
    "shards-train": Case("shards", "train", options={"transform": TRAIN}),
    "shards-train-channels-last": Case("shards", "train", workers=2, options={
        "transform": TRAIN, "memory_format": "channels_last"}),
    "shards-train-partition-short": Case("shards", "train", options={
        "transform": TRAIN, "mode": "partition", "tail": "short"}),
    "shards-train-order-v1": Case("shards", "train", rank=0, nodes=1, local=3, options={
        "transform": TrainTransform(size=20, scale=(0.3, 1.0), flip=False),
        "order_version": 1}),
    "shards-val-pad": Case("shards", "val", options={"transform": VAL}),
    "shards-val-uncropped": Case("shards", "val", rank=2, nodes=1, local=3, options={
        "transform": ValTransform(size=24, resize=96), "tail": "uneven"}),
    "list-train": Case("list", "train", rank=0, nodes=1, local=2, options={
        "transform": TRAIN, "memory_format": "channels_last"}),
    "list-val-short": Case("list", "val", rank=1, nodes=1, local=2, options={
        "transform": VAL, "tail": "short", "shuffle": True}),
}
EPOCH = 1
PINNED = {
    "shards-train": "8e3fc8232c5cb08a7d088d3f8b8a808f91efa69bed54c7342a183fd0588c2e73",
    "shards-train-channels-last":
        "1af1d5947521f59b4fe81f5775762bcce3db0076e048bd3a214336fc2b4700d0",
    "shards-train-partition-short":
        "8354e00d7df8f9fe247d444283289c65b22e70ec1e50ff16f03d491d075cce2e",
    "shards-train-order-v1": "145e6c91fa7aa4a8d3182591edf983f2f336dc2e43daa3df59967330ca6ea8ac",
    "shards-val-pad": "966853c8d08b747ce581cf21a5653fd067321a36da6351d83d865eafe9bad729",
    "shards-val-uncropped": "a0eea8f4edfbf4e9680e848f02e64982fab20007f4ccb00e71055a936608bb55",
    "list-train": "de46837a2de0475ad0f4015e15494feabc15d378ede6487083816d069e731692",
    "list-val-short": "4d5b5927aaf387f215120a0bf2b1fce784ae72242aff19802fbb1e5f594c8378",
    "shards-train/rest": "a701ae4f5504416500c643785563183c31a98b704f0e4f4ea51d301a7fbf92d8",
    "shards-train-partition-short/rest":
        "c3277d814f2adcf22c51a987e9b3dce59e7b2216a9defef97abb6e4a4951a844",
    "shards-train-order-v1/rest":
        "7eb3db92b1a404cd59ef4770e51feda6d125e9f08565bcad895d0794c1288c49",
    "list-train/rest": "34abee4110665fa077b9bc9ed1d3e65112471166423095f22d67b9ee0a8dd8ec",
    "shards-train/elastic-1x3-rank2":
        "109336aa146edc99c4651f6e6a5f4aea89949dc12a07993f1e74ca30db9438f4",
}


def digest(batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> str:
    """One sha256 over every batch: shape, strides, pixels and labels."""
    h = hashlib.sha256()
    for images, labels in batches:
        h.update(repr((tuple(images.shape), images.stride())).encode())
        h.update(images.contiguous().numpy().tobytes())
        h.update(labels.numpy().astype("<i8").tobytes())
    return h.hexdigest()


def needs_recorded_inputs() -> None:
    got = inputs_digest()
    if got != INPUTS:
        pytest.skip(f"this PIL encodes the fixture's JPEGs as other bytes (sha256 {got}, "
                    f"pinned {INPUTS}): the pins hold for make setup's pillow-simd")


@pytest.mark.parametrize("name", CASES)
def test_a_whole_epoch_gives_the_pinned_batches(folder: Path, name: str) -> None:
    needs_recorded_inputs()
    loader = CASES[name].loader(folder)
    loader.set_epoch(EPOCH)
    assert digest(loader) == PINNED[name]


@pytest.mark.parametrize("name", CASES)
def test_the_pillow_path_gives_the_same_pinned_batches_with_pillow_simd(folder: Path,
                                                                         name: str) -> None:
    needs_recorded_inputs()
    if not pil_info(check_avx2=False).pillow_simd:
        pytest.skip("crop_decode=False resizes with the installed PIL, which is not "
                    "pillow-simd: its bytes are not the pinned ones")
    case = CASES[name]
    forced = Case(case.data, case.split, case.rank, case.nodes, case.local, case.workers,
                  {**case.options, "crop_decode": False})
    loader = forced.loader(folder)
    loader.set_epoch(EPOCH)
    assert digest(loader) == PINNED[name]


def state(samples: int, mode: str, nodes: int, local: int, order: int = 2) -> dict[str, Any]:
    """A loader state as ``state_dict`` wrote it after 2 batches of epoch 1 (batch size 3)."""
    return {"epoch": 1, "batch": 2, "samples": samples, "from": 0, "order_version": order,
            "mode": mode, "world_size": nodes * local, "num_nodes": nodes,
            "local_world_size": local, "batch_size": 3}


# A state written mid-epoch (after 2 of the epoch's batches) before the change, for each case.
STATES: dict[str, dict[str, Any]] = {
    "shards-train": state(24, "replicate", 2, 2),
    "shards-train-partition-short": state(12, "partition", 2, 2),
    "shards-train-order-v1": state(18, "replicate", 1, 3, order=1),
    "list-train": state(12, "replicate", 1, 2),
}


@pytest.mark.parametrize("name", ["shards-train", "shards-train-partition-short",
                                  "shards-train-order-v1", "list-train"])
def test_a_mid_epoch_state_is_the_pinned_one_and_resumes_the_pinned_batches(
        folder: Path, name: str) -> None:
    needs_recorded_inputs()
    case = CASES[name]
    loader = case.loader(folder)
    loader.set_epoch(EPOCH)
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = loader.state_dict()
    del it
    assert json.loads(json.dumps(state)) == {**STATES[name], "pixels": "imgprep-1"}
    fresh = case.loader(folder)
    fresh.load_state_dict(STATES[name])
    rest = list(fresh)
    assert digest(rest) == PINNED[f"{name}/rest"]
    loader.set_epoch(EPOCH)
    assert digest(head + rest) == PINNED[name]


def test_an_elastic_resume_on_another_world_gives_the_pinned_batches(folder: Path) -> None:
    needs_recorded_inputs()
    state = STATES["shards-train"]  # written by rank 1 of 2 x 2
    other = Case("shards", "train", rank=2, nodes=1, local=3, options={"transform": TRAIN})
    loader = other.loader(folder)
    loader.load_state_dict(state)
    assert digest(loader) == PINNED["shards-train/elastic-1x3-rank2"]

