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
  the one the marker names, and every shard has its size. A marker from another plan is void.

The copier, under the lock: plan (from the manifests alone), void the markers, sweep what a
killed run left, find what ``dst`` lacks, check the free space, copy (imgprep.stage.copier:
each copy checked against the manifest before its rename, so a rerun skips what is there),
then write each split's node-local manifest and, last, its done-marker. With fan-out
(replicate only) the copy step reads just the node's partition share and exchanges the rest
with the other nodes' copiers (imgprep.stage.fanout), which meet where imgprep.job.rendezvous
says.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from imgprep.errors import ImgprepError, ManifestError, OutputError, StageError
from imgprep.fsutil import fsync_dir, sweep_tmp
from imgprep.job.assign import MODES, node_shards, partition_owners
from imgprep.job.rendezvous import Rendezvous, copier_rendezvous
from imgprep.job.world import World
from imgprep.shards.dali import sync_shards
from imgprep.shards.manifest import (
    Manifest,
    NodeSection,
    ShardEntry,
    manifest_path,
    parse_manifest,
    write_manifest,
)
from imgprep.stage.copier import (
    Progress,
    check_space,
    copy_all,
    copy_index,
    drop_stale,
    parallel,
    present,
    remove,
    why,
    write_small,
)
from imgprep.stage.fanout import FanoutJob, fan_out
from imgprep.stage.nodelock import held, read_json, record, state_dir, wait_for_copier
from imgprep.stage.remote import STALL_S, FetchFailed, Source, source_of
from imgprep.stage.schedule import Shard

VERIFY_MODES = ("sha256", "size")
MARKER_VERSION = 1  # bump when a marker's meaning changes: old markers then no longer count
PLAIN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")  # split and error-log names


@dataclass(frozen=True)
class StageOptions:
    """What ``imgprep stage-to-node`` needs; the node's files are a pure function of these."""

    src: Path | str  # converted folder on the file server, or its URL (imgprep.stage.remote)
    dst: Path  # node-local folder
    mode: str = "replicate"  # or "partition" (imgprep.job.assign.MODES)
    split: str | None = None  # None: every manifest found in src
    seed: int = 0
    jobs: int = 2  # parallel copy streams (threads)
    verify: str = "sha256"  # or "size"
    timeout: float = 3600.0  # seconds a waiting rank waits for the copier
    stall: float = STALL_S  # seconds without a byte after which a read or fan-out node is stuck
    chunk: int = 8 << 20  # read size: large sequential reads
    fanout: bool = False  # replicate: read each node's share, the rest from the other nodes
    rendezvous: str | None = None  # HOST:PORT where the node copiers meet (fan-out)


@dataclass
class Moved:
    """What the copier did: shards copied and already there; bytes from the file server and
    (fan-out) received from and sent to other nodes."""

    copied: int = 0
    skipped: int = 0
    read: int = 0
    received: int = 0
    sent: int = 0
    moving_s: float = 0.0  # fan-out: seconds from all nodes joined to all finished


@dataclass(frozen=True)
class SplitPlan:
    """One split: where it comes from, its manifest (file name, content, the sha256 of its
    bytes), the shards this node needs and the fingerprint a done-marker must carry to say
    they are staged."""

    origin: Source
    name: str
    manifest: Manifest
    sha256: str
    needed: tuple[ShardEntry, ...]
    fingerprint: str

    @property
    def split(self) -> str:
        return self.manifest.split

    @property
    def source(self) -> str:
        """The source manifest's path or URL."""
        return self.origin.where(self.name)


# ---------------------------------------------------------------------------- planning


