"""Where the processes of a job meet: one address and port, learned under any launcher.

torchrun gives ``MASTER_ADDR``/``MASTER_PORT``; under mpirun nobody does, so rank 0 picks its
address and a free port and broadcasts them over MPI (mpi4py): MPI bootstraps, Gloo or NCCL
carries the data. Under srun every task knows the step's node list and the job and step ids,
so the meeting point needs no MPI at all: the first node of ``SLURM_STEP_NODELIST`` (where
task 0 runs) and a port derived from the ids (``slurm_rendezvous``). The trainer opens its
process group there; fan-out staging opens a group of its own among the node copiers (local
rank 0 of each node), which must not disturb the trainer's, so it finds its meeting point by
``copier_rendezvous``:

1. an explicit ``--rendezvous HOST:PORT`` (node 0's copier listens there);
2. inside a job whose process group is open (the trainer): a fresh port on rank 0, broadcast
   over that group;
3. under torchrun, whose agent keeps a store at ``MASTER_ADDR:MASTER_PORT`` for the job's
   life: that store, under a key prefix of its own;
4. ``MASTER_ADDR``/``MASTER_PORT`` with nobody listening yet: node 0's copier listens there;
5. under srun: the step's first node and a port derived from the job and step ids, one above
   the trainer's (``slurm_rendezvous``);
6. under mpirun (or a PMI launcher) with mpi4py: rank 0's address and a free port, broadcast
   over MPI.

Without any of these, a plain loop over ``--num-nodes/--node-rank`` cannot meet: the error
says to pass ``--rendezvous``.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from imgprep.errors import ImgprepError
from imgprep.job.world import World


class RendezvousError(ImgprepError, RuntimeError):
    """The processes of a job cannot meet; the message says what to set."""


@dataclass(frozen=True)
class Rendezvous:
    """Where to meet, how the address was learned, and whether a store already listens there
    (torchrun's agent keeps one) or node 0 must open it."""

    addr: str
    port: int
    via: str
    store_listens: bool = False

    def __str__(self) -> str:
        return f"{self.addr}:{self.port} (from {self.via})"


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


def local_address_towards(addr: str, port: int) -> str:
    """The address of this host's interface on the route to ``addr`` (what peers can reach
    when hosts have several interfaces or live in network namespaces)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, port))  # UDP: picks the route, sends nothing
            return str(s.getsockname()[0])
    except OSError:
        return own_address()


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` as a pair; a RendezvousError that shows the spelling otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RendezvousError(f"rendezvous address {text!r} is not HOST:PORT (for example "
                              "node0:29500)")
    return host.strip("[]"), int(port)


SLURM_PORT_BASE = 15000  # ports 15000..34999 by job and step id, as Slurm-aware trainers pick


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: ``gpu[07-09,12],cpu1`` -> ``gpu07``."""
    head = re.match(r"[^,\[]*(?:\[[^\]]*\][^,\[]*)*", nodelist.strip())
    text = head.group(0) if head else ""
    while (m := re.search(r"\[([^\]]*)\]", text)) is not None:
        first = re.split(r"[,-]", m.group(1))[0]
        text = text[:m.start()] + first + text[m.end():]
    if not text:
        raise RendezvousError(f"cannot read a host from the Slurm node list {nodelist!r}")
    return text


def slurm_rendezvous(world: World, env: Mapping[str, str], offset: int = 0) -> Rendezvous:
    """Where srun's tasks meet without MPI: the step's first node (task 0 runs there) and a
    port from the job and step ids, so every task computes the same one. ``offset`` keeps
    the fan-out copiers' meeting point apart from the trainer's."""
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    job = env.get("SLURM_JOB_ID", "")
    if not nodes or not job.isdigit():
        raise RendezvousError(
            f"rank {world.rank}: srun gave no SLURM_STEP_NODELIST/SLURM_JOB_ID to meet by; "
            "set MASTER_ADDR and MASTER_PORT, or launch with torchrun")
    step = env.get("SLURM_STEP_ID", "0")
    step_id = int(step) if step.isdigit() else 0
    port = SLURM_PORT_BASE + (int(job) * 16 + step_id * 2 + offset) % 20000
    return Rendezvous(first_host(nodes), port, "srun's node list and job id")


def _mpi_comm(world: World, comm: Any) -> Any:
    if comm is not None:
        return comm
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise RendezvousError(
            f"rank {world.rank}: no MASTER_ADDR/MASTER_PORT and no mpi4py to share them; "
            "launch with torchrun, set both variables, or pip install mpi4py") from e
    return MPI.COMM_WORLD


def _over_mpi(world: World, comm: Any) -> Rendezvous:
    """Rank 0's address and a free port, broadcast over MPI (every rank calls this)."""
    comm = _mpi_comm(world, comm)
    if comm.Get_size() != world.world_size or comm.Get_rank() != world.rank:
        raise RendezvousError(f"rank {world.rank}: MPI says rank {comm.Get_rank()} of "
                              f"{comm.Get_size()}, the launcher variables say {world.rank} of "
                              f"{world.world_size}; launch with a matching mpirun (under srun, the "
                              "launcher variables are enough: no --mpi is needed)")
    mine = (own_address(), free_port()) if world.rank == 0 else None
    addr, port = comm.bcast(mine, root=0)
    return Rendezvous(str(addr), int(port), "mpi4py broadcast")


def rendezvous(world: World, env: Mapping[str, str] | None = None,
               comm: Any = None) -> Rendezvous:
    """Rank 0's address and port for the job's process group: from the environment, else
    broadcast over MPI. Every rank calls it (the broadcast is collective)."""
    env = os.environ if env is None else env
    if "MASTER_ADDR" in env and "MASTER_PORT" in env:
        return Rendezvous(env["MASTER_ADDR"], int(env["MASTER_PORT"]), "environment")
    if not world.is_distributed:
        return Rendezvous("127.0.0.1", free_port(), "single process")
    if world.launcher == "slurm" and comm is None:
        return slurm_rendezvous(world, env)
    return _over_mpi(world, comm)


def _over_process_group(world: World, env: Mapping[str, str]) -> Rendezvous:
    """A fresh port on rank 0 (node 0's leader), broadcast over the open default group; its
    address is that of its interface towards the job's own meeting point, when there is one."""
    import torch.distributed as dist

    mine = None
    if world.rank == 0:
        port = free_port()
        master = env.get("MASTER_ADDR")
        mine = (local_address_towards(master, port) if master else own_address(), port)
    box: list[Any] = [mine]
    dist.broadcast_object_list(box, src=0)
    addr, port = box[0]
    return Rendezvous(str(addr), int(port), "the job's process group")


def copier_rendezvous(world: World, explicit: str | None = None,
                      env: Mapping[str, str] | None = None, comm: Any = None) -> Rendezvous:
    """Where the node copiers of ``world`` meet (see the module's list). Every rank of the
    job calls it: some ways are collective."""
    env = os.environ if env is None else env
    if explicit:
        return Rendezvous(*parse_address(explicit), "--rendezvous")
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return _over_process_group(world, env)
    if "MASTER_ADDR" in env and "MASTER_PORT" in env:
        agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        return Rendezvous(env["MASTER_ADDR"], int(env["MASTER_PORT"]),
                          "torchrun's store" if agent else "MASTER_ADDR/MASTER_PORT", agent)
    if world.launcher == "slurm" and world.is_distributed and comm is None:
        return slurm_rendezvous(world, env, offset=1)
    if world.launcher in ("openmpi", "pmi", "slurm") and world.is_distributed:
        return _over_mpi(world, comm)
    raise RendezvousError(
        f"node {world.node_rank}: fan-out over {world.num_nodes} nodes needs a meeting point "
        "for the node copiers and this launch gives none: pass --rendezvous HOST:PORT (node "
        "0's copier listens there; every node must reach it), or set MASTER_ADDR/MASTER_PORT, "
        "or launch with torchrun, srun or mpirun")
