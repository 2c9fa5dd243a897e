"""What every check is given: the device, the sizes, the work folder and the data in it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .data import converted, make_input
from .profile import Profile
from .timing import cuda_sync, no_sync


@dataclass(frozen=True, kw_only=True)
class Context:
    """One run of the kit. ``targets_apply``: the full run on CUDA, where the acceptance
    targets are judged; elsewhere they are reported as ``info``."""

    device: str  # "cuda" or "cpu"
    profile: Profile
    work: Path

    def __post_init__(self) -> None:
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device must be cuda or cpu, not {self.device!r}")

    @property
    def targets_apply(self) -> bool:
        return self.device == "cuda" and self.profile.name == "cuda"

    @property
    def sync(self) -> Callable[[], None]:
        return cuda_sync if self.device == "cuda" else no_sync

    def data(self) -> Path:
        """The converted set (made on first use, then reused)."""
        return converted(self.work, self.profile, self.profile.timeout_s)

    def input(self) -> Path:
        """The synthetic input's folder (the train tar and the pool)."""
        return make_input(self.work, self.profile)
