"""Tests for imgprep.job.world: the World value object and detect() from each launcher's variables.

Every launcher is exercised with explicit environment dicts for several multi-node layouts
(ranks in blocks: node k runs ranks k*L .. k*L+L-1), the documented precedence between
launchers whose variables coexist (torchrun under srun, mpirun inside a Slurm allocation), and
every kind of inconsistent variable, which must be refused with a WorldError naming the problem.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from imgprep.errors import ImgprepError, WorldError
from imgprep.job.world import World, detect

Env = dict[str, str]

# (num_nodes, ranks per node)
LAYOUTS = [(1, 1), (1, 8), (2, 4), (3, 2), (4, 1), (2, 3)]

ALL_LAUNCHER_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NNODES",
    "SLURM_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES",
    "SLURM_STEP_TASKS_PER_NODE",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
)


def _positions(nodes: int, per_node: int) -> Iterator[tuple[int, int, int]]:
    """(rank, local rank, node) for every rank of a block layout."""
    for node in range(nodes):
        for local in range(per_node):
            yield node * per_node + local, local, node


def torchrun_env(rank: int, local: int, node: int, nodes: int, per_node: int) -> Env:
    return {
        "RANK": str(rank), "WORLD_SIZE": str(nodes * per_node), "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(node),
        "MASTER_ADDR": "node0", "MASTER_PORT": "29500",
    }


def openmpi_env(rank: int, local: int, node: int, nodes: int, per_node: int) -> Env:
    return {
        "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(nodes * per_node),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local), "OMPI_COMM_WORLD_LOCAL_SIZE": str(per_node),
        "OMPI_COMM_WORLD_NODE_RANK": str(node),
    }


def slurm_tasks_per_node(nodes: int, per_node: int) -> str:
    """How Slurm writes a uniform task layout: "4(x2)", or just "8" on one node."""
    return f"{per_node}(x{nodes})" if nodes > 1 else str(per_node)


def slurm_env(rank: int, local: int, node: int, nodes: int, per_node: int) -> Env:
    return {
        "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(nodes * per_node),
        "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node), "SLURM_NNODES": str(nodes),
        "SLURM_TASKS_PER_NODE": slurm_tasks_per_node(nodes, per_node),
        "SLURM_JOB_ID": "4242",
    }


def slurm_step_env(rank: int, local: int, node: int, nodes: int, per_node: int) -> Env:
    """An srun step inside a bigger allocation: the job-level variables describe 8 nodes x 16
    tasks; the SLURM_STEP_* ones describe the step and must win."""
    return {
        "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
        "SLURM_NTASKS": "128", "SLURM_NNODES": "8", "SLURM_TASKS_PER_NODE": "16(x8)",
        "SLURM_STEP_NUM_TASKS": str(nodes * per_node), "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_STEP_TASKS_PER_NODE": slurm_tasks_per_node(nodes, per_node),
    }


def slurm_bare_env(rank: int, local: int, node: int, nodes: int, per_node: int) -> Env:
    """Only the task count and node count: tasks per node is their quotient."""
    return {
        "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(nodes * per_node),
        "SLURM_LOCALID": str(local), "SLURM_NNODES": str(nodes),
    }


def pmi_env(rank: int, local: int, node: int, nodes: int, per_node: int) -> Env:
    return {
        "PMI_RANK": str(rank), "PMI_SIZE": str(nodes * per_node),
        "MPI_LOCALRANKID": str(local), "MPI_LOCALNRANKS": str(per_node),
    }


LAUNCHERS: dict[str, tuple[Callable[[int, int, int, int, int], Env], str]] = {
    "torchrun": (torchrun_env, "torchrun"),
    "openmpi": (openmpi_env, "openmpi"),
    "slurm": (slurm_env, "slurm"),
    "slurm-step": (slurm_step_env, "slurm"),
    "slurm-bare": (slurm_bare_env, "slurm"),
    "pmi": (pmi_env, "pmi"),
}


# --- detection from each launcher -------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda nl: f"{nl[0]}x{nl[1]}")
@pytest.mark.parametrize("name", list(LAUNCHERS))
def test_detect_every_rank_of_a_layout(name: str, layout: tuple[int, int]) -> None:
    make_env, launcher = LAUNCHERS[name]
    nodes, per_node = layout
    seen = []
    for rank, local, node in _positions(nodes, per_node):
        world = detect(make_env(rank, local, node, nodes, per_node))
        assert (world.rank, world.world_size, world.local_rank, world.local_world_size,
                world.node_rank, world.num_nodes) == (rank, nodes * per_node, local, per_node,
                                                      node, nodes)
        assert world.launcher == launcher
        assert world.is_distributed == (nodes * per_node > 1)
        seen.append(world)
    assert len(set(seen)) == nodes * per_node  # every rank detected as a different World


def test_detect_nothing_is_a_single_process() -> None:
    world = detect({"HOME": "/root", "PATH": "/usr/bin"})
    assert world == World()
    assert (world.rank, world.world_size, world.local_rank, world.local_world_size,
            world.node_rank, world.num_nodes) == (0, 1, 0, 1, 0, 1)
    assert world.launcher == "single"
    assert not world.is_distributed
    assert world.is_node_leader


def test_detect_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ALL_LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    assert detect() == World()
    for k, v in torchrun_env(5, 1, 2, 3, 2).items():
        monkeypatch.setenv(k, v)
    assert detect() == World(rank=5, world_size=6, local_rank=1, local_world_size=2, node_rank=2,
                             num_nodes=3)


def test_torchrun_single_node_without_local_world_size() -> None:
    """torchrun always sets LOCAL_WORLD_SIZE, but older launchers only set RANK/LOCAL_RANK/
    WORLD_SIZE: then everything is one node."""
    world = detect({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3"})
    assert world == World(rank=3, world_size=4, local_rank=3, local_world_size=4, node_rank=0,
                          num_nodes=1)
    assert world.launcher == "torchrun"


def test_torchrun_needs_rank_world_size_and_local_rank() -> None:
    """RANK alone (set by many unrelated tools) is not torchrun."""
    assert detect({"RANK": "3"}) == World()
    assert detect({"RANK": "3", "WORLD_SIZE": "4"}) == World()


def test_a_launcher_that_sets_no_global_rank_is_refused_not_read_as_one_process() -> None:
    """PyTorch Lightning's own launcher sets LOCAL_RANK, NODE_RANK and WORLD_SIZE, and no
    RANK: read as one process, every rank would load the whole data set."""
    lightning = {"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}
    with pytest.raises(WorldError, match="LOCAL_RANK=1 and WORLD_SIZE=2 .*no global rank "
                       "\\(RANK\\).*Lightning.*torchrun"):
        detect(lightning)
    assert detect(lightning | {"WORLD_SIZE": "1"}) == World()  # one process: nothing lost
    assert detect(lightning | {"RANK": "1", "LOCAL_WORLD_SIZE": "2"}) == World(
        rank=1, world_size=2, local_rank=1, local_world_size=2)  # under torchrun


@pytest.mark.parametrize("env, missing", [
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}, "OMPI_COMM_WORLD_LOCAL_RANK"),
    ({"PMI_RANK": "2", "PMI_SIZE": "4"}, "MPI_LOCALRANKID"),
], ids=["openmpi", "pmi"])
def test_mpi_without_local_variables(env: Env, missing: str) -> None:
    """Without the local-rank variables the fallback local size is the world size (one node),
    so the only consistent reading of rank 2 of 4 is local rank 2 of that node. Refusing is
    acceptable too, with a message that names the missing variable. Defaulting the local rank
    to 0 makes every rank of the node local rank 0, i.e. every rank a node leader."""
    try:
        world = detect(env)
    except WorldError as e:
        assert missing in str(e), f"misleading error: {e}"
    else:
        assert world == World(rank=2, world_size=4, local_rank=2, local_world_size=4, node_rank=0,
                              num_nodes=1)


def test_mpi_without_local_variables_rank_zero() -> None:
    assert detect({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}) == \
        World(rank=0, world_size=4, local_rank=0, local_world_size=4, node_rank=0, num_nodes=1)
    assert detect({"PMI_RANK": "0", "PMI_SIZE": "1"}).launcher == "pmi"


@pytest.mark.parametrize("tasks", ["4,4", "4(x2)", " 4(x1),4 ", "4(x1),4(x1)"])
def test_slurm_tasks_per_node_spellings(tasks: str) -> None:
    env = slurm_env(6, 2, 1, 2, 4) | {"SLURM_TASKS_PER_NODE": tasks}
    assert detect(env) == World(rank=6, world_size=8, local_rank=2, local_world_size=4, node_rank=1,
                                num_nodes=2)


def test_slurm_step_variables_win_over_job_variables() -> None:
    """A 2-node x 2-task step inside a 3-node x 4-task allocation."""
    env = {
        "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
        "SLURM_NTASKS": "12", "SLURM_NNODES": "3", "SLURM_TASKS_PER_NODE": "4(x3)",
        "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    }
    assert detect(env) == World(rank=3, world_size=4, local_rank=1, local_world_size=2, node_rank=1,
                                num_nodes=2)


def test_slurm_without_node_id_or_local_id_in_a_one_task_step() -> None:
    world = detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    assert world == World()
    assert world.launcher == "slurm"


def test_slurm_needs_a_task_count() -> None:
    """SLURM_PROCID alone (e.g. in an allocation's shell) is not a task layout."""
    assert detect({"SLURM_PROCID": "0", "SLURM_JOB_ID": "7"}) == World()


# --- precedence ---------------------------------------------------------------------------------


@pytest.mark.parametrize("rank", range(8))
def test_torchrun_under_srun_wins(rank: int) -> None:
    """srun starts one torchrun per node (2 tasks); torchrun starts 4 workers on each. The
    workers inherit the srun task's SLURM_* variables, which describe the torchrun agent."""
    local, node = rank % 4, rank // 4
    env = slurm_env(node, 0, node, 2, 1) | torchrun_env(rank, local, node, 2, 4)
    world = detect(env)
    assert world == World(rank=rank, world_size=8, local_rank=local, local_world_size=4,
                          node_rank=node, num_nodes=2)
    assert world.launcher == "torchrun"


def test_torchrun_wins_over_openmpi_and_pmi() -> None:
    env = openmpi_env(0, 0, 0, 1, 1) | pmi_env(0, 0, 0, 1, 1) | torchrun_env(3, 1, 1, 2, 2)
    world = detect(env)
    assert world == World(rank=3, world_size=4, local_rank=1, local_world_size=2, node_rank=1,
                          num_nodes=2)
    assert world.launcher == "torchrun"


@pytest.mark.parametrize("rank", range(6))
def test_openmpi_inside_slurm_allocation_wins(rank: int) -> None:
    """mpirun inside sbatch: the batch step's SLURM_* variables (one task) are inherited."""
    local, node = rank % 2, rank // 2
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
           "SLURM_NODEID": "0", "SLURM_NNODES": "3", "SLURM_TASKS_PER_NODE": "1"}
    env |= openmpi_env(rank, local, node, 3, 2)
    world = detect(env)
    assert world == World(rank=rank, world_size=6, local_rank=local, local_world_size=2,
                          node_rank=node, num_nodes=3)
    assert world.launcher == "openmpi"


