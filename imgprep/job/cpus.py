"""How many CPUs one rank may keep busy: the default worker count of convert, verify and the
loaders.

Three limits apply to a process, and a job on a cluster node usually meets more than one:

- its affinity mask: what ``taskset``/``numactl`` or the launcher's binding leave it
  (``srun --cpu-bind=cores``, Open MPI's ``--bind-to core``/``package``, the default there);
- its cgroup's cpuset: the CPUs of its container or job (``docker --cpuset-cpus``, Slurm's
  ``task/cgroup``), which the affinity mask never exceeds;
- its cgroup's CPU quota: CPU time, not CPUs (``docker --cpus``, a Kubernetes CPU limit). The
  affinity mask still lists every CPU of the machine, so counting the mask alone starts one
  worker per host core and the container is throttled.

``rank_cores`` divides them among the ranks of a node. Ranks that were bound to CPUs of their
own (fewer CPUs in the mask than in the cpuset) share theirs with the ranks bound alike: with
L ranks, a mask of A CPUs out of a cpuset of C means about ``L * A / C`` ranks per mask, one
when each rank is bound to its own cores, L when nobody is bound. Slurm's ``--cpus-per-task``
is taken as given when srun started the ranks. The quota is shared by every rank of the node.

Which CPUs (``plan_cpus``): a rank's share is a run of whole cores of its affinity mask (SMT
siblings kept together, from sysfs), the ``local_rank``-th run where every rank of the node
sees the same mask; the launching process keeps the first core of it (with its siblings),
its workers get the rest (``CpuPlan``). Where the mask does not say which run is whose (ranks
bound several to a mask), or the share is one core, nothing is pinned and the plan says why.
``pin_threads`` narrows every thread of this process; ``allowed_cpus`` (and ``read_limits``)
still answer with the mask the process had before, so that a count made after the pinning is
the count made before it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

_BEFORE_PIN: frozenset[int] | None = None  # this process's mask before pin_threads narrowed it

__all__ = ["CpuLimits", "CpuPlan", "allowed_cpus", "cpu_list", "parse_cpu_list", "pin_threads",
           "plan_cpus", "rank_cores", "read_limits", "unpin_threads"]


@dataclass(frozen=True)
class CpuLimits:
    """What limits this process's CPUs.

    Args:
        affinity: CPUs in the process's affinity mask.
        cpuset: CPUs of its cgroup's cpuset (the affinity when it cannot be read: then no
            rank counts as bound, the safe side).
        quota: the cgroup's CPU-time limit in CPUs (``quota / period``); None when unlimited.
        cpus_per_task: ``SLURM_CPUS_PER_TASK`` when set.
    """

    affinity: int
    cpuset: int
    quota: float | None = None
    cpus_per_task: int | None = None

    def __post_init__(self) -> None:
        if self.affinity < 1 or self.cpuset < 1:
            raise ValueError(f"CPU counts must be >= 1 ({self})")
        if self.quota is not None and not self.quota > 0:
            raise ValueError(f"a CPU quota must be > 0 ({self})")
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise ValueError(f"cpus per task must be >= 1 ({self})")


def rank_cores(limits: CpuLimits, local_ranks: int, slurm_task: bool = False) -> int:
    """The CPUs one of ``local_ranks`` ranks of a node may keep busy (at least one).

    ``slurm_task``: the ranks are Slurm tasks started by srun, so ``cpus_per_task`` is each
    one's share (elsewhere the variable may be left over from the allocation, and is ignored).
    """
    if local_ranks < 1:
        raise ValueError(f"local_ranks must be >= 1, not {local_ranks}")
    mask = min(limits.affinity, limits.cpuset)
    if slurm_task and limits.cpus_per_task is not None:
        share = min(limits.cpus_per_task, mask)
    else:
        share = mask // _sharing(limits, local_ranks)
    if limits.quota is not None:
        share = min(share, math.floor(limits.quota / local_ranks))
    return max(1, share)


def _sharing(limits: CpuLimits, local_ranks: int) -> int:
    """About how many of ``local_ranks`` ranks share this process's mask (module docstring)."""
    mask = min(limits.affinity, limits.cpuset)
    return min(local_ranks, max(1, round(local_ranks * mask / limits.cpuset)))


