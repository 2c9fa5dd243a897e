"""What moves where during fan-out: the shards, the transfers, and the order every node walks.

Pure functions of what every node holds, so every node computes the same plan on its own
(imgprep.stage.fanout runs it). Why a chain along the ring per shard: docs/staging.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from imgprep.shards.manifest import ShardEntry


@dataclass(frozen=True)
class Shard:
    """One shard to hold on every node: its entry, where it is on the file server and the
    manifest that lists it (a path or URL, for messages), and the node that owns it (reads it
    from the file server)."""

    entry: ShardEntry
    source: str
    manifest: str
    owner: int


@dataclass(frozen=True)
class Transfer:
    """Shard ``index`` goes from ``sender`` down ``chain``; ``from_server``: the sender reads it
    from the file server (and keeps a copy), else from its own ``dst``."""

    index: int
    sender: int
    chain: tuple[int, ...]
    from_server: bool


@dataclass
class Counts:
    """One node's running counters during fan-out (bumped by its threads as they go)."""

    read: int = 0  # bytes read from the file server
    received: int = 0  # bytes received from peers
    sent: int = 0  # bytes sent to peers
    written: int = 0  # shards renamed into place here


def plan_transfers(have: Sequence[Sequence[bool]], owners: Sequence[int]) -> list[Transfer]:
    """The transfers that give every node every shard, in the order all nodes walk them
    (``have[k][i]``: node k holds shard i). A pure function: every node gets the same list."""
    n = len(have)
    per_sender: list[list[Transfer]] = [[] for _ in range(n)]
    for i, owner in enumerate(owners):
        lacking = [k for k in range(n) if not have[k][i]]
        if not lacking:
            continue
        ring = [(owner + d) % n for d in range(n)]
        holders = [k for k in ring if have[k][i]]
        sender = holders[0] if holders else owner
        chain = tuple(k for k in ring[ring.index(sender):] + ring[:ring.index(sender)]
                      if k != sender and not have[k][i])
        per_sender[sender].append(Transfer(i, sender, chain, not holders))
    rounds = max((len(t) for t in per_sender), default=0)
    return [ts[r] for r in range(rounds) for ts in per_sender if r < len(ts)]


def chunks(size: int, chunk: int) -> list[int]:
    """The message sizes a shard of ``size`` bytes travels in (one, maybe empty, at least)."""
    return [min(chunk, size - o) for o in range(0, size, chunk)] or [0]


def walk(transfers: Sequence[Transfer], sizes: Sequence[int],
         chunk: int) -> list[tuple[Transfer, int, int]]:
    """(transfer, chunk index, chunk size) in the order every node walks them: round by round
    (a round holds each sender's next transfer), chunk by chunk, sender by sender. Every link's
    messages thus come in one order both of its ends know, and a message only depends on
    messages before it (the same chunk one hop back, or earlier ones)."""
    rounds: list[list[Transfer]] = []
    seen: dict[int, int] = {}
    for t in transfers:  # plan_transfers lists round r's senders after round r-1's
        r = seen.get(t.sender, 0)
        seen[t.sender] = r + 1
        if r == len(rounds):
            rounds.append([])
        rounds[r].append(t)
    steps: list[tuple[Transfer, int, int]] = []
    for group in rounds:
        pieces = [chunks(sizes[t.index], chunk) for t in group]
        for c in range(max(len(z) for z in pieces)):
            steps += [(t, c, z[c]) for t, z in zip(group, pieces, strict=True) if c < len(z)]
    return steps
