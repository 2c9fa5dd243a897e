"""Crop, resize and flip a whole batch of decoded images of any sizes in a few tensor ops.

The ``nvjpeg`` backend's images arrive as a list of uint8 3 x H x W tensors of different
sizes (on a GPU, or on the CPU). Each gets a box in its own pixels and maybe a flip
(``boxes``: the transform's ``geometry``, the Pillow backend's own draws, its crop mapped
back to the source: a train transform's random-resized-crop, a val transform's center
crop); ``crop_resize`` then resamples every box to ``size`` x ``size`` at once:

- the images are concatenated into one flat buffer (one ``torch.cat``), and each output
  pixel reads its four bilinear neighbours from it by index (``torch.take``: one gather per
  neighbour for the whole batch), with each image's offset, height and width; no padding to
  the largest image, no Python loop over images on the device, and the work grows with the
  output (N x 3 x size x size), not with the input sizes;
- sample positions are pixel centres (as Pillow's ``resize(box=...)`` and ``grid_sample``
  with ``align_corners=False`` place them), clamped to the image's edge; a box the size of
  the output at whole-pixel offsets is copied exactly (a val crop out of a 256 px image);
- plain bilinear, no antialiasing: a box wider than the output (a shrink) is sampled, not
  averaged, which Pillow's filter (its support widened by the shrink factor) does. On
  256 px shards a 224 px crop shrinks by 1.5 at most; pixels differ from the Pillow path's
  by that and by the decoder (docs/nvjpeg.md).

The output is a new uint8 tensor on the images' device: N x 3 x size x size, or N x size x
size x 3 for channels_last rows (``loaders.batch.row_shape``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from loaders.transforms import Box, Geometry, Transform


def source_box(w: int, h: int, g: Geometry) -> Box:
    """The pixels of a ``w`` x ``h`` image that ``g`` keeps, in the image's own pixels
    (left, top, right, bottom): ``g``'s crop mapped back through its resize to its box (the
    whole image when ``g.box`` is None), so that one resample from the source makes it."""
    left, top, right, bottom = g.box if g.box is not None else (0.0, 0.0, float(w), float(h))
    cl, ct, cr, cb = g.crop
    if g.resize is None:  # nothing resampled: the crop is in the source's pixels
        return left + cl, top + ct, left + cr, top + cb
    sx, sy = (right - left) / g.resize[0], (bottom - top) / g.resize[1]
    return left + cl * sx, top + ct * sy, left + cr * sx, top + cb * sy


def boxes(sizes: Sequence[tuple[int, int]], t: Transform, rng: np.random.Generator
          ) -> tuple[np.ndarray, np.ndarray]:
    """Each image's box (N x 4: left, top, right, bottom) and flip (N bools), for images of
    ``sizes`` (width, height) in order: ``t.geometry`` drawn from ``rng`` one image after the
    other (the Pillow backend's order, so a batch seeded alike gets the same boxes and
    flips; a val transform draws nothing)."""
    out = np.empty((len(sizes), 4), np.float64)
    flips = np.zeros(len(sizes), bool)
    for i, (w, h) in enumerate(sizes):
        g = t.geometry(w, h, rng)
        out[i], flips[i] = source_box(w, h, g), g.flip
    return out, flips


def _taps(lo: torch.Tensor, extent: torch.Tensor, limit: torch.Tensor, size: int
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Along one axis, for every image (N) and output pixel (size): the two input pixels a
    bilinear sample reads and the second one's weight."""
    centres = (torch.arange(size, device=lo.device, dtype=torch.float32) + 0.5) / size
    pos = lo[:, None] + centres[None, :] * extent[:, None] - 0.5
    first = pos.floor()
    weight = pos - first
    last = (limit - 1)[:, None]
    i0 = first.long()
    i1 = torch.minimum((i0 + 1).clamp_(min=0), last)  # each clamped to the image's edge
    i0 = torch.minimum(i0.clamp_(min=0), last)
    return i0, i1, weight


def crop_resize(images: Sequence[torch.Tensor], box: np.ndarray, flip: np.ndarray,
                size: int, channels_last: bool = False) -> torch.Tensor:
    """Every image's ``box`` resampled to ``size`` x ``size`` (bilinear), mirrored where
    ``flip`` says: a new uint8 tensor, rows 3 x size x size or (``channels_last``) size x
    size x 3. ``images``: uint8 3 x H x W tensors, each contiguous, all on one device."""
    if not images:
        raise ValueError("crop_resize needs at least one image")
    device = images[0].device
    heights = torch.tensor([im.shape[1] for im in images], device=device)
    widths = torch.tensor([im.shape[2] for im in images], device=device)
    planes = heights * widths
    base = torch.cumsum(planes, 0) * 3 - planes * 3  # where each image starts
    flat = torch.cat([im.reshape(-1) for im in images])
    b = torch.as_tensor(box, dtype=torch.float32).to(device)
    x0, x1, wx = _taps(b[:, 0], b[:, 2] - b[:, 0], widths, size)
    y0, y1, wy = _taps(b[:, 1], b[:, 3] - b[:, 1], heights, size)
    mirror = torch.as_tensor(flip, dtype=torch.bool).to(device)[:, None]
    x0, x1, wx = (torch.where(mirror, v.flip(1), v) for v in (x0, x1, wx))
    chan = base[:, None] + torch.arange(3, device=device)[None, :] * planes[:, None]
    n = len(images)
    # how channels, rows and columns broadcast: N x 3 x size x size, or N x size x size x 3
    at_c, at_y, at_x = ((n, 1, 1, 3), (n, size, 1, 1), (n, 1, size, 1)) if channels_last \
        else ((n, 3, 1, 1), (n, 1, size, 1), (n, 1, 1, size))
    out = torch.zeros((), device=device)
    for yi, fy in ((y0, 1 - wy), (y1, wy)):
        row = chan.view(at_c) + (yi * widths[:, None]).view(at_y)
        for xi, fx in ((x0, 1 - wx), (x1, wx)):
            out = out + flat.take(row + xi.view(at_x)).float() * (fy.view(at_y) * fx.view(at_x))
    return out.add_(0.5).floor_().clamp_(0, 255).to(torch.uint8)
