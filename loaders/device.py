"""The device side: uint8 NCHW batches to normalised float on the GPU (or CPU).

Batches leave the loader as uint8 (4x less to copy than float32); here they are copied to the
device on a side CUDA stream one batch ahead of use, converted to float, normalised with the
manifest's mean and std, and laid out channels_last, the layout convolutions run fastest in.
A loader asked for ``memory_format="channels_last"`` hands them over laid out so already:
the copy to the device keeps their strides and the conversion is elementwise, so nothing is
transposed; contiguous batches are made channels_last after the conversion, as before.

A shard or label-list loader's batches are taken in place (``PlannedLoader.in_place``: no
copy out of the workers' shared memory). On the CPU the conversion makes the batch's own
tensor before the next batch is asked for, which gives the slot back. On CUDA the shared
memory is page-locked (``PlannedLoader.lock_pages``) so the copy to the GPU runs
asynchronously straight from the slot, and it is waited for before the next batch is asked
for (it has had the trainer's whole step to finish). Where CUDA refuses to page-lock it, each
batch is copied out into pinned memory first, as ``iter(loader)`` does for other loaders.

A loader with ``random_erase`` or ``mixup`` set yields ``(images, labels, draws)``: the
batch's draws (``loaders.mixing``), made where it was decoded, are carried out here after
the normalisation, on the same device and, on CUDA, on the same side stream
(``loaders.mixapply``): erasing, then mixing; with mixup the labels become soft targets.

``state_dict``, ``load_state_dict`` and ``set_epoch`` pass through to the wrapped loader, so a
training framework that checkpoints the ``DeviceLoader`` it was handed checkpoints the loader.
The state is as of the batches handed out: on CUDA the loader has given one batch more (the
one being copied ahead), so the state is the one taken before that batch was asked for.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from loaders.base import PlannedLoader
from loaders.mixapply import apply_draws
from loaders.mixing import BatchDraws


def normalize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
              dtype: torch.dtype = torch.float32, channels_last: bool = True) -> torch.Tensor:
    """uint8 NCHW -> ``(x/255 - mean) / std`` in ``dtype`` (a new tensor); ``mean``/``std``
    are 0..1 scale, shaped (1, 3, 1, 1) on the images' device. Out channels_last (input that
    is channels_last already is converted in its own layout, not transposed), else
    contiguous NCHW."""
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating point type, not {dtype}")
    x = images.to(dtype, copy=True)  # keeps the input's strides
    x = x.sub_(mean * 255).div_(std * 255)
    return x.contiguous(memory_format=torch.channels_last if channels_last
                        else torch.contiguous_format)


class DeviceLoader:
    """Wrap a loader of ``(uint8 images, labels)``: yields them normalised on ``device``;
    or of ``(uint8 images, labels, draws)`` (``random_erase`` or ``mixup`` set): yields them
    normalised, then erased and mixed as the draws say (``loaders.mixapply``).

    On CUDA the next batch is copied (non-blocking, from pinned memory) and converted on a
    side stream while the current one is in use; on CPU it is a plain conversion of each
    batch in place in the loader's shared memory (module docstring).

    Yields ``(images, labels)``: float images, normalised, and the labels; with mixup in
    the draws, ``(images, targets)``, the targets float32 (batch, classes), label smoothing
    folded in (timm's ``mixup_target``; a padding row's are zeros). Erasing with
    ``mode="rand"`` or ``"pixel"`` draws its noise from a ``torch.Generator`` on ``device``
    seeded by the batch's draws: the same on every run on one kind of device, not the same
    numbers on the CPU and on CUDA.

    Args:
        loader: any iterable of ``(uint8 NCHW images, labels)`` or ``(uint8 NCHW images,
            labels, draws)`` (a ``ShardLoader`` or ``LabelListLoader``, contiguous or
            channels_last); its length is passed through.
        device: where the batches go (``"cuda"``, ``"cuda:1"``, ``"cpu"``).
        mean, std: per channel on the 0-1 scale (the loader's ``mean``/``std``, from the
            manifest).
        dtype: of the images out (``torch.bfloat16`` halves the copy's bytes).
        channels_last: hand the images over in channels-last memory format.
    """

    def __init__(self, loader: Iterable[tuple[torch.Tensor, ...]],
                 device: torch.device | str, mean: Sequence[float], std: Sequence[float],
                 dtype: torch.dtype = torch.float32, channels_last: bool = True) -> None:
        if len(mean) != 3 or len(std) != 3 or not all(s > 0 for s in std):
            raise ValueError("mean and std need three values each, std > 0 (from the manifest)")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating point type, not {dtype}")
        self.loader, self.device = loader, torch.device(device)
        self.dtype, self.channels_last = dtype, channels_last
        self.mean = torch.tensor(mean, dtype=dtype, device=self.device).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=dtype, device=self.device).view(1, 3, 1, 1)
        self._behind: dict[str, Any] | None = None  # CUDA: the state as of the batches out

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    # -- resume: the wrapped loader's, as of the batches handed out
    def _stateful(self, name: str) -> Any:
        method = getattr(self.loader, name, None)
        if method is None:
            raise TypeError(f"DeviceLoader: the loader it wraps ({type(self.loader).__name__}) "
                            f"has no {name}(); wrap a ShardLoader or LabelListLoader to resume")
        return method

    def state_dict(self) -> dict[str, Any]:
        """The wrapped loader's ``state_dict`` as of the batches this one has handed out."""
        if self._behind is not None:
            return dict(self._behind)
        return dict(self._stateful("state_dict")())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The wrapped loader's ``load_state_dict``: the next pass resumes there."""
        self._behind = None
        self._stateful("load_state_dict")(state)

    def set_epoch(self, epoch: int) -> None:
        """The wrapped loader's ``set_epoch``."""
        self._behind = None
        self._stateful("set_epoch")(epoch)

    def _with_state(self, batches: Iterable[tuple[torch.Tensor, ...]]
                    ) -> Iterator[tuple[dict[str, Any] | None,
                                        tuple[torch.Tensor, ...]]]:
        """Each batch with the wrapped loader's state from before it was asked for (None for
        a loader that keeps none)."""
        state = getattr(self.loader, "state_dict", None)
        it = iter(batches)
        while True:
            before = None if state is None else state()
            try:
                batch = next(it)
            except StopIteration:
                return
            yield before, batch

    def _convert(self, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch moved, normalised, and erased and mixed where it has draws."""
        if len(batch) not in (2, 3):
            raise ValueError(f"DeviceLoader takes batches of (images, labels) or (images, "
                             f"labels, draws), not {len(batch)} items")
        images = batch[0].to(self.device, non_blocking=True)
        labels = batch[1].to(self.device, non_blocking=True)
        images = normalize(images, self.mean, self.std, self.dtype, self.channels_last)
        if len(batch) == 2:
            return images, labels
        return apply_draws(images, labels, BatchDraws.unpack(batch[2].numpy()))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._behind = None
        if self.device.type != "cuda":
            batches = self.loader
            if self.device.type == "cpu" and isinstance(self.loader, PlannedLoader):
                batches = self.loader.in_place()
            for batch in batches:
                yield self._convert(batch)  # a new tensor: the slot may go back
            return
        yield from self._to_cuda()

    def _to_cuda(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The CUDA side: each batch copied and converted on a side stream, one batch ahead;
        a planned loader's batches are taken in place from page-locked shared memory, the
        copy finished before the next batch (which gives the slot back) is asked for."""
        stream = torch.cuda.Stream(self.device)
        planned = self.loader if isinstance(self.loader, PlannedLoader) \
            and self.loader.lock_pages() else None
        batches = iter(self.loader) if planned is None else planned.in_place()
        ahead: Any = None
        for before, given in self._with_state(batches):
            if planned is not None and not planned.page_locked:  # CUDA refused: copy out,
                given = (given[0].pin_memory(), *given[1:])  # as iter() would
            with torch.cuda.stream(stream):
                batch = self._convert(given)
                copied = stream.record_event()
            if ahead is not None:
                self._behind = before  # the loader has given this batch too: not yet out
                yield ahead
            torch.cuda.current_stream(self.device).wait_stream(stream)
            for t in batch:  # memory made on the side stream is now used on the main one
                t.record_stream(torch.cuda.current_stream(self.device))
            ahead = batch
            if planned is not None:
                copied.synchronize()  # the slot is read: it may go back to its worker
        self._behind = None
        if ahead is not None:
            yield ahead
