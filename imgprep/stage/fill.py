"""The copier's work, under the node's lock: bring ``dst`` up to the plan.

In order: void the done-markers, sweep what a killed run left, find what ``dst`` lacks (its bad
copies removed), check the free space, fetch the missing shards (imgprep.stage.copier: each
copy checked against the manifest before its rename, so a rerun skips what is there; or, with
fan-out, this node's partition share from the file server and the rest from the other nodes,
imgprep.stage.fanout), then for each split its sample index, its DALI indexes, its error log,
its node-local manifest and, last, its done-marker (imgprep.stage.markers).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from imgprep.errors import OutputError, StageError
from imgprep.fsutil import fsync_dir, sweep_tmp
from imgprep.job.assign import partition_owners
from imgprep.job.rendezvous import Rendezvous
from imgprep.job.world import World
from imgprep.shards.dali import sync_shards
from imgprep.shards.manifest import ShardEntry, write_manifest
from imgprep.stage.copier import copy_all, copy_index, present
from imgprep.stage.fanout import FanoutJob, fan_out
from imgprep.stage.localdisk import check_space, drop_stale, remove, why, write_small
from imgprep.stage.markers import void_markers, vouched, write_marker
from imgprep.stage.nodelock import state_dir
from imgprep.stage.options import StageOptions
from imgprep.stage.plan import PlannedShard, SplitPlan, node_manifest, planned_shards
from imgprep.stage.pool import Progress, parallel
from imgprep.stage.remote import source_of
from imgprep.stage.schedule import Shard

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Moved:
    """What the copier did: shards copied and already there; bytes from the file server and
    (fan-out) received from and sent to other nodes."""

    copied: int = 0
    skipped: int = 0
    read: int = 0
    received: int = 0
    sent: int = 0
    moving_s: float = 0.0  # fan-out: seconds from all nodes joined to all finished


def find_missing(plan: Sequence[SplitPlan], opts: StageOptions, node: int,
                 stop: threading.Event) -> list[PlannedShard]:
    """Void the markers, sweep what a killed run left, and find the shards ``dst`` lacks
    (their bad copies removed)."""
    dst = opts.dst
    trusted = {sp.split for sp in plan if vouched(sp, dst)}
    void_markers(plan, dst, node)  # before anything in dst changes
    for folder in (dst, state_dir(dst)):
        sweep_tmp(folder)
    for sp in plan:
        drop_stale(dst, sp.split, {e.name for e in sp.needed})
    shards = planned_shards(plan)

    def there(s: PlannedShard) -> bool:
        return present(dst / s.entry.name, s.entry, opts.verify, opts.chunk,
                       s.plan.split in trusted, stop)

    found = parallel(there, shards, opts.jobs, stop)
    todo = [s for s, ok in zip(shards, found, strict=True) if not ok]
    for s in todo:
        remove(dst / s.entry.name, node)  # a bad copy: free its space before the check
    return todo


def _fan_out_job(plan: Sequence[SplitPlan], todo: Sequence[PlannedShard], opts: StageOptions,
                 world: World) -> FanoutJob:
    """Every shard and sample index of the plan, in the same order on every node, with its
    owner (the node that reads it from the file server: its partition owner for a shard,
    node 0 for an index) and whether ``dst`` holds it."""
    lacking = {s.entry.name for s in todo}
    shards: list[Shard] = []
    have: list[bool] = []
    for sp in plan:
        owners = partition_owners([e.samples for e in sp.manifest.shards], world.num_nodes,
                                  opts.seed)
        for e, owner in zip(sp.needed, owners, strict=True):
            shards.append(Shard(entry=e, source=sp.origin.where(e.name), manifest=sp.source,
                                owner=owner))
            have.append(e.name not in lacking)
    for sp in plan:
        if (ix := sp.manifest.index) is not None:
            entry = ShardEntry(name=ix.name, samples=0, bytes=ix.bytes, sha256=ix.sha256)
            shards.append(Shard(entry=entry, source=sp.origin.where(entry.name),
                                manifest=sp.source, owner=0))
            have.append(present(opts.dst / ix.name, entry, "sha256", opts.chunk, False,
                                threading.Event()))
    plan_key = [[sp.sha256 for sp in plan], opts.seed, world.num_nodes]
    return FanoutJob(
        origin=plan[0].origin if plan else source_of(opts.src, opts.stall),
        shards=shards,
        have=have,
        digest=hashlib.sha256(json.dumps(plan_key).encode()).hexdigest(),
        dst=opts.dst,
        me=world.node_rank,
        n=world.num_nodes,
        jobs=opts.jobs,
        timeout=opts.timeout,
        stall=opts.stall,
    )


def _fan_out(plan: Sequence[SplitPlan], todo: Sequence[PlannedShard], opts: StageOptions,
             world: World, rv: Rendezvous, tick: Progress) -> Moved:
    """Give every node every shard and sample index, reading only this node's partition share
    from the file server (imgprep.stage.fanout); each index is read once, by node 0, and
    fanned out like a shard."""
    job = _fan_out_job(plan, todo, opts, world)
    shards = sum(len(sp.needed) for sp in plan)
    indexes_written = job.have[shards:].count(False)
    done = fan_out(job, rv, tick)
    return Moved(copied=done.written - indexes_written, skipped=shards - len(todo),
                 read=done.read, received=done.received, sent=done.sent,
                 moving_s=done.seconds)


def _finish_split(sp: SplitPlan, opts: StageOptions, world: World) -> None:
    """Copy the split's error log, write its node-local manifest, then its done-marker."""
    node = world.node_rank
    dst = opts.dst
    if sp.manifest.error_log:
        log_name = sp.manifest.error_log
        try:
            data = sp.origin.read(log_name)
        except OSError as e:
            raise StageError(f"node {node}: cannot read the error log "
                             f"{sp.origin.where(log_name)} that {sp.source} names "
                             f"({e.strerror}); restore it or reconvert, then rerun") from e
        write_small(dst / log_name, data, node)
    try:
        path = write_manifest(dst, node_manifest(sp, opts, world))
    except OutputError as e:
        raise StageError(f"node {node}: cannot write the manifest in {dst}: "
                         f"{why(e.__cause__ or e)}; free space there or use another --dst, "
                         "then rerun to resume") from e
    write_marker(sp, opts, world, path)