def test_openmpi_wins_over_pmi() -> None:
    env = pmi_env(0, 0, 0, 1, 1) | openmpi_env(5, 1, 1, 2, 4)
    assert detect(env).launcher == "openmpi"
    assert detect(env) == World(rank=5, world_size=8, local_rank=1, local_world_size=4, node_rank=1,
                                num_nodes=2)


def test_pmi_wins_over_slurm() -> None:
    """The documented order: MPICH/PMI before Slurm (a Hydra mpirun inside a Slurm job leaves
    the job's SLURM_* variables behind; srun --mpi=pmi2 sets both, consistently)."""
    env = pmi_env(5, 1, 1, 2, 4) | slurm_env(0, 0, 0, 1, 1)
    world = detect(env)
    assert world == World(rank=5, world_size=8, local_rank=1, local_world_size=4, node_rank=1,
                          num_nodes=2)
    assert world.launcher == "pmi"


# --- inconsistent variables ------------------------------------------------------------------


def test_world_error_is_a_value_error_and_an_imgprep_error() -> None:
    assert issubclass(WorldError, ValueError)
    assert issubclass(WorldError, ImgprepError)
    with pytest.raises(ValueError):
        detect({"RANK": "4", "WORLD_SIZE": "4", "LOCAL_RANK": "0"})
    with pytest.raises(ImgprepError):
        detect({"RANK": "4", "WORLD_SIZE": "4", "LOCAL_RANK": "0"})


