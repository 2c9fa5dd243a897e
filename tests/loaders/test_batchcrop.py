"""The batched crop, resize and flip (``loaders.batchcrop``) against Pillow and torch's own
bilinear sampler, on images of different sizes in one batch."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from loaders.batchcrop import boxes, crop_resize, source_box
from loaders.transforms import TrainTransform, ValTransform, apply
from tests.support import encode, photo

SHAPES = [(256, 300), (280, 256), (256, 256), (97, 131)]  # (height, width)


@pytest.fixture(scope="module")
def images() -> list[torch.Tensor]:
    rng = np.random.default_rng(0)
    return [torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8))
            for h, w in SHAPES]


def sizes(images: list[torch.Tensor]) -> list[tuple[int, int]]:
    return [(im.shape[2], im.shape[1]) for im in images]


def test_a_whole_pixel_box_the_output_size_is_copied(images: list[torch.Tensor]) -> None:
    box = np.array([[20, 10, 84, 74], [0, 0, 64, 64], [192, 192, 256, 256], [33, 5, 97, 69]],
                   np.float64)
    out = crop_resize(images, box, np.zeros(4, bool), 64)
    for im, b, o in zip(images, box.astype(int), out, strict=True):
        assert torch.equal(o, im[:, b[1]:b[3], b[0]:b[2]])


def test_flip_mirrors_and_channels_last_holds_the_same_values(images: list[torch.Tensor]
                                                              ) -> None:
    box, _ = boxes(sizes(images), TrainTransform(size=48), np.random.default_rng(1))
    plain = crop_resize(images, box, np.zeros(4, bool), 48)
    flips = np.array([True, False, True, False])
    flipped = crop_resize(images, box, flips, 48)
    for k in range(4):
        assert torch.equal(flipped[k], plain[k].flip(-1) if flips[k] else plain[k])
    rows = crop_resize(images, box, flips, 48, channels_last=True)
    assert rows.shape == (4, 48, 48, 3) and torch.equal(rows.permute(0, 3, 1, 2), flipped)


def test_resampling_is_pillows_bilinear_where_it_enlarges(images: list[torch.Tensor]) -> None:
    """Pillow's bilinear filter only widens its support when it shrinks: an enlarged box is
    sampled the same way, up to rounding (one level)."""
    box = np.array([[10.3, 20.7, 110.1, 140.2], [3.5, 0.0, 200.0, 180.9],
                    [0.0, 0.0, 200.0, 200.0], [1.2, 2.2, 96.1, 96.9]])
    out = crop_resize(images, box, np.zeros(4, bool), 224)
    for im, b, o in zip(images, box, out, strict=True):
        pil = Image.fromarray(im.permute(1, 2, 0).numpy())
        want = np.asarray(pil.resize((224, 224), Image.Resampling.BILINEAR, box=tuple(b)))
        assert np.abs(o.permute(1, 2, 0).numpy().astype(int) - want).max() <= 1


def test_resampling_is_grid_samples_on_each_image(images: list[torch.Tensor]) -> None:
    """Pixel centres, clamped at the edges: torch's grid_sample (align_corners=False,
    border padding) on each image alone, up to rounding."""
    box, flip = boxes(sizes(images), TrainTransform(size=40), np.random.default_rng(2))
    out = crop_resize(images, box, flip, 40)
    for im, (left, top, right, bottom), f, o in zip(images, box, flip, out, strict=True):
        h, w = im.shape[1:]
        theta = torch.tensor([[[(right - left) / w, 0, (left + right) / w - 1],
                               [0, (bottom - top) / h, (top + bottom) / h - 1]]],
                             dtype=torch.float32)
        grid = F.affine_grid(theta, [1, 3, 40, 40], align_corners=False)
        want = F.grid_sample(im[None].float(), grid, mode="bilinear", padding_mode="border",
                             align_corners=False)[0].add(0.5).floor()
        want = want.flip(-1) if f else want
        assert (want - o.float()).abs().max() <= 1


def test_train_boxes_are_the_pillow_backends_draws(images: list[torch.Tensor]) -> None:
    t = TrainTransform(size=64)
    box, flip = boxes(sizes(images), t, np.random.default_rng(5))
    rng = np.random.default_rng(5)
    want = [t.geometry(w, h, rng) for w, h in sizes(images)]
    assert [tuple(b) for b in box] == [g.box for g in want]
    assert flip.tolist() == [g.flip for g in want]


@pytest.mark.parametrize("shape", [(256, 320), (300, 400), (500, 333)])
def test_val_crops_are_the_pillow_paths_box(shape: tuple[int, int]) -> None:
    """A val crop of an image whose short side is not ``resize`` is the Pillow path's box
    (its resize, then its center crop) sampled in one step: close, not equal."""
    t = ValTransform(size=224, resize=256)
    data = encode(photo(shape, 3), "JPEG", quality=95)
    with Image.open(io.BytesIO(data)) as img:
        rgb = np.asarray(img.convert("RGB"))
    image = torch.from_numpy(rgb.transpose(2, 0, 1).copy())
    w, h = shape
    rng = np.random.default_rng(0)  # a val transform draws nothing
    box = np.array([source_box(w, h, t.geometry(w, h, rng))])
    got = crop_resize([image], box, np.zeros(1, bool), 224)[0]
    want = np.empty((3, 224, 224), np.uint8)
    apply(data, t, rng, want)
    assert (got.float() - torch.from_numpy(want).float()).abs().mean() < 2.0


def test_an_empty_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        crop_resize([], np.zeros((0, 4)), np.zeros(0, bool), 8)
