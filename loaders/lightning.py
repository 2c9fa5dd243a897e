"""imgprep's loaders in PyTorch Lightning (``pip install 'imgprep[lightning]'``).

``ImgprepDataModule`` makes the loaders in ``setup``, on every rank, for the World the
trainer says (``lightning_world``: its global rank, local rank, node and node count), so
Lightning's own launcher (which sets ``LOCAL_RANK``, ``NODE_RANK`` and ``WORLD_SIZE`` but no
``RANK``), torchrun, Slurm and MPI all give each rank its own share. The train loader is a
``ResumableLoader`` (``loaders.resumable``): Lightning sees the full epoch's length, its
``set_epoch`` (on ``loader.sampler``) starts each epoch and keeps a restored position, and
the loader's state goes into Lightning's checkpoint (its fit loop collects the state of every
train loader that has ``state_dict``) and comes back in ``Trainer.fit(ckpt_path=...)``. With
``normalize=True`` the batches come normalised on the trainer's device (a ``DeviceLoader``,
whose state passes through).

Lightning reads the train loader's length when it sets the loader up and keeps it for later
epochs unless ``Trainer(reload_dataloaders_every_n_epochs=N)``; after an elastic resume the
resumed epoch's length (the steps counted plus what the new World has left) is not a whole
epoch's, so ``setup`` sets it to 1 where it is 0 (``train_dataloader`` hands back the same
loader; Lightning then reads its length at each epoch's start). An elastic resume on more
ranks than wrote the checkpoint is refused (``ResumableLoader(at_most_an_epoch=True)``):
Lightning counts the smaller World's steps and would end the epoch early, dropping samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytorch_lightning as pl

from imgprep import World
from loaders import DeviceLoader, LoaderOptions, ResumableLoader, make_loader
from loaders.protocol import Loader


def lightning_world(trainer: pl.Trainer) -> World:
    """This rank's World as the trainer has it (ranks in blocks of ``world_size //
    num_nodes`` a node, which is how every Lightning launcher places them)."""
    nodes = trainer.num_nodes
    return World(rank=trainer.global_rank, world_size=trainer.world_size,
                 local_rank=trainer.local_rank, local_world_size=trainer.world_size // nodes,
                 node_rank=trainer.node_rank, num_nodes=nodes, launcher="lightning")


class ImgprepDataModule(pl.LightningDataModule):
    """The train (and val) loaders of a converted folder or label list, made per rank.

    Args:
        data: what ``make_loader`` takes (a folder with ``<split>.json``, or a list file).
        options: the loaders' options (``batch_size`` is a rank's batch).
        val: also make the val split's loader (``val_dataloader``).
        val_options: the val loader's options (default: ``options``).
        mode: shards only: ``"replicate"`` or ``"partition"`` (``make_loader``).
        normalize: hand batches over normalised on the trainer's device (``DeviceLoader``,
            with the train split's mean and std), else as the loader makes them (uint8).

    After ``setup``: ``train`` (a ``ResumableLoader``), ``val`` and ``world``.
    """

    def __init__(self, data: str | Path, options: LoaderOptions, *, val: bool = False,
                 val_options: LoaderOptions | None = None, mode: str | None = None,
                 normalize: bool = True) -> None:
        super().__init__()
        self.data, self.options, self.mode = data, options, mode
        self.val_options = (val_options or options) if val else None
        self.normalize = normalize
        self.world: World | None = None
        self.train: ResumableLoader | None = None
        self.val: Loader | DeviceLoader | None = None

    def setup(self, stage: str) -> None:
        """Make the loaders once, for the trainer's World."""
        if self.world is not None:
            return
        trainer = self.trainer
        if trainer is None:
            raise RuntimeError("ImgprepDataModule: no trainer; pass the module to "
                               "Trainer.fit(datamodule=...)")
        settings: Any = trainer  # the Trainer argument, kept as an attribute of that name
        if not settings.reload_dataloaders_every_n_epochs:
            settings.reload_dataloaders_every_n_epochs = 1  # read len() at every epoch start
        self.world = world = lightning_world(trainer)
        raw = make_loader(self.data, "train", world, self.options, mode=self.mode)
        self.train = ResumableLoader(self._hand_over(raw, raw), at_most_an_epoch=True)
        if self.val_options is not None:
            val = make_loader(self.data, "val", world, self.val_options, mode=self.mode)
            self.val = self._hand_over(val, raw)

    def _hand_over(self, loader: Loader, train: Loader) -> Any:
        if not self.normalize:
            return loader
        device = self.trainer.strategy.root_device  # type: ignore[union-attr]
        return DeviceLoader(loader, device, train.mean, train.std)

    def train_dataloader(self) -> ResumableLoader:
        if self.train is None:
            raise RuntimeError("ImgprepDataModule: setup() has not run; pass the module to "
                               "Trainer.fit(datamodule=...)")
        return self.train

    def val_dataloader(self) -> Any:
        """The val loader; none (an empty list, which Lightning takes as no validation)
        when made without ``val=True``."""
        return [] if self.val is None else self.val
