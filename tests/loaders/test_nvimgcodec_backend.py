"""The nvimgcodec backend (``loaders.nvimgcodec``) in its CPU form: the GPU's hardware decoder
is played by a stand-in that decodes as Pillow does on the CPU and records what it is given,
so the hybrid split, the CPU fallback and the geometry are checked here; nvImageCodec itself
runs only on a GPU (the kit's ``feed`` check)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import loaders.nvjpeg as nvjpeg_mod
from imgprep import World
from loaders import LoaderError, LoaderOptions
from loaders.nvimgcodec import HW_LOAD, NvimgcodecBackend, load_nvimgcodec
from loaders.nvjpeg import cpu_decode
from loaders.transforms import TrainTransform
from tests.support.backends import BATCH, TOTAL, loader, steps, worlds
from tests.support.shards import run_epoch


class Recorder:
    """Who decoded what: the stand-in hardware decoder's batches (it refuses ``refuse``) and
    the CPU decodes, by the samples' bytes."""

    def __init__(self, refuse: frozenset[bytes] = frozenset()) -> None:
        self.hw: list[list[bytes]] = []
        self.cpu: list[bytes] = []
        self.refuse = refuse

    def hardware(self, encoded: list[torch.Tensor], device: torch.device
                 ) -> list[torch.Tensor | None]:
        datas = [bytes(t.numpy()) for t in encoded]
        self.hw.append(datas)
        return [None if d in self.refuse else cpu_decode(d, "hw").to(device)
                for d in datas]


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    """The stand-in in place of nvImageCodec (on the CPU), and the CPU decode recorded."""
    rec = Recorder()
    monkeypatch.setattr(NvimgcodecBackend, "_gpu_decoder", lambda self: rec.hardware)

    def on_cpu(data: bytes, where: str) -> torch.Tensor:
        rec.cpu.append(data)
        return cpu_decode(data, where)

    monkeypatch.setattr(nvjpeg_mod, "cpu_decode", on_cpu)
    yield rec


def test_each_sample_is_decoded_once_and_each_batch_split_as_asked(
        shards: Path, recorder: Recorder) -> None:
    """hw_decoder_load=0.65 of batches of 3: the hardware gets the first 2 samples of each
    batch (round(0.65 x 3)), the CPU the third, and every sample of the epoch is decoded
    once, by one of them; with threads making batches ahead, the same."""
    for workers in (0, 2):
        recorder.hw.clear()
        recorder.cpu.clear()
        got = run_epoch(loader(shards, "train", World.single(), "nvimgcodec", workers=workers,
                               hw_decoder_load=0.65), 0)
        assert len(got) == TOTAL // BATCH
        assert [len(b) for b in recorder.hw] == [round(0.65 * BATCH)] * len(got)
        decoded = [d for b in recorder.hw for d in b] + recorder.cpu
        assert len(decoded) == len(set(decoded)) == len(got) * BATCH


@pytest.mark.parametrize(("load", "hw"), [(0.0, 0), (1.0, 3), (None, round(HW_LOAD * 3))])
def test_the_split_follows_hw_decoder_load(shards: Path, recorder: Recorder,
                                           load: float | None, hw: int) -> None:
    batches = len(run_epoch(loader(shards, "train", World.single(), "nvimgcodec",
                                   hw_decoder_load=load), 0))
    assert [len(b) for b in recorder.hw] == ([hw] * batches if hw else [])
    assert len(recorder.cpu) == (BATCH - hw) * batches


def test_what_the_hardware_refuses_is_decoded_on_the_cpu_once(
        shards: Path, recorder: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    """A refused sample (None back) goes to the CPU, once; a batch the hardware decoded
    none of is said once, in a warning."""
    plain = run_epoch(loader(shards, "train", World.single(), "nvimgcodec"), 0)
    recorder.refuse = frozenset(recorder.hw[0])  # the whole hardware share of batch 0
    recorder.hw.clear()
    recorder.cpu.clear()
    with caplog.at_level(logging.WARNING, logger="loaders.nvimgcodec"):
        again = run_epoch(loader(shards, "train", World.single(), "nvimgcodec"), 0)
    assert set(recorder.refuse) <= set(recorder.cpu)
    assert len(recorder.cpu) == len(set(recorder.cpu))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(plain, again, strict=True))
    said = [r for r in caplog.records if "decoded none" in r.getMessage()]
    assert len(said) == 1 and "NVJPG" in said[0].getMessage()


def test_hybrid_batches_have_the_pillow_backends_samples_and_geometry(
        shards: Path, wide: Path, recorder: Recorder) -> None:
    """Split between the stand-in and the CPU, the batches are the nvjpeg CPU form's, element
    for element (the same boxes and flips, drawn as the Pillow backend draws them), within
    a level of the Pillow backend's, and every rank of a 2-rank World gets the Pillow
    backend's samples step by step."""
    train = {"transform": TrainTransform(), "tail": "pad"}
    got = run_epoch(loader(wide, "train", World.single(), "nvimgcodec", **train), 0)
    same = run_epoch(loader(wide, "train", World.single(), "nvjpeg", **train), 0)
    pil = run_epoch(loader(wide, "train", World.single(), "pillow", **train), 0)
    assert recorder.hw and recorder.cpu
    for (a, la), (b, lb), (c, _) in zip(got, same, pil, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
        assert (a.float() - c.float()).abs().mean().item() <= 1.0
    for w in worlds(1, 2):
        assert steps(run_epoch(loader(shards, "train", w, "nvimgcodec"), 1)) == \
            steps(run_epoch(loader(shards, "train", w, "pillow"), 1))


def test_without_nvimgcodec_the_gpu_decoder_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # its import fails
    with pytest.raises(LoaderError) as e:
        load_nvimgcodec(2, torch.device("cuda", 0))
    text = str(e.value)
    assert len(text.splitlines()) == 1 and text.startswith("rank 2: backend='nvimgcodec'")
    assert "nvidia-nvimgcodec-cu13" in text and "device='cpu'" in text


@pytest.mark.parametrize("given", [{"hw_decoder_load": 1.5, "backend": "nvimgcodec"},
                                   {"hw_decoder_load": True, "backend": "nvimgcodec"},
                                   {"hw_decoder_load": 0.5, "backend": "nvjpeg"}])
def test_hw_decoder_load_is_a_share_for_the_nvimgcodec_backend(given: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="hw_decoder_load"):
        LoaderOptions(batch_size=2, **given)
