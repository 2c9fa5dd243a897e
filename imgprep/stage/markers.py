"""Done-markers: how a node folder says it holds a plan.

One marker per split (``<dst>/.imgprep-stage/done-<split>.json``), written last, after the
split's shards and its node-local manifest. The node is staged for a plan when each split's
marker has the plan's fingerprint (imgprep.stage.plan), its node-local manifest is the one the
marker names (by sha256), and every shard has its size. A marker from another plan is void.
The copier voids the markers before it changes anything in the folder.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from imgprep.fsutil import fsync_dir
from imgprep.job.world import World
from imgprep.shards.manifest import manifest_path
from imgprep.stage.localdisk import remove, write_small
from imgprep.stage.nodelock import read_json, state_dir
from imgprep.stage.options import StageOptions
from imgprep.stage.plan import SplitPlan


@dataclass(frozen=True, kw_only=True)
class DoneMarker:
    """What a done-marker holds: the plan's fingerprint and, for people, what was staged."""

    fingerprint: str
    split: str
    source: str  # the source manifest's path or URL
    source_sha256: str
    mode: str
    seed: int
    num_nodes: int
    node_rank: int
    verify: str
    shards: int
    bytes: int
    manifest_sha256: str  # of the node-local manifest


def marker_path(dst: Path, split: str) -> Path:
    return state_dir(dst) / f"done-{split}.json"


def _marker_of_plan(sp: SplitPlan, dst: Path) -> dict[str, Any] | None:
    """The split's marker as written, when it carries this plan's fingerprint."""
    marker = read_json(marker_path(dst, sp.split))
    if isinstance(marker, dict) and marker.get("fingerprint") == sp.fingerprint:
        return marker
    return None


def vouched(sp: SplitPlan, dst: Path) -> bool:
    """Whether a marker of this plan vouches for the split's shards in ``dst`` (their bytes
    were checked before it was written)."""
    return _marker_of_plan(sp, dst) is not None


def is_staged(plan: Sequence[SplitPlan], dst: Path) -> bool:
    """Whether ``dst`` holds ``plan``: markers of this plan, their node manifests, and every
    shard at its size (cheap enough to poll; the copier checked the bytes before the marker)."""
    for sp in plan:
        marker = _marker_of_plan(sp, dst)
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


def void_markers(plan: Sequence[SplitPlan], dst: Path, node: int) -> None:
    """Remove the plan's markers, durably, before anything in ``dst`` changes."""
    for sp in plan:
        remove(marker_path(dst, sp.split), node)
    fsync_dir(state_dir(dst))


def write_marker(sp: SplitPlan, opts: StageOptions, world: World, manifest: Path) -> None:
    """Say that ``dst`` holds the split: written last, after its node-local ``manifest``."""
    marker = DoneMarker(
        fingerprint=sp.fingerprint,
        split=sp.split,
        source=sp.source,
        source_sha256=sp.sha256,
        mode=opts.mode,
        seed=opts.seed,
        num_nodes=world.num_nodes,
        node_rank=world.node_rank,
        verify=opts.verify,
        shards=len(sp.needed),
        bytes=sum(e.bytes for e in sp.needed),
        manifest_sha256=hashlib.sha256(manifest.read_bytes()).hexdigest(),
    )
    data = json.dumps(asdict(marker), indent=1).encode()
    write_small(marker_path(opts.dst, sp.split), data, world.node_rank)