@pytest.mark.parametrize("env, match", [
    (torchrun_env(8, 0, 2, 2, 4) | {"RANK": "8"}, "rank 8 is not below world size 8"),
    (openmpi_env(6, 2, 3, 3, 2) | {"OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "0"},
     "rank 6 is not below world size 6"),
    (slurm_env(0, 0, 0, 2, 4) | {"SLURM_PROCID": "9", "SLURM_NODEID": "1",
                                 "SLURM_LOCALID": "1"}, "rank 9 is not below world size 8"),
    (pmi_env(0, 0, 0, 1, 2) | {"PMI_RANK": "2"}, "rank 2 is not below world size 2"),
], ids=["torchrun", "openmpi", "slurm", "pmi"])
def test_rank_not_below_world_size(env: Env, match: str) -> None:
    with pytest.raises(WorldError, match=match):
        detect(env)


@pytest.mark.parametrize("env", [
    torchrun_env(1, 0, 0, 2, 4) | {"LOCAL_RANK": "4"},
    openmpi_env(1, 0, 0, 2, 4) | {"OMPI_COMM_WORLD_LOCAL_RANK": "4"},
    slurm_env(1, 0, 0, 2, 4) | {"SLURM_LOCALID": "4"},
    pmi_env(1, 0, 0, 2, 4) | {"MPI_LOCALRANKID": "5"},
], ids=["torchrun", "openmpi", "slurm", "pmi"])
def test_local_rank_not_below_local_size(env: Env) -> None:
    with pytest.raises(WorldError, match=r"local rank \d is not below local world size 4"):
        detect(env)


@pytest.mark.parametrize("env, launcher", [
    ({"RANK": "0", "WORLD_SIZE": "6", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}, "torchrun"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "6",
      "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, "openmpi"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "6", "SLURM_LOCALID": "0",
      "SLURM_TASKS_PER_NODE": "4"}, "slurm"),
    ({"PMI_RANK": "0", "PMI_SIZE": "6", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "4"}, "pmi"),
], ids=["torchrun", "openmpi", "slurm", "pmi"])
def test_local_size_not_dividing_world_size(env: Env, launcher: str) -> None:
    with pytest.raises(WorldError, match=f"{launcher} variables: local size 4 does not divide "
                                         "world size 6.*same number of ranks on every node"):
        detect(env)


