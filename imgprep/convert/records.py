"""Task records and how ranks share a conversion.

A finished task leaves a small JSON record under ``<out>/.imgprep/<split>/``, written after
its output is renamed into place; ``load_done`` trusts a record only when it belongs to the
same plan and the files it names still verify, so a rerun redoes exactly what is missing.

Under mpirun, srun or torchrun every rank computes the same plan and converts only its
share (``assigned_tasks``): in ``shared`` mode all ranks split all tasks into one folder; in
``partition`` mode node k converts the shards its ranks will read into its node-local folder.
The finaliser (rank 0, or each node's local rank 0 in partition mode) collects the other
ranks' records (``wait_for_records``, with a timeout) and writes the manifest, so the output
is byte-identical to a single-process run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from imgprep.convert import outdir
from imgprep.convert.errorlog import (
    ErrorRecord,
    WarningRecord,
    error_log_path,
    warning_log_path,
)
from imgprep.convert.options import ConvertOptions
from imgprep.convert.tasks import ListedImage, Plan, Task, TaskResult, check_folder
from imgprep.errors import WaitTimeout
from imgprep.fsutil import sha256_file, sweep_tmp, write_json_atomic
from imgprep.job.assign import balanced_split, node_shards
from imgprep.job.world import World
from imgprep.shards.indexing import layout_path
from imgprep.shards.manifest import SHARD_NAME_RE, NodeSection

WAIT_POLL_S = 0.5
log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Assignment:
    """A rank's tasks: those it converts (``mine``) and those its output folder must end up
    holding (``held``: every task in shared mode, its node's in partition mode)."""

    mine: list[Task]
    held: list[Task]


def _record_json(res: TaskResult) -> dict[str, Any]:
    return {"index": res.index, "name": res.name, "fingerprint": res.fingerprint,
            "samples": res.samples, "bytes": res.bytes, "sha256": res.sha256, "sums": res.sums,
            "stats_images": res.stats_images, "errors": [e.to_json() for e in res.errors],
            "warnings": [w.to_json() for w in res.warnings],
            "files": [list(f) for f in res.files]}


def _result_of(rec: dict[str, Any]) -> TaskResult | None:
    """The result a decoded record holds, or None when it is not a whole record (one
    written before records held warnings is redone)."""
    try:
        return TaskResult(
            index=rec["index"], name=rec["name"], fingerprint=rec["fingerprint"],
            samples=rec["samples"], bytes=rec["bytes"], sha256=rec["sha256"], sums=rec["sums"],
            stats_images=rec["stats_images"],
            errors=tuple(ErrorRecord.from_json(e) for e in rec["errors"]),
            warnings=tuple(WarningRecord.from_json(w) for w in rec["warnings"]),
            files=tuple(ListedImage(*f) for f in rec["files"]), resumed=True)
    except (KeyError, TypeError, ValueError):
        return None


def write_record(plan: Plan, res: TaskResult) -> None:
    """The record of a task whose output is in place (what a rerun may skip)."""
    # Records are verified against the files before any reuse, so they need no fsync.
    rec = {**_record_json(res), "transform_version": plan.transform_version}
    write_json_atomic(plan.record_path(plan.tasks[res.index]), rec, durable=False)


def load_done(plan: Plan, task: Task, checksum: bool = True) -> TaskResult | None:
    """The record of ``task`` if it finished under the same plan and its files still verify.

    ``checksum=False`` checks sizes only: for collecting other ranks' fresh work, where
    re-reading every shard over the file server would double the I/O.
    """
    try:
        rec = json.loads(plan.record_path(task).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("fingerprint") != plan.fingerprint:
        return None
    if rec.get("index") != task.index or rec.get("name") != task.name:
        return None
    res = _result_of(rec)
    if res is None:
        return None
    out = plan.opts.out
    try:
        if plan.opts.format == "shards":
            p = out / task.name
            if p.stat().st_size != res.bytes or (checksum and sha256_file(p) != res.sha256):
                return None
        else:
            for rel, _label, nbytes, sha in res.files:
                if not checksum:
                    if (out / rel).stat().st_size != nbytes:
                        return None
                    continue
                data = (out / rel).read_bytes()
                if len(data) != nbytes or hashlib.sha256(data).hexdigest() != sha:
                    return None
            if plan.wants_mean_image and not plan.mean_path(task).is_file():
                return None
    except OSError:
        return None
    return res


def assigned_tasks(plan: Plan, world: World) -> Assignment:
    """The tasks ``world.rank`` converts and those its output folder must end up holding.

    shared: all ranks split all tasks, balanced by samples, into one shared folder.
    partition: node k converts exactly the shards ``assign.node_shards`` gives it (the ones
    its ranks will read), split over its local ranks, into its node-local folder.
    """
    tasks = list(plan.tasks)
    if not world.is_distributed:
        return Assignment(mine=tasks, held=tasks)
    weights = [len(t.items) for t in tasks]
    if plan.opts.mode == "partition":
        node = node_shards(weights, world.num_nodes, "partition", plan.opts.seed)[world.node_rank]
        mine = balanced_split(weights, world.local_world_size, node)[world.local_rank]
        return Assignment(mine=[tasks[i] for i in mine], held=[tasks[i] for i in node])
    mine = balanced_split(weights, world.world_size, range(len(tasks)))[world.rank]
    return Assignment(mine=[tasks[i] for i in mine], held=tasks)


def is_finaliser(opts: ConvertOptions, world: World) -> bool:
    """Rank 0 writes the manifest (local rank 0 of each node in partition mode)."""
    return world.local_rank == 0 if opts.mode == "partition" else world.rank == 0


def wait_for_records(plan: Plan, tasks: list[Task], world: World) -> list[TaskResult]:
    """Collect other ranks' finished tasks, polling their records until ``wait_timeout``."""
    deadline = time.monotonic() + plan.opts.wait_timeout
    found: dict[int, TaskResult] = {}
    while True:
        for t in tasks:
            if t.index not in found and (r := load_done(plan, t, checksum=False)) is not None:
                found[t.index] = r
        missing = [t.name for t in tasks if t.index not in found]
        if not missing:
            return list(found.values())
        if time.monotonic() > deadline:
            raise WaitTimeout(
                f"rank {world.rank}: waited {plan.opts.wait_timeout:.0f} s for {len(missing)} "
                f"shards from the other ranks (first: {', '.join(missing[:3])}) in "
                f"{plan.opts.out}; check that every rank is running, then rerun the whole job "
                "to resume"
            )
        time.sleep(WAIT_POLL_S)


def node_info(plan: Plan, world: World) -> NodeSection | None:
    if plan.opts.mode != "partition" or not world.is_distributed:
        return None
    # The whole set's shards with their planned sample counts: loaders on any node compute
    # every node's share from them (exact unless a node lost images to errors).
    return NodeSection(world.node_rank, world.num_nodes, "partition", plan.opts.seed,
                       sum(len(t.items) for t in plan.tasks), len(plan.tasks),
                       tuple((t.name, len(t.items)) for t in plan.tasks))


def prepare_folder(plan: Plan, world: World, held: list[Task]) -> None:
    """The finaliser's clean-up before converting: a split that ``--overwrite`` replaces
    (logged as a warning), leftovers of this split (temporary files, shards no longer
    planned, another format's files); other splits' files are never touched."""
    opts = plan.opts
    replaced = check_folder(plan)
    if replaced is not None:
        log.warning(outdir.remove_split(opts.out, replaced, plan.split))
    for rec in outdir.other_transforms(plan.state_dir, plan.transform_version):
        rec.unlink(missing_ok=True)  # --overwrite: another transform version's tasks go
    # Other ranks may be writing their tasks' temporary files right now: keep those.
    busy = {t.name for t in plan.tasks} if world.is_distributed else set()
    sweep_tmp(opts.out, busy | outdir.other_tmp_files(opts.out, plan.split))
    sweep_tmp(plan.state_dir, {f"{n}.json" for n in busy} | {f"{n}.mean.npy" for n in busy}
              | {layout_path(plan.state_dir, n).name for n in busy})
    other = "list" if opts.format == "shards" else "shards"
    keep = {error_log_path(opts.out, plan.split).name,
            warning_log_path(opts.out, plan.split).name, f"{plan.split}.json"}
    outdir.remove_format(opts.out, plan.split, other, keep)
    drop_stale_outputs(plan, {t.name for t in held})


def drop_stale_outputs(plan: Plan, keep: set[str]) -> int:
    """Remove shards and records of this split that the folder must not hold (a rerun with
    fewer shards; another node's shards): nothing outside the manifest may look like data."""
    stale = [p for p in plan.opts.out.glob(f"{plan.split}-*.tar")
             if SHARD_NAME_RE.match(p.name) and p.name not in keep]
    stale += [p for p in plan.state_dir.glob("*.json") if p.stem not in keep]
    stale += [p for p in plan.state_dir.glob("*.mean.npy")
              if p.name.removesuffix(".mean.npy") not in keep]
    for p in stale:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    return len(stale)
