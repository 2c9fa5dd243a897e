"""Which CPUs a rank's process keeps and which its loader's workers get (``plan_cpus``), and
pinning every thread of a process while the count it was sized by stays the same."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from imgprep.job.cpus import (
    CpuLimits,
    CpuPlan,
    allowed_cpus,
    cpu_list,
    parse_cpu_list,
    pin_threads,
    plan_cpus,
    read_limits,
    unpin_threads,
)


def smt(root: Path, cores: int) -> Path:
    """A sysfs of ``cores`` cores of two threads each: CPU c and c + cores are siblings."""
    for c in range(2 * cores):
        topology = root / f"sys/devices/system/cpu/cpu{c}/topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(f"{c % cores},{c % cores + cores}\n")
    return root


def test_one_rank_keeps_its_first_cpu_and_gives_the_rest_to_its_workers(tmp_path: Path) -> None:
    plan = plan_cpus(CpuLimits(16, 16), range(16), 0, 1, root=tmp_path)  # no sysfs: no SMT
    assert plan == CpuPlan(main=frozenset({0}), workers=frozenset(range(1, 16)))


def test_the_process_keeps_a_whole_core_with_its_smt_sibling(tmp_path: Path) -> None:
    plan = plan_cpus(CpuLimits(16, 16), range(16), 0, 1, root=smt(tmp_path, 8))
    assert isinstance(plan, CpuPlan)
    assert plan.main == {0, 8} and plan.workers == set(range(16)) - {0, 8}
    assert "CPUs 0,8 (one core and its SMT siblings)" in plan.line(0)


def test_unbound_ranks_take_disjoint_runs_of_whole_cores(tmp_path: Path) -> None:
    """Two ranks seeing the same 16 CPUs (8 cores): 8 each, siblings on one side."""
    root = smt(tmp_path, 8)
    plans = [plan_cpus(CpuLimits(16, 16), range(16), r, 2, root=root) for r in range(2)]
    assert all(isinstance(p, CpuPlan) for p in plans)
    mine = [p.main | p.workers for p in plans]  # type: ignore[union-attr]
    assert not mine[0] & mine[1] and len(mine[0]) == len(mine[1]) == 8
    for cpus in mine:
        assert {c % 8 + 8 * k for c in cpus for k in (0, 1)} == cpus  # whole cores


def test_a_rank_bound_to_its_own_cpus_plans_within_them(tmp_path: Path) -> None:
    """srun --cpu-bind=cores: rank 1 of 8 sees CPUs 8-15 of 64."""
    plan = plan_cpus(CpuLimits(8, 64), range(8, 16), 1, 8, root=tmp_path)
    assert plan == CpuPlan(main=frozenset({8}), workers=frozenset(range(9, 16)))


def test_a_quota_narrows_the_share_that_is_pinned(tmp_path: Path) -> None:
    plan = plan_cpus(CpuLimits(16, 16, quota=4.0), range(16), 0, 1, root=tmp_path)
    assert plan == CpuPlan(main=frozenset({0}), workers=frozenset({1, 2, 3}))


@pytest.mark.parametrize(("limits", "allowed", "ranks", "why"), [
    (CpuLimits(32, 64), range(32), 8, "does not say which are whose"),  # --bind-to package
    (CpuLimits(1, 64), [5], 2, "1 CPU (one core)"),
    (CpuLimits(4, 4), range(4), 8, "1 CPU (one core)"),
])
def test_no_plan_where_the_mask_does_not_say_or_one_core_is_all(
        tmp_path: Path, limits: CpuLimits, allowed: range, ranks: int, why: str) -> None:
    plan = plan_cpus(limits, allowed, 0, ranks, root=tmp_path)
    assert isinstance(plan, str) and why in plan


def test_one_core_of_two_threads_is_one_core(tmp_path: Path) -> None:
    plan = plan_cpus(CpuLimits(2, 16), [3, 11], 0, 8, root=smt(tmp_path, 8))
    assert isinstance(plan, str) and "one core" in plan


def test_cpu_lists_are_written_as_the_kernel_writes_them() -> None:
    assert cpu_list({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    assert parse_cpu_list(cpu_list({11, 0, 1, 2, 3, 8, 10})) == 7
    with pytest.raises(ValueError, match="apart"):
        CpuPlan(main=frozenset({1}), workers=frozenset({1, 2}))


def allowed_of(tid: int) -> set[int]:
    status = Path(f"/proc/self/task/{tid}/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list"))
    return set(range(1 << 16)) & {c for part in line.split()[1].split(",")
                                  for c in range(int(part.split("-")[0]),
                                                 int(part.split("-")[-1]) + 1)}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to narrow")
def test_pinning_moves_every_thread_and_the_count_stays_the_one_from_before() -> None:
    before = allowed_cpus()
    count = read_limits().affinity
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()  # a thread started before the pinning moves too
    first = min(before)
    try:
        assert pin_threads({first})
        assert all(allowed_of(int(t)) == {first} for t in os.listdir("/proc/self/task"))
        assert allowed_cpus() == before and read_limits().affinity == count
    finally:
        unpin_threads()
        stop.set()
        other.join()
    assert set(os.sched_getaffinity(0)) == before == allowed_cpus()
