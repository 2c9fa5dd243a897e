"""imgprep's loaders in Hugging Face Accelerate (``pip install 'imgprep[accelerate]'``).

Accelerate shards, re-seeds and checkpoints only the ``DataLoader``s given to
``accelerator.prepare``; any other iterable comes back from ``prepare`` as it was. So an
imgprep loader is made for the World Accelerate runs in (``accelerate_world``: the launcher's
variables, checked against Accelerate's own numbers) and registered for checkpointing
(``prepare_loader``): ``accelerator.save_state`` then writes its state (rank 0's, as
``custom_checkpoint_<i>.pkl``; Accelerate writes custom states on the main process only) and
``accelerator.load_state`` loads that file on every rank, which the state is made for
(``loaders.resumable``). The loop takes its epochs from ``loader.epochs(n)``, which keeps a
restored position for the epoch it was saved in.
"""

from __future__ import annotations

from accelerate import Accelerator, PartialState

from imgprep import World, WorldError, detect
from loaders import DeviceLoader, ResumableLoader
from loaders.protocol import Loader


def accelerate_world(state: PartialState | None = None) -> World:
    """This process's World: the launcher's (``imgprep.detect``: ``accelerate launch`` runs
    torchrun or mpirun), which must agree with Accelerate's ranks."""
    state = PartialState() if state is None else state
    world = detect()
    mine = (world.rank, world.world_size, world.local_rank)
    theirs = (state.process_index, state.num_processes, state.local_process_index)
    if mine != theirs:
        hint = " (on a machine without GPUs, make the Accelerator with cpu=True)" \
            if theirs[1] == 1 else ""
        raise WorldError(
            f"the launcher ({world.launcher}) says rank {mine[0]} of {mine[1]}, local rank "
            f"{mine[2]}; Accelerate runs rank {theirs[0]} of {theirs[1]}, local rank "
            f"{theirs[2]}{hint}; start the job with accelerate launch or torchrun")
    return world


def prepare_loader(accelerator: Accelerator, loader: Loader, *,
                   normalize: bool = True) -> ResumableLoader:
    """``loader`` as the training loop should hold it: its batches normalised on the
    accelerator's device (``DeviceLoader``; ``normalize=False``: as the loader makes them),
    wrapped in a ``ResumableLoader`` and registered with
    ``accelerator.register_for_checkpointing``, so ``save_state``/``load_state`` carry its
    position. Register other objects in the same order when resuming (Accelerate matches
    them by index)."""
    inner = DeviceLoader(loader, accelerator.device, loader.mean, loader.std) \
        if normalize else loader
    resumable = ResumableLoader(inner)
    accelerator.register_for_checkpointing(resumable)
    return resumable
