"""How a batch lies in memory as it leaves a loader: its rows' layout and its padding label.

Rows are decoded 3 x size x size (planes) or, for ``memory_format="channels_last"``, size x
size x 3; either way the batch is handed over NCHW-shaped (channels_last rows as a permuted
view with ``torch.channels_last`` strides, nothing copied), with the same values
(docs/loaders.md "Memory format"). A padding slot (``tail="pad"``) has zero pixels and the
label ``PAD_LABEL``. A batch with batch-level draws (``random_erase`` or ``mixup`` set:
``loaders.mixing``) carries them third, as a uint8 tensor of the packed record
(``with_draws``).
"""

from __future__ import annotations

import torch

PAD_LABEL = -1  # the label of a padding slot (its pixels are zero)
MEMORY_FORMATS = ("contiguous", "channels_last")  # NCHW contiguous; NCHW-shaped, channels_last


def row_shape(size: int, channels_last: bool) -> tuple[int, int, int]:
    """One image of a batch as it is stored: 3 x size x size, or size x size x 3 when the
    batch is channels_last."""
    return (size, size, 3) if channels_last else (3, size, size)


def as_nchw(rows: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """A batch of rows stored as ``row_shape`` says, shaped NCHW: the rows themselves, or a
    permuted view of channels_last rows (its strides are torch.channels_last; nothing is
    copied)."""
    return rows.permute(0, 3, 1, 2) if channels_last else rows


def with_draws(images: torch.Tensor, labels: torch.Tensor, draws: bytes | None
               ) -> tuple[torch.Tensor, ...]:
    """A batch as a loader yields it: ``(images, labels)``, or with ``draws`` (a packed
    ``loaders.mixing.BatchDraws``) ``(images, labels, draws)``, the draws a uint8 CPU tensor
    of their own."""
    if draws is None:
        return images, labels
    return images, labels, torch.frombuffer(bytearray(draws), dtype=torch.uint8)
