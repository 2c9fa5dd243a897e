"""What the loader tests of more than one file share: the decoder backends' data
(``tests.support.backends``), written once a module."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.backends import write_samples, write_wide


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Read-only: a train and a val split of the same 57 samples, in unequal shards."""
    return write_samples(tmp_path_factory.mktemp("shards"))


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Read-only: 12 converted-size images, 256 px on the short side, train and val."""
    return write_wide(tmp_path_factory.mktemp("wide"))