def test_slurm_tasks_not_dividing_over_nodes() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0", "SLURM_NNODES": "3"}
    with pytest.raises(WorldError, match="8 tasks do not divide over 3 nodes"):
        detect(env)


@pytest.mark.parametrize("tasks", ["4,2", "4(x2),2", "3(x1),4(x1)", "2,2,1"])
def test_slurm_uneven_tasks_per_node(tasks: str) -> None:
    env = slurm_env(0, 0, 0, 2, 4) | {"SLURM_TASKS_PER_NODE": tasks}
    with pytest.raises(WorldError, match=r"SLURM_TASKS_PER_NODE=.*different numbers of tasks"):
        detect(env)


def test_slurm_uneven_step_tasks_per_node_names_the_step_variable() -> None:
    env = slurm_step_env(0, 0, 0, 2, 3) | {"SLURM_STEP_TASKS_PER_NODE": "4,2"}
    with pytest.raises(WorldError, match="SLURM_STEP_TASKS_PER_NODE="):
        detect(env)


@pytest.mark.parametrize("tasks", ["four", "4(2)", "4(x)", "", "4(x2)x"])
def test_slurm_tasks_per_node_not_understood(tasks: str) -> None:
    env = slurm_env(0, 0, 0, 2, 4) | {"SLURM_TASKS_PER_NODE": tasks}
    with pytest.raises(WorldError, match="SLURM_TASKS_PER_NODE"):
        detect(env)


@pytest.mark.parametrize("group", ["0", "2", "3"])
def test_group_rank_contradicting_block_placement(group: str) -> None:
    env = torchrun_env(5, 1, 1, 2, 4) | {"GROUP_RANK": group}
    with pytest.raises(WorldError, match=f"GROUP_RANK={group} but rank 5 .* on node 1"):
        detect(env)


@pytest.mark.parametrize("node", ["0", "2"])
def test_slurm_node_id_contradicting_block_placement(node: str) -> None:
    env = slurm_env(5, 1, 1, 2, 4) | {"SLURM_NODEID": node}
    with pytest.raises(WorldError, match=f"SLURM_NODEID={node} but task 5 .*on node 1.*"
                                         "--distribution=block"):
        detect(env)