def parse_cpu_list(text: str) -> int:
    """The number of CPUs in a kernel CPU list such as ``0-3,8,10-11``."""
    count = 0
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if last < first:
            raise ValueError(f"CPU range {part!r} runs backwards")
        count += last - first + 1
    return count


def _cgroups(root: Path) -> dict[str, str]:
    """Controller (``""`` for cgroup v2) -> this process's cgroup path, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    for line in (root / "proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            paths[c] = path
    return paths


def _dirs(mount: Path, path: str) -> list[Path]:
    """The cgroup folder of ``path`` under ``mount`` and its ancestors up to the mount, nearest
    first. Inside a container the path may name a folder the container cannot see: then the
    mount itself is the process's cgroup."""
    here = mount / path.lstrip("/")
    if not here.is_dir():
        return [mount]
    out = [here]
    while here != mount and mount in here.parents:
        here = here.parent
        out.append(here)
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _quota_v2(text: str) -> float | None:
    limit, _, period = text.partition(" ")
    return None if limit == "max" else int(limit) / int(period or 100000)


def _quota_v1(folder: Path) -> float | None:
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    if quota is None or period is None or int(quota) <= 0 or int(period) <= 0:
        return None
    return int(quota) / int(period)


def _cgroup_limits(root: Path) -> tuple[int | None, float | None]:
    """(cpuset size, quota in CPUs) of this process's cgroup; None where none is set or read.
    A quota anywhere up the tree limits this cgroup too, so the smallest one counts."""
    paths = _cgroups(root)
    base = root / "sys/fs/cgroup"
    cpuset: int | None = None
    quotas: list[float | None] = []
    if "cpu" in paths or "cpuset" in paths:  # cgroup v1: one hierarchy per controller
        for d in _dirs(base / "cpu", paths.get("cpu", "/")):
            quotas.append(_quota_v1(d))
        for d in _dirs(base / "cpuset", paths.get("cpuset", "/")):
            text = _read(d / "cpuset.effective_cpus") or _read(d / "cpuset.cpus")
            if text:
                cpuset = parse_cpu_list(text)
                break
    elif "" in paths:  # cgroup v2: one unified hierarchy
        for d in _dirs(base, paths[""]):
            text = _read(d / "cpu.max")
            quotas.append(_quota_v2(text) if text else None)
            if cpuset is None and (text := _read(d / "cpuset.cpus.effective") or ""):
                cpuset = parse_cpu_list(text)
    found = [q for q in quotas if q is not None and q > 0]
    return cpuset, min(found) if found else None


def read_limits(root: Path = Path("/"), env: Mapping[str, str] | None = None) -> CpuLimits:
    """This process's CPU limits, read from the kernel (``root`` holds ``proc`` and ``sys``;
    tests point it at a fake tree). A cgroup file that cannot be read or parsed is no limit."""
    env = os.environ if env is None else env
    affinity = len(allowed_cpus())
    try:
        cpuset, quota = _cgroup_limits(root)
    except (OSError, ValueError):
        cpuset, quota = None, None
    per_task = env.get("SLURM_CPUS_PER_TASK", "")
    return CpuLimits(
        affinity=affinity,
        cpuset=max(cpuset or affinity, affinity),
        quota=quota,
        cpus_per_task=int(per_task) if per_task.isdigit() and int(per_task) > 0 else None,
    )


# -- which CPUs: the launching process's core and its workers' (module docstring)

