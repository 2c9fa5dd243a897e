"""What a node needs, planned from the source manifests alone (no tar is opened).

For each split: the source manifest (read once, so the bytes hashed are the bytes parsed), the
shards this node holds in the chosen mode (imgprep.job.assign.node_shards) and the plan's
fingerprint, which a done-marker (imgprep.stage.markers) must carry to say the node holds it:
the sha256 of the source manifest's bytes, mode, seed, num_nodes, node_rank and verify.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from imgprep.errors import ManifestError, StageError
from imgprep.job.assign import node_shards
from imgprep.job.world import World
from imgprep.shards.manifest import Manifest, NodeSection, ShardEntry, parse_manifest
from imgprep.stage.options import StageOptions
from imgprep.stage.remote import FetchFailed, Source, source_of

MARKER_VERSION = 1  # bump when a marker's meaning changes: old markers then no longer count
PLAIN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")  # split and error-log names


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True)
class PlannedShard:
    """A shard this node needs, with the plan of the split it belongs to."""

    plan: SplitPlan
    entry: ShardEntry


def planned_shards(plan: Sequence[SplitPlan]) -> list[PlannedShard]:
    """Every shard the node needs, split by split, in manifest order."""
    return [PlannedShard(sp, e) for sp in plan for e in sp.needed]


def fingerprint(manifest_sha256: str, opts: StageOptions, world: World) -> str:
    """The key of a plan: what a done-marker must carry for the node to count as staged."""
    key = {
        "version": MARKER_VERSION,
        "manifest_sha256": manifest_sha256,
        "mode": opts.mode,
        "seed": opts.seed,
        "num_nodes": world.num_nodes,
        "node_rank": world.node_rank,
        "verify": opts.verify,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _read_manifest_bytes(origin: Source, name: str, world: World) -> bytes:
    path = origin.where(name)
    try:
        return origin.read(name)
    except FetchFailed as e:
        advice = e.advice or "check --src, --split and the server (or the command by hand), " \
                             "then rerun"
        raise StageError(f"node {world.node_rank}: cannot fetch the manifest {path}: "
                         f"{e.strerror}; {advice}") from e
    except FileNotFoundError:
        raise ManifestError(f"no manifest {path}: that split was not converted (or not "
                            "finished); run imgprep convert or pick another --split") from None
    except OSError as e:
        raise ManifestError(f"cannot read manifest {path}: {e.strerror}; check the file "
                            "server and rerun") from e


def _parse(data: bytes, path: str) -> Manifest:
    """The source manifest, refused when it is not a whole shard conversion."""
    try:
        decoded = json.loads(data)
    except ValueError as e:
        raise ManifestError(f"{path} is not valid JSON ({e}); reconvert or restore it") from e
    m = parse_manifest(decoded, path)
    if m.format != "shards":
        raise StageError(f"{path} describes a label list; stage-to-node copies shards only: "
                         "convert with --format shards")
    if m.node is not None:
        raise StageError(f"{path} is node {m.node.node_rank}'s manifest (only its shards); "
                         "stage from the full conversion on the file server")
    if not PLAIN_NAME.match(m.split) or (m.error_log and not PLAIN_NAME.match(m.error_log)):
        raise ManifestError(f"{path}: split {m.split!r} or error log {m.error_log!r} is not a "
                            "plain file name; reconvert or restore the manifest")
    return m


def _load_split(origin: Source, name: str, opts: StageOptions, world: World) -> SplitPlan:
    """Read one source manifest (once: the bytes hashed are the bytes parsed) and plan it."""
    data = _read_manifest_bytes(origin, name, world)
    m = _parse(data, str(origin.where(name)))
    shares = node_shards([s.samples for s in m.shards], world.num_nodes, opts.mode, opts.seed)
    sha = hashlib.sha256(data).hexdigest()
    return SplitPlan(origin=origin, name=name, manifest=m, sha256=sha,
                     needed=tuple(m.shards[i] for i in shares[world.node_rank]),
                     fingerprint=fingerprint(sha, opts, world))


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
    node = NodeSection(
        node_rank=world.node_rank,
        num_nodes=world.num_nodes,
        mode=opts.mode,
        seed=opts.seed,
        total_samples=m.total_samples,
        shards=len(m.shards),
        all_shards=tuple((e.name, e.samples) for e in m.shards),
    )
    return replace(m, shards=list(sp.needed), total_samples=sum(e.samples for e in sp.needed),
                   node=node)
