"""The stage tests' source: one converted folder, made once for the whole run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import convert_sample


@pytest.fixture(scope="session")
def src(sample: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A converted folder with two splits: train (12 shards, with its sample index) and val
    (4 shards). Read-only: tests that damage it work on a copy."""
    out = convert_sample(sample, tmp_path_factory.mktemp("stage_src"), train_shards=12,
                         val_shards=4)
    return out