def test_slurm_cyclic_distribution_is_refused() -> None:
    """srun --distribution=cyclic: task 1 runs on node 1, which block placement puts on node 0."""
    with pytest.raises(WorldError, match="SLURM_NODEID=1 but task 1 .*--distribution=block"):
        detect(slurm_env(1, 0, 1, 2, 4))


@pytest.mark.parametrize("name", list(LAUNCHERS))
def test_local_rank_order_inside_a_node_is_free(name: str) -> None:
    """Only the node of a rank is fixed (rank // L); local ranks may be permuted inside it."""
    make_env, _ = LAUNCHERS[name]
    world = detect(make_env(5, 3, 1, 2, 4))  # rank 5 is local rank 3 of node 1
    assert world == World(rank=5, world_size=8, local_rank=3, local_world_size=4, node_rank=1,
                          num_nodes=2)
    assert not world.is_node_leader


@pytest.mark.parametrize("name", ["openmpi", "pmi"])
def test_mpi_node_is_rank_divided_by_local_size(name: str) -> None:
    """Open MPI and PMI name no node index: a round-robin mapping (rank 1 on the second node as
    its local rank 0) cannot be seen and reads as block placement (documented limitation)."""
    make_env, _ = LAUNCHERS[name]
    assert detect(make_env(1, 0, 1, 2, 4)) == World(rank=1, world_size=8, local_rank=0,
                                                    local_world_size=4, node_rank=0, num_nodes=2)