def _fingerprint(manifest_sha256: str, opts: StageOptions, world: World) -> str:
    key = {"version": MARKER_VERSION, "manifest_sha256": manifest_sha256, "mode": opts.mode,
           "seed": opts.seed, "num_nodes": world.num_nodes, "node_rank": world.node_rank,
           "verify": opts.verify}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _load_split(origin: Source, name: str, opts: StageOptions, world: World) -> SplitPlan:
    """Read one source manifest (once: the bytes hashed are the bytes parsed) and plan it."""
    path = origin.where(name)
    try:
        data = origin.read(name)
    except FetchFailed as e:
        raise StageError(f"node {world.node_rank}: cannot fetch the manifest {path}: "
                         f"{e.strerror}; " + (e.advice or "check --src, --split and the server "
                                              "(or the command by hand), then rerun")) from e
    except FileNotFoundError:
        raise ManifestError(f"no manifest {path}: that split was not converted (or not "
                            "finished); run imgprep convert or pick another --split") from None
    except OSError as e:
        raise ManifestError(f"cannot read manifest {path}: {e.strerror}; check the file "
                            "server and rerun") from e
    try:
        decoded = json.loads(data)
    except ValueError as e:
        raise ManifestError(f"{path} is not valid JSON ({e}); reconvert or restore it") from e
    m = parse_manifest(decoded, str(path))
    if m.format != "shards":
        raise StageError(f"{path} describes a label list; stage-to-node copies shards only: "
                         "convert with --format shards")
    if m.node is not None:
        raise StageError(f"{path} is node {m.node.node_rank}'s manifest (only its shards); "
                         "stage from the full conversion on the file server")
    if not PLAIN_NAME.match(m.split) or (m.error_log and not PLAIN_NAME.match(m.error_log)):
        raise ManifestError(f"{path}: split {m.split!r} or error log {m.error_log!r} is not a "
                            "plain file name; reconvert or restore the manifest")
    picked = node_shards([s.samples for s in m.shards], world.num_nodes, opts.mode,
                         opts.seed)[world.node_rank]
    sha = hashlib.sha256(data).hexdigest()
    return SplitPlan(origin, name, m, sha, tuple(m.shards[i] for i in picked),
                     _fingerprint(sha, opts, world))


def plan_node(opts: StageOptions, world: World) -> list[SplitPlan]:
    """What this node needs, from the source manifest(s) alone (no tar is opened)."""
    origin = source_of(opts.src, opts.stall)
    names = origin.manifests(opts.split)
    if not names:
        raise ManifestError(f"no manifest in {origin}: the conversion did not finish, or "
                            "--src is not a converted folder; run imgprep convert first")
    plan = [_load_split(origin, name, opts, world) for name in names]
    splits = [sp.split for sp in plan]
    shards = [e.name for sp in plan for e in sp.manifest.shards]
    if len(set(splits)) != len(splits) or len(set(shards)) != len(shards):
        raise ManifestError(f"the manifests in {origin} ({', '.join(names)}) "
                            "repeat a split or a shard name; pick one with --split")
    return plan


def node_manifest(sp: SplitPlan, opts: StageOptions, world: World) -> Manifest:
    """The source manifest cut down to this node's shards, saying which part of what it is
    (its sample index, when it has one, comes along: it covers the whole set)."""
    m = sp.manifest
    return replace(m, shards=list(sp.needed), total_samples=sum(e.samples for e in sp.needed),
                   node=NodeSection(world.node_rank, world.num_nodes, opts.mode, opts.seed,
                                    m.total_samples, len(m.shards),
                                    tuple((e.name, e.samples) for e in m.shards)))


Item = tuple[SplitPlan, ShardEntry]  # a shard to stage, with the split it belongs to


# ---------------------------------------------------------------------------- done-markers


def _marker_path(dst: Path, split: str) -> Path:
    return state_dir(dst) / f"done-{split}.json"


def _marker_matches(sp: SplitPlan, dst: Path) -> dict[str, Any] | None:
    marker = read_json(_marker_path(dst, sp.split))
    if isinstance(marker, dict) and marker.get("fingerprint") == sp.fingerprint:
        return marker
    return None


def is_staged(plan: Sequence[SplitPlan], dst: Path) -> bool:
    """Whether ``dst`` holds ``plan``: markers of this plan, their node manifests, and every
    shard at its size (cheap enough to poll; the copier checked the bytes before the marker)."""
    for sp in plan:
        marker = _marker_matches(sp, dst)
        if marker is None:
            return False
        try:
            data = manifest_path(dst, sp.split).read_bytes()
            if hashlib.sha256(data).hexdigest() != marker.get("manifest_sha256"):
                return False
            if any((dst / e.name).stat().st_size != e.bytes for e in sp.needed):
                return False
        except OSError:
            return False
    return True


# ---------------------------------------------------------------------------- the copier's work


