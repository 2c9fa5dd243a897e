"""What the trainer's tests share: a converted fake set (``data``; a module may convert its
own), the trainer's ``main`` run in this process (``trainer_main``), and torch's thread count
given back after every test."""

from __future__ import annotations

import io
import logging
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

from scripts.trainkit import train
from scripts.trainkit.logs import LOGGERS
from tests.support import convert_sample


@pytest.fixture(scope="module")
def data(sample: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Read-only: the fake set's train split (48 images: 6 steps of 8) and val split (20),
    converted."""
    return convert_sample(sample, tmp_path_factory.mktemp("converted"), train_shards=2,
                          val_shards=1, workers=1)


@pytest.fixture(autouse=True)
def threads() -> Iterator[None]:
    """The trainer's set-up sets torch's thread count; give this process its own back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def main_in_process(argv: Sequence[str | Path]) -> subprocess.CompletedProcess[str]:
    """``scripts/train_imagenet.py ARGV`` as the trainer's ``main`` in this process (no
    interpreter, torch and torch._dynamo to start: seconds of CPU a run), reported as a
    process would be: exit code, stdout, stderr. What it changes here is given back: the
    loggers it configures, torch's random state and thread count."""
    args = [str(a) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    loggers = [logging.getLogger(name) for name in LOGGERS]
    saved = [(lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    before = torch.get_num_threads()
    try:
        with torch.random.fork_rng(devices=[]), redirect_stdout(out), redirect_stderr(err):
            code = train.main(args)
    finally:
        torch.set_num_threads(before)
        for lg, (handlers, level, propagate) in zip(loggers, saved, strict=True):
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate = propagate
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def trainer_main() -> Callable[[Sequence[str | Path]], subprocess.CompletedProcess[str]]:
    """``main_in_process``, for runs whose process boundary is not what a test checks."""
    return main_in_process
