"""What the trainer's tests share: a converted fake set (``data``; a module may convert its
own), and torch's thread count given back after every test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

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
