"""Fixtures shared by every test folder: the real ImageNet sample, a fake ILSVRC2012 made on the
fly (good, and with bad files), and its train split converted once; and the skip of the tests
marked ``gpu`` where there is no CUDA device. What the tests build and check without a fixture
is in ``tests/support``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.support")

from imgprep.inputs.fakeset import make_sample  # noqa: E402
from tests.support import REAL_DATA, convert_sample  # noqa: E402


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m serial`` (make test's last part) a test file that never names the mark holds
    no serial test: it is not imported, which keeps that part's collection to a few files."""
    if (config.getoption("markexpr") == "serial" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_")):
        return b"serial" not in collection_path.read_bytes() or None
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` hold CUDA-only assertions: skipped, saying so, where torch sees
    no CUDA device."""
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason=f"no CUDA device: torch {torch.__version__} sees none "
                                       "(gpu-marked tests run on a GPU machine)")
        for item in gpu:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def real_data() -> Path:
    """../shared/data/imagenet-sample (real ILSVRC2012 files), or a clear skip."""
    if not (REAL_DATA / "images").is_dir():
        pytest.skip(f"real ImageNet sample not found at {REAL_DATA} (set IMGPREP_SAMPLE_DATA)")
    return REAL_DATA


@pytest.fixture(scope="session")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fake ILSVRC2012 (6 classes × 8 train images, 20 val) with every quirk, no bad files."""
    out = tmp_path_factory.mktemp("sample")
    make_sample(out, classes=6, per_class=8, val=20, seed=1)
    return out


@pytest.fixture(scope="session")
def bad_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like ``sample`` plus a truncated JPEG and a zero-byte file in the train tar."""
    out = tmp_path_factory.mktemp("bad_sample")
    make_sample(out, classes=4, per_class=6, val=8, seed=2, bad=True)
    return out


@pytest.fixture(scope="session")
def converted(sample: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sample's train split converted once as shards (3) and as a label list, in the
    folders ``shards`` and ``list`` of one parent. Read-only: tests that change one work on a
    copy."""
    root = tmp_path_factory.mktemp("converted")
    return {"shards": convert_sample(sample, root / "shards", train_shards=3),
            "list": convert_sample(sample, root / "list", fmt="list")}
