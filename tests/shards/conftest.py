"""What the shards room's tests share: Hugging Face ``datasets``, offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def hf_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``datasets``, offline, with its home and caches under ``tmp_path``."""
    for name, value in (("HF_HOME", tmp_path / "hf"), ("HF_DATASETS_OFFLINE", 1),
                        ("HF_HUB_OFFLINE", 1), ("HF_DATASETS_CACHE", tmp_path / "hf" / "ds")):
        monkeypatch.setenv(name, str(value))
    datasets = pytest.importorskip("datasets", reason="Hugging Face datasets is a dev tool")
    # read from the environment on first import: hold them for a module imported before
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    return datasets
