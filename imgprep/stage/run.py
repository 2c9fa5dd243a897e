"""``imgprep stage-to-node``: copy the shards a node needs from the file server to local disk.
The file server is a folder or a URL (imgprep.stage.remote); the rules below hold for both.

One process per node copies (the *copier*); the node's other processes wait for it. No MPI or
process group is involved, so it works under torchrun, mpirun, srun or a plain loop:

- With a launcher, local rank 0 copies and the other local ranks wait. ``--num-nodes`` /
  ``--node-rank`` (launcher "explicit") make each process its node's copier. With no launcher,
  processes sharing a ``dst`` race for its lock: the first copies; the others block on the lock,
  then return if the node is staged, or else finish the job themselves. The lock and how a
  waiter tells its copier died: imgprep.stage.nodelock.
- A done-marker per split (``done-<split>.json``) holds the plan's fingerprint: the sha256 of
  the source manifest's bytes, mode, seed, num_nodes, node_rank and verify. The node is staged
  for a plan when each split's marker has the plan's fingerprint, its node-local manifest is
  the one the marker names, and every shard has its size. A marker from another plan is void
  (imgprep.stage.plan plans, imgprep.stage.markers reads and writes the markers).

The copier, under the lock: plan (from the manifests alone), void the markers, sweep what a
killed run left, find what ``dst`` lacks, check the free space, copy (imgprep.stage.copier:
each copy checked against the manifest before its rename, so a rerun skips what is there),
then write each split's node-local manifest and, last, its done-marker (imgprep.stage.fill).
With fan-out (replicate only) the copy step reads just the node's partition share and
exchanges the rest with the other nodes' copiers (imgprep.stage.fanout), which meet where
imgprep.job.rendezvous says.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from imgprep.errors import ImgprepError, StageError
from imgprep.job.rendezvous import Rendezvous, copier_rendezvous
from imgprep.job.world import World
from imgprep.shards.manifest import manifest_path
from imgprep.stage.fill import Moved, fill
from imgprep.stage.markers import is_staged
from imgprep.stage.nodelock import held, record, state_dir, wait_for_copier
from imgprep.stage.options import StageOptions
from imgprep.stage.plan import SplitPlan, plan_node
from imgprep.stage.pool import Progress
from imgprep.stage.remote import source_of

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class StageSummary:
    """What one process of ``stage-to-node`` did (``--json`` prints it as an object).

    ``bytes_read`` counts bytes read from the file server (0 for waiters and for shards
    already staged), ``bytes_received`` and ``bytes_sent`` those from and to other nodes
    (fan-out); ``bytes_written`` is the two first together."""

    role: str  # "copier" or "waiter"
    rank: int
    local_rank: int
    node_rank: int
    num_nodes: int
    mode: str
    verify: str
    splits: tuple[str, ...]
    shards_needed: int
    shards_copied: int
    shards_skipped: int
    bytes_read: int
    bytes_received: int
    bytes_sent: int
    bytes_written: int
    fanout: bool
    fanout_seconds: float  # from all nodes joined to all finished
    seconds: float
    mb_per_s: float  # bytes written a second
    dst: str
    manifests: tuple[str, ...]  # the node-local manifests


def _summary(role: str, plan: Sequence[SplitPlan], opts: StageOptions, world: World, t0: float,
             done: Moved | None = None) -> StageSummary:
    seconds = time.monotonic() - t0
    moved = done or Moved()
    written = moved.read + moved.received
    return StageSummary(
        role=role,
        rank=world.rank,
        local_rank=world.local_rank,
        node_rank=world.node_rank,
        num_nodes=world.num_nodes,
        mode=opts.mode,
        verify=opts.verify,
        splits=tuple(sp.split for sp in plan),
        shards_needed=sum(len(sp.needed) for sp in plan),
        shards_copied=moved.copied,
        shards_skipped=moved.skipped,
        bytes_read=moved.read,
        bytes_received=moved.received,
        bytes_sent=moved.sent,
        bytes_written=written,
        fanout=opts.fanout,
        fanout_seconds=round(moved.moving_s, 3),
        seconds=round(seconds, 3),
        mb_per_s=round(written / seconds / 1e6, 1) if seconds > 0 else 0.0,
        dst=str(opts.dst),
        manifests=tuple(str(manifest_path(opts.dst, sp.split)) for sp in plan),
    )


def _prepare_dst(opts: StageOptions, node: int) -> None:
    folder = source_of(opts.src).folder
    if folder is not None and opts.dst.exists() and os.path.samefile(folder, opts.dst):
        raise StageError(f"node {node}: --dst {opts.dst} is the source folder; pick a "
                         "node-local folder")
    try:
        state_dir(opts.dst).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StageError(f"node {node}: cannot create {state_dir(opts.dst)}: {e.strerror}; "
                         "pick a writable node-local --dst") from e


def _failure_reason(e: BaseException, err: BaseException) -> str:
    """What ``copier.json`` says about a copier that stopped on ``e`` (raised as ``err``)."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    return str(err) if isinstance(err, ImgprepError) else repr(err)


