"""What the DALI backend (``loaders.dali``) alone does, on the CPU; its parity with the Pillow
backend (samples, resume, errors, pixels, the trainer) is ``test_backend_parity``'s.

Its train crops are its own draws (not the Pillow backend's boxes), so their flips are held
by frequency. The GPU path (``device="gpu"``) cannot run here: its graph is checked to put
the decoder on the GPU ("mixed": CPU bytes in, GPU pixels out), the rest is the CPU path.
Without DALI installed, the error names the extra to install.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from imgprep import World
from loaders import LoaderError, LoaderOptions, make_loader
from loaders.transforms import TrainTransform, Transform, ValTransform
from tests.support import jpeg
from tests.support.backends import BATCH, loader
from tests.support.shards import run_epoch, write_split

needs_dali = pytest.mark.skipif(importlib.util.find_spec("nvidia.dali") is None,
                                reason="NVIDIA DALI is not installed (pip install "
                                       "'imgprep[dali]')")


@needs_dali
def test_train_crops_are_flipped_about_half_the_time(tmp_path: Path) -> None:
    """One symmetric-free image in every slot, crops of the whole image (scale 1, ratio 1):
    each output is the image or its mirror, both appear, and the flip is the coin's."""
    one = jpeg((256, 256), seed=7)
    write_split(tmp_path, "train", (16, 16), lambda i: one)
    t = TrainTransform(size=32, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    images = torch.cat([x for x, _ in run_epoch(loader(tmp_path, "train", World.single(),
                                                       "dali", transform=t, batch_size=8), 0)])
    plain = images[0] if images[0].float().mean() else images[1]
    mirrored = plain.flip(-1)
    kinds = [0 if (x.float() - plain.float()).abs().mean() < 2 else
             1 if (x.float() - mirrored.float()).abs().mean() < 2 else 2 for x in images]
    assert 2 not in kinds and 4 <= sum(kinds) <= 28, kinds


def test_without_dali_the_error_names_the_extra(wide: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # import nvidia.dali fails
    with pytest.raises(LoaderError) as e:
        make_loader(wide, "train", World.single(),
                    LoaderOptions(batch_size=BATCH, workers=1, backend="dali"))
    assert len(str(e.value).splitlines()) == 1
    assert "imgprep[dali]" in str(e.value) and "backend='dali'" in str(e.value)


@needs_dali
@pytest.mark.parametrize("transform", [TrainTransform(), ValTransform()], ids=["train", "val"])
def test_gpu_graph_decodes_on_the_gpu(transform: Transform) -> None:
    """device="gpu" wires a "mixed" decoder (encoded bytes on the CPU in, pixels on the GPU
    out) and the later ops on the GPU; device="cpu" keeps everything on the CPU. The graph
    is defined, not built (building it needs a GPU)."""
    from nvidia.dali import Pipeline, fn, types

    from loaders.dali import decode_graph

    for device, want in (("gpu", "gpu"), ("cpu", "cpu")):
        with Pipeline(batch_size=2, num_threads=1, device_id=None):
            jpegs = fn.external_source(name="jpegs", dtype=types.DALIDataType.UINT8, ndim=1)
            out = decode_graph(jpegs, transform, device)
        node, chain = out, []
        while node.source.inputs:
            chain.append((node.source.name, node.device))
            node = node.source.inputs[0]
        assert node.device == "cpu" and chain[-1][0].startswith("__Image"), chain
        assert {d for _, d in chain} == {want}, chain
