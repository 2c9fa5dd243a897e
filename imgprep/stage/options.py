"""What ``imgprep stage-to-node`` is asked to do: one frozen, checked bundle of options.

A node's staged files are a pure function of these options and the job's World, so every
process of a node builds the same ``StageOptions`` and plans the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from imgprep.job.assign import MODES
from imgprep.stage.remote import STALL_S

VERIFY_MODES = ("sha256", "size")


@dataclass(frozen=True, kw_only=True)
class StageOptions:
    """What ``imgprep stage-to-node`` needs; the node's files are a pure function of these.
    Values that cannot work raise ValueError when the options are built."""

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

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, not {self.verify!r}")
        if self.jobs < 1 or self.chunk < 1 or not self.timeout > 0 or not self.stall > 0:
            raise ValueError("jobs, chunk, timeout and stall must be positive")
        if self.fanout and self.mode != "replicate":
            raise ValueError("fan-out gives every node every shard: it goes with mode replicate")
