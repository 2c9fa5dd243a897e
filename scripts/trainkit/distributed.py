"""Open the torch process group under any launcher: torchrun, mpirun, srun or none.

Where the ranks meet comes from imgprep.job.rendezvous (torchrun's variables, or rank 0's address
broadcast over mpi4py: MPI bootstraps, NCCL (GPUs) or Gloo (CPU) carries gradients), which
fan-out staging shares. A process-group timeout makes a dead rank fail the others with a clear
message instead of a hang. ``--backend nccl`` or ``gloo`` opens the group even for one
process (DDP's bucketed all-reduce then runs alone: the way to check a backend on one GPU);
``auto`` opens it only for more than one. At the end, ``replicas_identical`` checks that DDP
kept every rank's weights equal.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

from imgprep import Rendezvous, RendezvousError, World, rendezvous

from . import TrainError

DistError = RendezvousError  # the process group could not be opened; the message says what to set
__all__ = ["BACKENDS", "DistError", "Rendezvous", "close", "device_for", "grouped", "init",
           "rendezvous", "replicas_identical"]


def device_for(world: World) -> torch.device:
    """One GPU per local rank when CUDA is present, else the CPU."""
    if torch.cuda.is_available():
        if world.local_rank >= torch.cuda.device_count():
            raise DistError(f"rank {world.rank}: local rank {world.local_rank} but only "
                            f"{torch.cuda.device_count()} GPUs on this node; run one rank "
                            "per GPU")
        torch.cuda.set_device(world.local_rank)
        return torch.device("cuda", world.local_rank)
    return torch.device("cpu")


BACKENDS = ("auto", "nccl", "gloo")  # --backend


def init(world: World, timeout_s: float = 300.0, backend: str = "auto") -> str:
    """Open the default process group for ``world``; returns its backend. ``auto``: NCCL
    with CUDA, else Gloo, opened only for more than one process. ``nccl`` or ``gloo`` named:
    opened even for one process, so that DDP and its all-reduce run alone (as under torchrun
    --nproc-per-node 1); NCCL is refused without CUDA."""
    if backend not in BACKENDS:
        raise DistError(f"rank {world.rank}: --backend must be one of {', '.join(BACKENDS)}, "
                        f"not {backend!r}")
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if not world.is_distributed:
            return backend
    elif backend == "nccl" and not torch.cuda.is_available():
        raise DistError(f"rank {world.rank}: --backend nccl needs a CUDA device, and torch "
                        "sees none here; use --backend gloo (or auto)")
    rv = rendezvous(world)
    try:
        dist.init_process_group(backend, init_method=f"tcp://{rv.addr}:{rv.port}",
                                rank=world.rank, world_size=world.world_size,
                                timeout=timedelta(seconds=timeout_s))
    except (RuntimeError, ValueError) as e:
        raise DistError(f"rank {world.rank}: cannot join the process group at "
                        f"{rv.addr}:{rv.port} (from {rv.via}): {e}; check that every rank "
                        "started and can reach rank 0") from e
    return backend


def grouped() -> bool:
    """Whether this process opened the default process group (``init``): then the model is
    wrapped in DDP and its gradients are all-reduced, even with one process."""
    return dist.is_available() and dist.is_initialized()


def close() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def replicas_identical(model: nn.Module, world: World) -> bool:
    """Whether every rank holds the same parameters (what DDP's all-reduce guarantees);
    raises TrainError naming the rank where they differ."""
    if not grouped():
        return True
    flat = torch.cat([p.detach().float().flatten().cpu() for p in model.parameters()])
    digest = torch.tensor([flat.double().sum().item(), (flat.double() ** 2).sum().item()],
                          dtype=torch.float64, device=next(model.parameters()).device)
    peak, low = digest.clone(), digest.clone()
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    if not torch.equal(peak, low):
        raise TrainError(f"rank {world.rank}: model replicas differ after training "
                         f"({digest.tolist()} vs {peak.tolist()}); gradients were not synced")
    return True
