"""The resampler tests' real inputs: every sample image as convert writes it (256 px), decoded
into an RGBX frame as the crop-aware decoder leaves one, with one random-resized-crop box (the
loader's default train transform's draws, seeded), made once a session."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imgprep import resample
from imgprep.convert.image import convert_image
from imgprep.sections import TransformOptions
from loaders.transforms import TrainTransform, crop_box

Box = tuple[float, float, float, float]


@pytest.fixture(scope="session")
def shard_crops(real_data: Path) -> list[tuple[np.ndarray, Box]]:
    """(frame, box) for each of the sample's images."""
    if not resample.AVAILABLE:
        pytest.skip(f"the resampler: {resample.status()}")
    rng = np.random.default_rng(38)
    crops = []
    for path in sorted((real_data / "images").iterdir()):
        jpeg = convert_image(path.read_bytes(), TransformOptions()).jpeg
        frame = np.ascontiguousarray(np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGBX")))
        crops.append((frame, crop_box(frame.shape[1], frame.shape[0], TrainTransform(), rng)))
    return crops