def _finish_split(sp: SplitPlan, opts: StageOptions, world: World) -> None:
    """Copy the split's error log, write its node-local manifest, then its done-marker."""
    node, dst = world.node_rank, opts.dst
    if sp.manifest.error_log:
        log = sp.manifest.error_log
        try:
            data = sp.origin.read(log)
        except OSError as e:
            raise StageError(f"node {node}: cannot read the error log {sp.origin.where(log)} "
                             f"that {sp.source} names ({e.strerror}); restore it or "
                             "reconvert, then rerun") from e
        write_small(dst / log, data, node)
    try:
        path = write_manifest(dst, node_manifest(sp, opts, world))
    except OutputError as e:
        raise StageError(f"node {node}: cannot write the manifest in {dst}: "
                         f"{why(e.__cause__ or e)}; free space there or use another --dst, "
                         "then rerun to resume") from e
    marker = {"fingerprint": sp.fingerprint, "split": sp.split, "source": sp.source,
              "source_sha256": sp.sha256, "mode": opts.mode, "seed": opts.seed,
              "num_nodes": world.num_nodes, "node_rank": world.node_rank, "verify": opts.verify,
              "shards": len(sp.needed), "bytes": sum(e.bytes for e in sp.needed),
              "manifest_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    write_small(_marker_path(dst, sp.split), json.dumps(marker, indent=1).encode(), node)


def _missing(plan: Sequence[SplitPlan], opts: StageOptions, node: int,
             stop: threading.Event) -> tuple[list[Item], int]:
    """Void the markers, sweep what a killed run left, and find the shards ``dst`` lacks
    (their bad copies removed). Returns them and how many shards were already there."""
    dst = opts.dst
    trusted = {sp.split for sp in plan if _marker_matches(sp, dst) is not None}
    for sp in plan:  # void the markers before anything in dst changes
        remove(_marker_path(dst, sp.split), node)
    fsync_dir(state_dir(dst))
    for folder in (dst, state_dir(dst)):
        sweep_tmp(folder)
    for sp in plan:
        drop_stale(dst, sp.split, {e.name for e in sp.needed})
    items = [(sp, e) for sp in plan for e in sp.needed]
    there = parallel(lambda it: present(dst / it[1].name, it[1], opts.verify, opts.chunk,
                                        it[0].split in trusted, stop), items, opts.jobs, stop)
    todo = [it for it, ok in zip(items, there, strict=True) if not ok]
    for _, e in todo:
        remove(dst / e.name, node)  # a bad copy: free its space before the check
    return todo, len(items) - len(todo)


def _fan_out(plan: Sequence[SplitPlan], todo: Sequence[Item], opts: StageOptions, world: World,
             rv: Rendezvous, tick: Progress) -> Moved:
    """Give every node every shard and sample index, reading only this node's partition share
    from the file server (imgprep.stage.fanout); each index is read once, by node 0, and fanned out
    like a shard."""
    items = [(sp, e) for sp in plan for e in sp.needed]
    owners = [k for sp in plan for k in partition_owners(
        [e.samples for e in sp.manifest.shards], world.num_nodes, opts.seed)]
    lacking = {e.name for _, e in todo}
    have = [e.name not in lacking for _, e in items]
    shards = len(items)
    for sp in plan:
        if (ix := sp.manifest.index) is not None:
            entry = ShardEntry(ix.name, 0, ix.bytes, ix.sha256)
            items.append((sp, entry))
            owners.append(0)
            have.append(present(opts.dst / ix.name, entry, "sha256", opts.chunk, False,
                                threading.Event()))
    digest = hashlib.sha256(json.dumps([[sp.sha256 for sp in plan], opts.seed, world.num_nodes],
                                       ).encode()).hexdigest()
    job = FanoutJob(plan[0].origin if plan else source_of(opts.src, opts.stall),
                    [Shard(e, sp.origin.where(e.name), sp.source, k)
                     for (sp, e), k in zip(items, owners, strict=True)],
                    have, digest, opts.dst, world.node_rank, world.num_nodes, opts.jobs,
                    opts.timeout, opts.stall)
    c = fan_out(job, rv, tick)
    indexes_written = have[shards:].count(False)
    return Moved(c.written - indexes_written, shards - len(todo), c.read, c.received, c.sent,
                 c.seconds)


def _stage(plan: Sequence[SplitPlan], opts: StageOptions, world: World, rv: Rendezvous | None,
           progress: Progress | None, on_start: Callable[[int], None] | None) -> Moved:
    """The copier's work, under the lock."""
    node, stop = world.node_rank, threading.Event()
    todo, skipped = _missing(plan, opts, node, stop)
    need = check_space(opts.dst, sum(e.bytes for _, e in todo), len(todo), node)
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
        read = copy_all([(sp.origin, sp.source, e) for sp, e in todo], opts.dst, opts.verify,
                        opts.chunk, node, tick, opts.jobs, opts.stall)
        done = Moved(len(todo), skipped, read)
    fsync_dir(opts.dst)  # every shard's rename is on disk before a manifest names it
    for sp in plan:
        if rv is None:  # fan-out moved the indexes with the shards
            done.read += copy_index(sp.manifest.index, sp.origin, sp.source, opts.dst,
                                    opts.chunk, node)
        sync_shards(opts.dst, sp.manifest, sp.needed, opts.jobs)  # DALI indexes: made here
        _finish_split(sp, opts, world)
    return done


# ---------------------------------------------------------------------------- entry point


def _summary(role: str, plan: Sequence[SplitPlan], opts: StageOptions, world: World, t0: float,
             done: Moved | None = None) -> dict[str, Any]:
    seconds = time.monotonic() - t0
    d = done or Moved()
    copied, skipped, read = d.copied, d.skipped, d.read
    return {
        "role": role, "rank": world.rank, "local_rank": world.local_rank,
        "node_rank": world.node_rank, "num_nodes": world.num_nodes, "mode": opts.mode,
        "verify": opts.verify, "splits": [sp.split for sp in plan],
        "shards_needed": sum(len(sp.needed) for sp in plan), "shards_copied": copied,
        "shards_skipped": skipped, "bytes_read": read, "bytes_received": d.received,
        "bytes_sent": d.sent, "bytes_written": read + d.received, "fanout": opts.fanout,
        "fanout_seconds": round(d.moving_s, 3),
        "seconds": round(seconds, 3),
        "mb_per_s": round((read + d.received) / seconds / 1e6, 1) if seconds > 0 else 0.0,
        "dst": str(opts.dst),
        "manifests": [str(manifest_path(opts.dst, sp.split)) for sp in plan],
    }


def _check_options(opts: StageOptions) -> None:
    if opts.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {opts.mode!r}")
    if opts.verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES}, not {opts.verify!r}")
    if opts.jobs < 1 or opts.chunk < 1 or not opts.timeout > 0 or not opts.stall > 0:
        raise ValueError("jobs, chunk, timeout and stall must be positive")
    if opts.fanout and opts.mode != "replicate":
        raise ValueError("fan-out gives every node every shard: it goes with mode replicate")


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