def _as_copier(plan: Sequence[SplitPlan], opts: StageOptions, world: World,
               rv: Rendezvous | None, progress: Progress | None,
               on_start: Callable[[int], None] | None) -> Moved:
    """Stage under the node's lock, saying in ``copier.json`` how it goes (for the waiters)."""
    node = world.node_rank
    record(opts.dst, world, "copying")
    try:
        done = fill(plan, opts, world, rv, progress, on_start)
    except BaseException as e:
        err = e
        if isinstance(e, OSError) and not isinstance(e, ImgprepError):  # e.g. EIO in dst
            err = StageError(f"node {node}: {e}; check {opts.dst}, then rerun to resume")
        with contextlib.suppress(ImgprepError, OSError):
            record(opts.dst, world, "failed", _failure_reason(e, err))
        if err is not e:
            raise err from e
        raise
    record(opts.dst, world, "done")
    return done


def stage_to_node(opts: StageOptions, world: World, progress: Progress | None = None,
                  on_start: Callable[[int], None] | None = None) -> StageSummary:
    """Stage this node's shards of ``opts.src`` into ``opts.dst`` (or wait for the process
    that does); returns a summary. Call it in every process of the job (with fan-out finding
    where the copiers meet can be collective: under mpirun, or inside a process group).

    - ``opts``: what to stage and how (StageOptions);
    - ``world``: this process's ranks; local rank 0 of each node copies, the others wait;
    - ``progress(nbytes)``: called as bytes are written (from copy threads, one call at a
      time), by the copier only;
    - ``on_start(bytes_to_copy)``: called once by the copier before it copies.
    """
    t0 = time.monotonic()
    plan = plan_node(opts, world)
    log.debug("node %d: plan %s, %d shards", world.node_rank,
              ", ".join(sp.split for sp in plan), sum(len(sp.needed) for sp in plan))
    rv = None  # every rank takes part in finding where the copiers meet (it may be collective)
    if opts.fanout and world.num_nodes > 1:
        rv = copier_rendezvous(world, opts.rendezvous)
    if world.launcher != "single" and not world.is_node_leader:
        log.debug("node %d: rank %d waits for its copier", world.node_rank, world.rank)
        wait_for_copier(lambda: is_staged(plan, opts.dst), opts.dst, world, opts.timeout, t0)
        return _summary("waiter", plan, opts, world, t0)
    _prepare_dst(opts, world.node_rank)
    with held(opts.dst, world.node_rank, t0 + opts.timeout, opts.timeout):
        if world.launcher == "single" and is_staged(plan, opts.dst):
            log.debug("node %d: %s is staged already", world.node_rank, opts.dst)
            return _summary("waiter", plan, opts, world, t0)
        done = _as_copier(plan, opts, world, rv, progress, on_start)
    return _summary("copier", plan, opts, world, t0, done)