def fill(plan: Sequence[SplitPlan], opts: StageOptions, world: World, rv: Rendezvous | None,
         progress: Progress | None, on_start: Callable[[int], None] | None) -> Moved:
    """The copier's work, under the lock (see the module docstring); ``rv``: where the
    copiers meet for fan-out, None to copy everything from the file server."""
    node = world.node_rank
    stop = threading.Event()
    todo = find_missing(plan, opts, node, stop)
    skipped = sum(len(sp.needed) for sp in plan) - len(todo)
    log.debug("node %d: %d shards to fetch, %d already there", node, len(todo), skipped)
    need = check_space(opts.dst, sum(s.entry.bytes for s in todo), len(todo), node)
    if on_start is not None:
        on_start(need)
    lock = threading.Lock()

    def tick(k: int) -> None:
        if progress is not None:
            with lock:
                progress(k)

    if rv is not None:
        done = _fan_out(plan, todo, opts, world, rv, tick)
    else:
        read = copy_all(todo, opts.dst, opts.verify, opts.chunk, node, tick, opts.jobs,
                        opts.stall)
        done = Moved(copied=len(todo), skipped=skipped, read=read)
    fsync_dir(opts.dst)  # every shard's rename is on disk before a manifest names it
    index_bytes = 0
    for sp in plan:
        if rv is None:  # fan-out moved the indexes with the shards
            index_bytes += copy_index(sp.manifest.index, sp.origin, sp.source, opts.dst,
                                      opts.chunk, node)
        sync_shards(opts.dst, sp.manifest, sp.needed, opts.jobs)  # DALI indexes: made here
        _finish_split(sp, opts, world)
    return replace(done, read=done.read + index_bytes)