@pytest.mark.parametrize("env, name", [
    (torchrun_env(0, 0, 0, 2, 4) | {"RANK": "zero"}, "RANK"),
    (torchrun_env(0, 0, 0, 2, 4) | {"WORLD_SIZE": "8.0"}, "WORLD_SIZE"),
    (torchrun_env(0, 0, 0, 2, 4) | {"LOCAL_RANK": ""}, "LOCAL_RANK"),
    (torchrun_env(0, 0, 0, 2, 4) | {"LOCAL_WORLD_SIZE": "four"}, "LOCAL_WORLD_SIZE"),
    (torchrun_env(0, 0, 0, 2, 4) | {"GROUP_RANK": "node0"}, "GROUP_RANK"),
    (openmpi_env(0, 0, 0, 2, 4) | {"OMPI_COMM_WORLD_RANK": "0x1"}, "OMPI_COMM_WORLD_RANK"),
    (openmpi_env(0, 0, 0, 2, 4) | {"OMPI_COMM_WORLD_SIZE": "eight"}, "OMPI_COMM_WORLD_SIZE"),
    (openmpi_env(0, 0, 0, 2, 4) | {"OMPI_COMM_WORLD_LOCAL_RANK": "a"},
     "OMPI_COMM_WORLD_LOCAL_RANK"),
    (openmpi_env(0, 0, 0, 2, 4) | {"OMPI_COMM_WORLD_LOCAL_SIZE": "4 ranks"},
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    (slurm_env(0, 0, 0, 2, 4) | {"SLURM_PROCID": "N/A"}, "SLURM_PROCID"),
    (slurm_env(0, 0, 0, 2, 4) | {"SLURM_NTASKS": "8x"}, "SLURM_NTASKS"),
    (slurm_env(0, 0, 0, 2, 4) | {"SLURM_LOCALID": "-"}, "SLURM_LOCALID"),
    (slurm_env(0, 0, 0, 2, 4) | {"SLURM_NODEID": "node1"}, "SLURM_NODEID"),
    (slurm_env(0, 0, 0, 2, 4) | {"SLURM_NNODES": "2-4"}, "SLURM_NNODES"),
    (slurm_step_env(0, 0, 0, 2, 4) | {"SLURM_STEP_NUM_TASKS": "?"}, "SLURM_STEP_NUM_TASKS"),
    (slurm_step_env(0, 0, 0, 2, 4) | {"SLURM_STEP_NUM_NODES": "two"}, "SLURM_STEP_NUM_NODES"),
    (pmi_env(0, 0, 0, 2, 4) | {"PMI_RANK": "1.5"}, "PMI_RANK"),
    (pmi_env(0, 0, 0, 2, 4) | {"PMI_SIZE": ""}, "PMI_SIZE"),
    (pmi_env(0, 0, 0, 2, 4) | {"MPI_LOCALRANKID": "x"}, "MPI_LOCALRANKID"),
    (pmi_env(0, 0, 0, 2, 4) | {"MPI_LOCALNRANKS": "x"}, "MPI_LOCALNRANKS"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_non_integer_value_names_the_variable(env: Env, name: str) -> None:
    with pytest.raises(WorldError, match=f"{name}=.*is not an integer") as info:
        detect(env)
    assert repr(env[name]) in str(info.value)


@pytest.mark.parametrize("env", [
    torchrun_env(0, 0, 0, 2, 4) | {"WORLD_SIZE": "0"},
    torchrun_env(0, 0, 0, 2, 4) | {"RANK": "-1"},
    torchrun_env(0, 0, 0, 2, 4) | {"LOCAL_RANK": "-1"},
    openmpi_env(0, 0, 0, 2, 4) | {"OMPI_COMM_WORLD_SIZE": "0"},
    slurm_env(0, 0, 0, 2, 4) | {"SLURM_NTASKS": "0"},
    slurm_env(0, 0, 0, 2, 4) | {"SLURM_TASKS_PER_NODE": "0(x2)"},
    pmi_env(0, 0, 0, 2, 4) | {"PMI_SIZE": "0"},
    pmi_env(0, 0, 0, 2, 4) | {"PMI_RANK": "-3"},
], ids=["torchrun-size0", "torchrun-rank-1", "torchrun-local-1", "openmpi-size0",
        "slurm-ntasks0", "slurm-tasks0", "pmi-size0", "pmi-rank-3"])
def test_zero_sizes_and_negative_ranks_are_refused(env: Env) -> None:
    with pytest.raises(WorldError):
        detect(env)


@pytest.mark.parametrize("env", [
    torchrun_env(0, 0, 0, 2, 4) | {"LOCAL_WORLD_SIZE": "0"},
    openmpi_env(0, 0, 0, 2, 4) | {"OMPI_COMM_WORLD_LOCAL_SIZE": "0"},
    pmi_env(0, 0, 0, 2, 4) | {"MPI_LOCALNRANKS": "0"},
    slurm_step_env(0, 0, 0, 2, 4) | {"SLURM_STEP_NUM_TASKS": "0"},
], ids=["torchrun", "openmpi", "pmi", "slurm-step"])
def test_explicit_zero_size_is_refused_not_treated_as_absent(env: Env) -> None:
    """A size variable that is present and says 0 is inconsistent: it must not silently fall
    back to the default (world size, or the job-level SLURM_NTASKS) as if it were unset."""
    with pytest.raises(WorldError):
        detect(env)


# --- World itself --------------------------------------------------------------------------------

NUMBERS = ("rank", "world_size", "local_rank", "local_world_size", "node_rank", "num_nodes")


def _by_keyword(args: tuple[int, ...]) -> World:
    numbers: dict[str, Any] = dict(zip(NUMBERS, args, strict=True))
    return World(**numbers)


@pytest.mark.parametrize("args, match", [
    ((0, 0, 0, 1, 0, 1), "sizes must be >= 1"),
    ((0, 1, 0, 0, 0, 1), "sizes must be >= 1"),
    ((0, 1, 0, 1, 0, 0), "sizes must be >= 1"),
    ((4, 4, 0, 2, 1, 2), "rank 4 is not below world size 4"),
    ((-1, 4, 0, 2, 0, 2), "rank -1 is not below world size 4"),
    ((1, 4, 2, 2, 0, 2), "local rank 2 is not below local world size 2"),
    ((1, 4, -1, 2, 0, 2), "local rank -1 is not below local world size 2"),
    ((3, 4, 1, 2, 2, 2), "node rank 2 is not below the number of nodes 2"),
    ((3, 6, 1, 2, 1, 2), "2 nodes x 2 ranks per node != world size 6"),
    ((1, 4, 0, 2, 1, 2), "rank 1 is on node 1, which is not block placement"),
    ((2, 4, 0, 2, 0, 2), "rank 2 is on node 0, which is not block placement.*--map-by"),
    ((7, 8, 3, 4, 0, 2), "not block placement"),
])
def test_world_constructor_validates(args: tuple[int, ...], match: str) -> None:
    with pytest.raises(WorldError, match=match):
        _by_keyword(args)


@pytest.mark.parametrize("args", [
    (0, 1, 0, 1, 0, 1), (1, 4, 0, 2, 0, 2), (3, 4, 0, 2, 1, 2), (7, 8, 0, 4, 1, 2),
])
def test_world_constructor_accepts_block_layouts(args: tuple[int, ...]) -> None:
    world = _by_keyword(args)
    assert (world.rank, world.world_size, world.local_rank, world.local_world_size,
            world.node_rank, world.num_nodes) == args
    assert world.launcher == "single"


def test_world_takes_its_numbers_by_keyword_only() -> None:
    with pytest.raises(TypeError):
        World(0, 1, 0, 1, 0, 1)  # type: ignore[call-arg]


def test_world_single_is_the_one_process_job() -> None:
    world = World.single()
    assert (world.rank, world.world_size, world.local_rank, world.local_world_size,
            world.node_rank, world.num_nodes, world.launcher) == (0, 1, 0, 1, 0, 1, "single")
    assert not world.is_distributed and world.is_node_leader


def test_world_constructor_message_names_the_launcher() -> None:
    with pytest.raises(WorldError, match="^openmpi variables: rank 4"):
        World(rank=4, world_size=4, local_rank=0, local_world_size=4, node_rank=0, num_nodes=1,
              launcher="openmpi")


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda nl: f"{nl[0]}x{nl[1]}")
def test_one_node_leader_per_node_in_block_placement(layout: tuple[int, int]) -> None:
    nodes, per_node = layout
    worlds = [World(rank=r, world_size=nodes * per_node, local_rank=lr, local_world_size=per_node,
                    node_rank=k, num_nodes=nodes)
              for r, lr, k in _positions(nodes, per_node)]
    for k in range(nodes):
        on_node = [w for w in worlds if w.node_rank == k]
        assert [w.rank for w in on_node] == list(range(k * per_node, (k + 1) * per_node))
        assert [w.is_node_leader for w in on_node] == [True] + [False] * (per_node - 1)


@pytest.mark.parametrize("num_nodes, node_rank", [(1, 0), (3, 0), (3, 2), (8, 5)])
def test_with_nodes(num_nodes: int, node_rank: int) -> None:
    world = World(rank=3, world_size=4, local_rank=1, local_world_size=2, node_rank=1, num_nodes=2,
                  launcher="torchrun").with_nodes(num_nodes, node_rank)
    assert world == World(rank=node_rank, world_size=num_nodes, local_rank=0, local_world_size=1,
                          node_rank=node_rank, num_nodes=num_nodes)
    assert world.launcher == "explicit"
    assert world.is_node_leader


@pytest.mark.parametrize("num_nodes, node_rank", [(3, 3), (3, -1), (0, 0)])
def test_with_nodes_out_of_range(num_nodes: int, node_rank: int) -> None:
    with pytest.raises(WorldError):
        World().with_nodes(num_nodes, node_rank)


def test_world_is_frozen() -> None:
    world = World(rank=1, world_size=2, local_rank=1, local_world_size=2, node_rank=0, num_nodes=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        world.rank = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        world.launcher = "x"  # type: ignore[misc]
    assert world.rank == 1


def test_world_equality_and_hash_ignore_launcher() -> None:
    a = World(rank=5, world_size=8, local_rank=1, local_world_size=4, node_rank=1, num_nodes=2,
              launcher="torchrun")
    b = World(rank=5, world_size=8, local_rank=1, local_world_size=4, node_rank=1, num_nodes=2,
              launcher="slurm")
    c = World(rank=4, world_size=8, local_rank=0, local_world_size=4, node_rank=1, num_nodes=2,
              launcher="torchrun")
    assert a == b
    assert hash(a) == hash(b)
    assert a != c
    assert len({a, b, c}) == 2
    assert {a: "x"}[b] == "x"


def test_same_world_from_every_launcher() -> None:
    worlds = {name: detect(make_env(5, 1, 2, 3, 2)) for name, (make_env, _) in LAUNCHERS.items()}
    assert len(set(worlds.values())) == 1
    assert {w.launcher for w in worlds.values()} == {"torchrun", "openmpi", "slurm", "pmi"}
