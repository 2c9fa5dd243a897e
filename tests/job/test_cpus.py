"""The CPUs a rank may keep busy: affinity, cgroup cpuset and quota, shared among local ranks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from imgprep.job import world as world_mod
from imgprep.job.cpus import CpuLimits, parse_cpu_list, rank_cores, read_limits
from imgprep.job.world import World
from loaders.config import worker_count


@pytest.mark.parametrize(("limits", "ranks", "slurm", "cores"), [
    # nobody bound: the ranks share the node's CPUs
    (CpuLimits(64, 64), 8, False, 8),
    (CpuLimits(16, 16), 1, False, 16),
    # srun --cpu-bind=cores / mpirun --map-by ppr:8:node:PE=8: each rank has its own 8
    (CpuLimits(8, 64), 8, False, 8),
    # mpirun's default for more than 2 ranks, --bind-to package: 4 ranks per 32-CPU socket
    (CpuLimits(32, 64), 8, False, 8),
    # mpirun --bind-to core with 2 ranks: one CPU each
    (CpuLimits(1, 64), 2, False, 1),
    # a Kubernetes/docker CPU limit of 8 on a 128-CPU host: the mask lists all 128
    (CpuLimits(128, 128, quota=8.0), 1, False, 8),
    (CpuLimits(128, 128, quota=16.0), 8, False, 2),
    (CpuLimits(128, 128, quota=2.5), 1, False, 2),
    # srun --cpus-per-task=8 without binding: Slurm's own figure
    (CpuLimits(64, 64, cpus_per_task=8), 8, True, 8),
    # the same variable left over from salloc, ranks started by torchrun: ignored
    (CpuLimits(64, 64, cpus_per_task=8), 8, False, 8),
    (CpuLimits(16, 16, cpus_per_task=16), 8, False, 2),
    # more ranks than CPUs, or a quota below one CPU per rank: still one
    (CpuLimits(4, 4), 8, False, 1),
    (CpuLimits(64, 64, quota=0.5), 1, False, 1),
])
def test_rank_cores_shares_the_limits_among_the_ranks_of_a_node(
        limits: CpuLimits, ranks: int, slurm: bool, cores: int) -> None:
    assert rank_cores(limits, ranks, slurm) == cores


def test_cpu_limits_are_validated() -> None:
    for bad in ({"affinity": 0, "cpuset": 4}, {"affinity": 2, "cpuset": 4, "quota": 0.0},
                {"affinity": 2, "cpuset": 4, "cpus_per_task": 0}):
        with pytest.raises(ValueError):
            CpuLimits(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="local_ranks"):
        rank_cores(CpuLimits(4, 4), 0)


def test_parse_cpu_list() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == 7
    assert parse_cpu_list("5") == 1
    with pytest.raises(ValueError):
        parse_cpu_list("3-1")


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_cgroup_v2_quota_is_the_smallest_up_the_tree_and_cpuset_the_nearest(
        tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "proc/self/cgroup": "0::/job/step\n",
        "sys/fs/cgroup/cpu.max": "max 100000\n",
        "sys/fs/cgroup/job/cpu.max": "400000 100000\n",
        "sys/fs/cgroup/job/cpuset.cpus.effective": "0-31\n",
        "sys/fs/cgroup/job/step/cpu.max": "max 100000\n",
        "sys/fs/cgroup/job/step/cpuset.cpus.effective": "0-7,16-23\n",
    })
    limits = read_limits(root, env={})
    assert limits.quota == 4.0
    assert limits.cpuset == max(16, limits.affinity)
    assert limits.cpus_per_task is None


def test_cgroup_v2_inside_a_container_reads_the_mount_itself(tmp_path: Path) -> None:
    # the container sees its own cgroup at the mount, under a path it cannot see
    root = _tree(tmp_path, {
        "proc/self/cgroup": "0::/kubepods/burstable/pod1234/abc\n",
        "sys/fs/cgroup/cpu.max": "200000 100000\n",
    })
    assert read_limits(root, env={}).quota == 2.0


def test_cgroup_v1_quota_and_cpuset(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "proc/self/cgroup": "4:cpu,cpuacct:/docker/abc\n3:cpuset:/docker/abc\n0::/\n",
        "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n",
        "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
        "sys/fs/cgroup/cpu/docker/abc/cpu.cfs_quota_us": "150000\n",
        "sys/fs/cgroup/cpu/docker/abc/cpu.cfs_period_us": "100000\n",
        "sys/fs/cgroup/cpuset/docker/abc/cpuset.effective_cpus": "0-63\n",
    })
    limits = read_limits(root, env={"SLURM_CPUS_PER_TASK": "6"})
    assert limits.quota == 1.5
    assert limits.cpuset == max(64, limits.affinity)
    assert limits.cpus_per_task == 6


def test_unreadable_or_odd_cgroup_files_are_no_limit(tmp_path: Path) -> None:
    """And no cpuset beyond the affinity: without one no rank counts as bound to its own."""
    bare = read_limits(tmp_path, env={})  # no /proc at all
    assert bare.quota is None and bare.cpuset == bare.affinity
    root = _tree(tmp_path / "odd", {
        "proc/self/cgroup": "0::/\n",
        "sys/fs/cgroup/cpu.max": "lots 100000\n",
    })
    limits = read_limits(root, env={"SLURM_CPUS_PER_TASK": "many"})
    assert limits.quota is None and limits.cpus_per_task is None
    assert limits.cpuset == limits.affinity == len(os.sched_getaffinity(0))


def test_auto_workers_follow_a_container_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank in a container limited to 4 CPUs on a 128-CPU host: 3 workers, not 127."""
    monkeypatch.setattr(world_mod, "read_limits", lambda: CpuLimits(128, 128, quota=4.0))
    assert World().cores_per_rank() == 4
    assert worker_count("auto", World()) == 3
    monkeypatch.setattr(world_mod, "read_limits", lambda: CpuLimits(64, 64, cpus_per_task=8))
    slurm = World(rank=3, world_size=8, local_rank=3, local_world_size=8, node_rank=0, num_nodes=1,
                  launcher="slurm")
    assert worker_count("auto", slurm) == 7
    assert worker_count("auto", World(rank=3, world_size=8, local_rank=3, local_world_size=8,
                                      node_rank=0, num_nodes=1, launcher="torchrun")) == 7


def test_this_machine_counts_its_own_affinity() -> None:
    cores = len(os.sched_getaffinity(0))
    limits = read_limits()
    assert limits.affinity == cores
    assert World().cores_per_rank() <= cores
    assert World(rank=0, world_size=2 * cores, local_rank=0, local_world_size=2 * cores,
                 node_rank=0, num_nodes=1).cores_per_rank() == 1