def _as_copier(plan: Sequence[SplitPlan], opts: StageOptions, world: World,
               rv: Rendezvous | None, progress: Progress | None,
               on_start: Callable[[int], None] | None) -> Moved:
    """Stage under the node's lock, saying in ``copier.json`` how it goes (for the waiters)."""
    node = world.node_rank
    record(opts.dst, world, "copying")
    try:
        done = _stage(plan, opts, world, rv, progress, on_start)
    except BaseException as e:
        err = e
        if isinstance(e, OSError) and not isinstance(e, ImgprepError):  # e.g. EIO in dst
            err = StageError(f"node {node}: {e}; check {opts.dst}, then rerun to resume")
        reason = "interrupted" if isinstance(e, KeyboardInterrupt) else \
            str(err) if isinstance(err, ImgprepError) else repr(err)
        with contextlib.suppress(ImgprepError, OSError):
            record(opts.dst, world, "failed", reason)
        if err is not e:
            raise err from e
        raise
    record(opts.dst, world, "done")
    return done


def stage_to_node(opts: StageOptions, world: World, progress: Progress | None = None,
                  on_start: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Stage this node's shards of ``opts.src`` into ``opts.dst`` (or wait for the process
    that does); returns a summary. Call it in every process of the job (with fan-out finding
    where the copiers meet can be collective: under mpirun, or inside a process group).

    - ``opts``: what to stage and how (StageOptions);
    - ``world``: this process's ranks; local rank 0 of each node copies, the others wait;
    - ``progress(nbytes)``: called as bytes are written (from copy threads, one call at a
      time), by the copier only;
    - ``on_start(bytes_to_copy)``: called once by the copier before it copies.

    ``bytes_read`` counts bytes read from the file server (0 for waiters and for shards
    already staged), ``bytes_received`` those from other nodes (fan-out).
    """
    t0 = time.monotonic()
    _check_options(opts)
    plan = plan_node(opts, world)
    rv = None  # every rank takes part in finding where the copiers meet (it may be collective)
    if opts.fanout and world.num_nodes > 1:
        rv = copier_rendezvous(world, opts.rendezvous)
    if world.launcher != "single" and not world.is_node_leader:
        wait_for_copier(lambda: is_staged(plan, opts.dst), opts.dst, world, opts.timeout, t0)
        return _summary("waiter", plan, opts, world, t0)
    _prepare_dst(opts, world.node_rank)
    with held(opts.dst, world.node_rank, t0 + opts.timeout, opts.timeout):
        if world.launcher == "single" and is_staged(plan, opts.dst):
            return _summary("waiter", plan, opts, world, t0)  # someone staged it already
        done = _as_copier(plan, opts, world, rv, progress, on_start)
    return _summary("copier", plan, opts, world, t0, done)
