"""Where srun's tasks meet with no MPI: the step's first node and a port from the job and step
ids, the same in every task, the fan-out copiers' apart from the trainer's."""

from __future__ import annotations

import pytest

from imgprep.job.rendezvous import (
    RendezvousError,
    copier_rendezvous,
    first_host,
    rendezvous,
    slurm_rendezvous,
)
from imgprep.job.world import World


@pytest.mark.parametrize(("nodelist", "host"), [
    ("node0", "node0"),
    ("node[0-1]", "node0"),
    ("gpu[07-09,12],cpu1", "gpu07"),
    ("a1,b2", "a1"),
    ("rack[1-2]-n[01-03]", "rack1-n01"),
    ("x[3]", "x3"),
])
def test_the_first_host_of_a_slurm_node_list(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


def _slurm(rank: int) -> World:
    return World(rank=rank, world_size=4, local_rank=rank % 2, local_world_size=2,
                 node_rank=rank // 2, num_nodes=2, launcher="slurm")


ENV = {"SLURM_STEP_NODELIST": "node[0-1]", "SLURM_JOB_ID": "4711", "SLURM_STEP_ID": "2"}


def test_every_srun_task_computes_the_same_meeting_point_without_mpi() -> None:
    points = {rendezvous(_slurm(r), ENV) for r in range(4)}
    assert len(points) == 1
    (point,) = points
    assert point.addr == "node0" and 15000 <= point.port < 35000
    assert "srun" in point.via


def test_steps_and_the_copiers_get_ports_of_their_own() -> None:
    trainer = slurm_rendezvous(_slurm(0), ENV)
    next_step = slurm_rendezvous(_slurm(0), {**ENV, "SLURM_STEP_ID": "3"})
    copiers = copier_rendezvous(_slurm(1), env=ENV)
    assert len({trainer.port, next_step.port, copiers.port}) == 3
    assert copiers.addr == "node0" and not copiers.store_listens


def test_explicit_master_variables_still_win_under_srun() -> None:
    env = {**ENV, "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500"}
    assert (rendezvous(_slurm(3), env).addr, rendezvous(_slurm(3), env).port) == ("10.1.2.3",
                                                                                  29500)


def test_without_a_node_list_the_error_says_what_to_set() -> None:
    with pytest.raises(RendezvousError, match="MASTER_ADDR"):
        rendezvous(_slurm(1), {"SLURM_JOB_ID": "4711"})
