"""The trainer's flags for where its loader runs (``--pin-cpus``, ``--worker-nice``) and how
many of its workers decode (``--worker-sizing``), as the loader's options they become."""

from __future__ import annotations

import argparse

import pytest
import torch

import loaders.config as config_mod
from loaders import DemandSizing
from scripts.trainkit import train as train_imagenet
from scripts.trainkit.data import loader_options, pin_cpus

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def args(*flags: str) -> argparse.Namespace:
    return train_imagenet.parse_args(["--data", "d", *flags])


def test_the_flags_become_the_loaders_options() -> None:
    o = loader_options(args("--pin-cpus", "on", "--worker-nice", "3", "--worker-sizing",
                            "demand"), CPU, workers=2)
    assert (o.pin_cpus, o.worker_nice, o.sizing) == (True, 3, DemandSizing())
    plain = loader_options(args(), CPU, workers=2)
    assert (plain.pin_cpus, plain.worker_nice, plain.sizing) == (False, None, None)


def test_auto_pins_with_auto_workers_on_cuda_but_never_dali(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_mod.torch.cuda, "is_available", lambda: True)
    assert pin_cpus(args(), CUDA) and not pin_cpus(args(), CPU)
    assert not pin_cpus(args("--workers", "4"), CUDA)
    assert not pin_cpus(args("--loader-backend", "dali"), CUDA)
    assert pin_cpus(args("--loader-backend", "nvimgcodec"), CUDA)
    assert not pin_cpus(args("--pin-cpus", "off"), CUDA)
    assert pin_cpus(args("--pin-cpus", "on", "--workers", "4"), CPU)
