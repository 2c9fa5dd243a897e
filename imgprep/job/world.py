"""Who am I in the job: one frozen ``World`` value, detected once from the launcher.

Detected from, in order: torchrun (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``), Open MPI (``OMPI_COMM_WORLD_*``), MPICH/Hydra PMI
(``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``), Slurm (``SLURM_PROCID``,
``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_NNODES``), else a single process;
``LOCAL_RANK`` with a ``WORLD_SIZE`` above 1 and none of these (PyTorch Lightning's own launcher,
which sets no global rank) is refused rather than read as one process.
Only the CLI and the trainer call ``detect()``; everything rank-aware takes a World argument,
so tests build Worlds directly.

Ranks are laid out in blocks: node k runs ranks ``k*L .. k*L+L-1`` (L = local world size; the
order of local ranks inside a node is free), which is what torchrun, srun's default block
distribution and mpirun's slot mapping (or ``--map-by ppr:L:node``) give. Variables that
contradict this are refused with an error that says what to change. Open MPI and PMI name no
node index, so there it is ``rank // L``: a round-robin mapping over nodes cannot be detected.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from imgprep.errors import WorldError
from imgprep.job.cpus import CpuPlan, allowed_cpus, plan_cpus, rank_cores, read_limits


@dataclass(frozen=True, kw_only=True)
class World:
    """Where this process stands in a data-parallel job. Frozen and validated; build one
    directly in tests and library calls (by keyword, or ``World.single()`` for one process),
    or with ``detect()`` from the launcher's variables.

    Args:
        rank, world_size: this process among all ranks of the job.
        local_rank, local_world_size: this process among the ranks of its node.
        node_rank, num_nodes: this node among the job's nodes (ranks are placed in blocks:
            node k holds ranks k*local_world_size ...).
        launcher: where the numbers came from (``torchrun``, ``openmpi``, ``slurm``,
            ``mpich``, ``explicit``, ``single``); named in error messages, not compared.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    launcher: str = field(default="single", compare=False)

    def __post_init__(self) -> None:
        where = f"{self.launcher} variables"
        if self.world_size < 1 or self.local_world_size < 1 or self.num_nodes < 1:
            raise WorldError(f"{where}: sizes must be >= 1 ({self})")
        if not 0 <= self.rank < self.world_size:
            raise WorldError(f"{where}: rank {self.rank} is not below world size {self.world_size}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise WorldError(f"{where}: local rank {self.local_rank} is not below local world "
                             f"size {self.local_world_size}")
        if not 0 <= self.node_rank < self.num_nodes:
            raise WorldError(f"{where}: node rank {self.node_rank} is not below the number of "
                             f"nodes {self.num_nodes}")
        if self.local_world_size * self.num_nodes != self.world_size:
            raise WorldError(
                f"{where}: {self.num_nodes} nodes x {self.local_world_size} ranks per node != "
                f"world size {self.world_size}; run the same number of ranks on every node"
            )
        first = self.node_rank * self.local_world_size
        if not first <= self.rank < first + self.local_world_size:
            raise WorldError(
                f"{where}: rank {self.rank} is on node {self.node_rank}, which is not block "
                f"placement (node k holds ranks k*{self.local_world_size}.."
                f"k*{self.local_world_size}+{self.local_world_size - 1}); use block mapping "
                "(mpirun --map-by ppr:N:node, srun --distribution=block)"
            )

    @classmethod
    def single(cls) -> World:
        """A job of one process: rank 0 of 1, on one node."""
        return cls()

    @property
    def is_node_leader(self) -> bool:
        """Local rank 0: the one process per node that does node-wide work (staging)."""
        return self.local_rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def cores_per_rank(self) -> int:
        """The CPUs this rank may keep busy (at least one): its affinity mask, its cgroup's
        cpuset and CPU quota, shared with the ranks of its node (``imgprep.job.cpus``). The default
        number of worker processes each rank starts."""
        return rank_cores(read_limits(), self.local_world_size, self.launcher == "slurm")

    def cpu_plan(self) -> CpuPlan | str:
        """Which CPUs this rank's own process keeps and which its loader's workers run on,
        within its share of the node (``imgprep.job.cpus.plan_cpus``), or why it has no such
        plan (one core, or a mask that does not say which CPUs are this rank's)."""
        return plan_cpus(read_limits(), allowed_cpus(), self.local_rank, self.local_world_size,
                         self.launcher == "slurm")

    def with_nodes(self, num_nodes: int, node_rank: int) -> World:
        """This process as local rank 0 of ``node_rank`` among ``num_nodes`` one-rank nodes.

        For running node-wide commands from a plain loop or script with no launcher.
        """
        return World(rank=node_rank, world_size=num_nodes, local_rank=0, local_world_size=1,
                     node_rank=node_rank, num_nodes=num_nodes, launcher="explicit")