@dataclass(frozen=True)
class CpuPlan:
    """Where a rank's processes run: ``main``, the CPUs its launching process (and every
    thread it has: the training loop, CUDA's) keeps to itself; ``workers``, those its loader's
    workers are pinned to. Disjoint, both non-empty (a share of one core has no plan)."""

    main: frozenset[int]
    workers: frozenset[int]

    def __post_init__(self) -> None:
        if not self.main or not self.workers or self.main & self.workers:
            raise ValueError(f"a CPU plan needs CPUs for both sides, apart ({self})")

    def line(self, rank: int) -> str:
        """The plan in one line, as the trainer prints it at start."""
        kept = f"CPU {cpu_list(self.main)}" if len(self.main) == 1 else \
            f"CPUs {cpu_list(self.main)} (one core and its SMT siblings)"
        many = len(self.workers) > 1
        return (f"cpus: rank {rank} keeps {kept} for its own process; its loader's workers run "
                f"on the other {len(self.workers)} of its share, CPU{'s' if many else ''} "
                f"{cpu_list(self.workers)}")


def cpu_list(cpus: Collection[int]) -> str:
    """``cpus`` as a kernel CPU list, ``0-3,8`` (what ``parse_cpu_list`` reads)."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _cpu_set(text: str) -> frozenset[int]:
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


def core_of(cpu: int, root: Path = Path("/")) -> frozenset[int]:
    """``cpu`` and its SMT siblings (the CPUs of its core), from sysfs; ``{cpu}`` alone
    where sysfs does not say."""
    topology = root / f"sys/devices/system/cpu/cpu{cpu}/topology"
    for name in ("core_cpus_list", "thread_siblings_list"):
        text = _read(topology / name)
        if text:
            try:
                return _cpu_set(text) | {cpu}
            except ValueError:
                break
    return frozenset({cpu})


def plan_cpus(limits: CpuLimits, allowed: Collection[int], local_rank: int, local_ranks: int,
              slurm_task: bool = False, root: Path = Path("/")) -> CpuPlan | str:
    """Where rank ``local_rank`` of ``local_ranks`` on its node runs its process and its
    workers, within ``allowed`` (its affinity mask): a ``CpuPlan``, or why there is none, in
    words the trainer prints after ``cpus: not pinned:`` (module docstring)."""
    share = rank_cores(limits, local_ranks, slurm_task)
    one_core = (f"this rank may use {share} CPU{'' if share == 1 else 's'} (one core): its "
                "workers share it with the process")
    if share < 2:
        return one_core
    cores = {c: core_of(c, root) & frozenset(allowed) for c in allowed}
    mask = sorted(allowed, key=lambda c: (min(cores[c]), c))  # siblings side by side
    runs = len(mask) // share
    if runs >= local_ranks:
        run = local_rank % runs
    elif _sharing(limits, local_ranks) == 1:
        run = 0  # this rank's mask is its own
    else:
        return (f"{local_ranks} ranks share a mask of {len(mask)} CPUs, which does not say "
                "which are whose; bind each rank to its own cores (srun --cpu-bind=cores, "
                "mpirun --map-by ppr:N:node:PE=M)")
    mine = mask[run * share:(run + 1) * share]
    main = cores[mine[0]] & frozenset(mine)
    workers = frozenset(mine) - main
    if not workers:
        return one_core
    return CpuPlan(main=main, workers=workers)


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may use: its affinity mask as it was before ``pin_threads``
    narrowed it (all of ``os.cpu_count()`` where there are no masks)."""
    if _BEFORE_PIN is not None:
        return _BEFORE_PIN
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def pin_threads(cpus: Collection[int]) -> bool:
    """Narrow every thread of this process (and so the threads and processes they start
    later) to ``cpus``; ``allowed_cpus`` keeps answering with the mask from before. False
    where the kernel refuses (the CPUs are not this process's), with nothing changed."""
    global _BEFORE_PIN
    if not hasattr(os, "sched_setaffinity"):
        return False
    before = allowed_cpus()
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        return False
    _BEFORE_PIN = before
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):
            continue  # a thread that ended meanwhile, or one that is not ours to move
    return True


def unpin_threads() -> None:
    """Every thread of this process back on the mask it had before ``pin_threads``."""
    global _BEFORE_PIN
    if _BEFORE_PIN is None:
        return
    before, _BEFORE_PIN = _BEFORE_PIN, None
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, before)
        except (ProcessLookupError, PermissionError):
            continue
