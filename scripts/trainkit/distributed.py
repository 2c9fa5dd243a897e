"""Open the torch process group under any launcher: torchrun, mpirun, srun or none.

torchrun gives ``MASTER_ADDR``/``MASTER_PORT``; under mpirun (and srun with an MPI plugin)
nobody does, so rank 0 picks its address and a free port and broadcasts them over MPI
(mpi4py), the ChainerMN split: MPI bootstraps, NCCL (GPUs) or Gloo (CPU) carries gradients.
A process-group timeout makes a dead rank fail the others with a clear message instead of a
hang.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from imgprep.errors import ImgprepError
from imgprep.world import World


class DistError(ImgprepError, RuntimeError):
    """The process group could not be opened; the message says what to set."""


@dataclass(frozen=True)
class Rendezvous:
    """Where rank 0 listens, and how the address was learned."""

    addr: str
    port: int
    via: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def own_address() -> str:
    """This host's address as the others can reach it (loopback only if nothing else)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def rendezvous(world: World, env: dict[str, str] | None = None, comm: Any = None) -> Rendezvous:
    """Rank 0's address and port: from the environment, else broadcast over MPI."""
    env = dict(os.environ) if env is None else env
    if "MASTER_ADDR" in env and "MASTER_PORT" in env:
        return Rendezvous(env["MASTER_ADDR"], int(env["MASTER_PORT"]), "environment")
    if not world.is_distributed:
        return Rendezvous("127.0.0.1", free_port(), "single process")
    if comm is None:
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise DistError(
                f"rank {world.rank}: no MASTER_ADDR/MASTER_PORT and no mpi4py to share them; "
                "launch with torchrun, set both variables, or pip install mpi4py") from e
        comm = MPI.COMM_WORLD
    if comm.Get_size() != world.world_size or comm.Get_rank() != world.rank:
        raise DistError(f"rank {world.rank}: MPI says rank {comm.Get_rank()} of "
                        f"{comm.Get_size()}, the launcher variables say {world.rank} of "
                        f"{world.world_size}; launch with a matching mpirun")
    mine = (own_address(), free_port()) if world.rank == 0 else None
    addr, port = comm.bcast(mine, root=0)
    return Rendezvous(str(addr), int(port), "mpi4py broadcast")


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


def init(world: World, timeout_s: float = 300.0, backend: str | None = None) -> str:
    """Open the default process group for ``world`` (no-op for one process); returns the
    backend: NCCL with CUDA, else Gloo."""
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if not world.is_distributed:
        return backend
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


def close() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