def _int(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    try:
        return int(value)
    except ValueError:
        raise WorldError(f"environment variable {name}={value!r} is not an integer") from None


def _opt(env: Mapping[str, str], name: str) -> int | None:
    return _int(env, name) if name in env else None


def _block(launcher: str, rank: int, size: int, local_rank: int, local_size: int) -> World:
    """A World whose node index is ``rank // local_size`` (block placement)."""
    if local_size < 1 or size % local_size:
        raise WorldError(
            f"{launcher} variables: local size {local_size} does not divide world size {size}; "
            "run the same number of ranks on every node"
        )
    return World(rank=rank, world_size=size, local_rank=local_rank, local_world_size=local_size,
                 node_rank=rank // local_size, num_nodes=size // local_size, launcher=launcher)


_SLURM_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _slurm_local_size(env: Mapping[str, str], size: int, nodes: int) -> int:
    """Tasks per node from ``SLURM_STEP_TASKS_PER_NODE``/``SLURM_TASKS_PER_NODE`` ("4(x2)")."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if name in env:
            groups = env[name].split(",")
            counts = set()
            for g in groups:
                m = _SLURM_TASKS.match(g.strip())
                if m is None:
                    raise WorldError(f"environment variable {name}={env[name]!r} is not understood")
                counts.add(int(m.group(1)))
            if len(counts) != 1:
                raise WorldError(f"{name}={env[name]!r}: nodes run different numbers of tasks; "
                                 "run the same number of ranks on every node")
            return counts.pop()
    if size % nodes:
        raise WorldError(f"slurm variables: {size} tasks do not divide over {nodes} nodes")
    return size // nodes


def _get(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    """The first of ``names`` that is set (an explicit 0 counts: it is an error, not absent)."""
    for name in names:
        if name in env:
            return _int(env, name)
    return default


def _mpi(launcher: str, env: Mapping[str, str], rank_var: str, size_var: str, local_rank_var: str,
         local_size_var: str) -> World:
    """Open MPI and PMI: without local variables, one node holding every rank."""
    rank, size = _int(env, rank_var), _int(env, size_var)
    local_size = _opt(env, local_size_var)
    local_rank = _opt(env, local_rank_var)
    if local_size is None or local_rank is None:
        return _block(launcher, rank, size, rank, size)
    return _block(launcher, rank, size, local_rank, local_size)


def detect(env: Mapping[str, str] | None = None) -> World:
    """The World described by the launcher's environment variables (``os.environ`` by default).

    Order: torchrun, Open MPI, MPICH/PMI, Slurm. The MPI launchers come before Slurm because
    an mpirun inside a Slurm job leaves the job's (or its proxies') SLURM_* variables in the
    ranks' environment.
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env and "LOCAL_RANK" in env:  # torchrun
        size, rank, local = _int(env, "WORLD_SIZE"), _int(env, "RANK"), _int(env, "LOCAL_RANK")
        local_size = _get(env, ("LOCAL_WORLD_SIZE",), size)
        world = _block("torchrun", rank, size, local, local_size)
        group = _opt(env, "GROUP_RANK")
        if group is not None and group != world.node_rank:
            raise WorldError(f"torchrun variables: GROUP_RANK={group} but rank {rank} with "
                             f"{local_size} ranks per node is on node {world.node_rank}")
        return world
    if "OMPI_COMM_WORLD_RANK" in env:
        return _mpi("openmpi", env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
    if "PMI_RANK" in env and "PMI_SIZE" in env:  # MPICH / Intel MPI (Hydra)
        return _mpi("pmi", env, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    if "SLURM_PROCID" in env and ("SLURM_STEP_NUM_TASKS" in env or "SLURM_NTASKS" in env):
        size = _get(env, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), 1)
        nodes = _get(env, ("SLURM_STEP_NUM_NODES", "SLURM_NNODES"), 1)
        if nodes < 1:
            raise WorldError(f"slurm variables: {nodes} nodes; check SLURM_STEP_NUM_NODES")
        local_size = _slurm_local_size(env, size, nodes)
        world = _block("slurm", _int(env, "SLURM_PROCID"), size,
                       _get(env, ("SLURM_LOCALID",), 0), local_size)
        node = _opt(env, "SLURM_NODEID")
        if node is not None and node != world.node_rank:
            raise WorldError(f"slurm variables: SLURM_NODEID={node} but task {world.rank} with "
                             f"{local_size} tasks per node is on node {world.node_rank}; use "
                             "srun --distribution=block")
        return world
    _refuse_rankless(env)
    return World.single()


def _refuse_rankless(env: Mapping[str, str]) -> None:
    """A launcher that sets ``LOCAL_RANK`` and a ``WORLD_SIZE`` above 1 but no global rank
    (PyTorch Lightning's own, which passes the global rank to its trainer instead) would
    otherwise read as one process, and every rank would load the whole data set."""
    if "LOCAL_RANK" not in env or "WORLD_SIZE" not in env or _int(env, "WORLD_SIZE") <= 1:
        return
    raise WorldError(
        f"LOCAL_RANK={env['LOCAL_RANK']} and WORLD_SIZE={env['WORLD_SIZE']} are set but no "
        "global rank (RANK): a launcher that keeps the rank to itself (PyTorch Lightning's "
        "own); build the World from its trainer (loaders.lightning), or start the job with "
        "torchrun"
    )
