"""The reliability harness: fault injection, hostile inputs and scale runs, each returning plain
records that ``harness.reliability.report`` tabulates and the tests assert on (the tests run
the same functions in a reduced form). Not part of the installed packages."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Trial:
    """One injected fault or one hostile input, and whether the guarantee held.

    ``group`` is the part under test ("convert", "stage-to-node", "loader", …), ``kind`` the
    fault or input ("SIGKILL, shards, 2 workers"), ``detail`` what the user saw (the error line)
    or, when ``ok`` is false, what broke the guarantee.
    """

    group: str
    kind: str
    ok: bool
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Figure:
    """One measured scale figure, with the bound it is held to (``ok`` None: report only)."""

    group: str
    name: str
    value: float
    unit: str
    bound: str = ""
    ok: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tally(trials: list[Trial]) -> list[tuple[str, str, int, int]]:
    """(group, kind, trials, survived) per fault kind, in first-seen order."""
    rows: dict[tuple[str, str], list[int]] = {}
    for t in trials:
        row = rows.setdefault((t.group, t.kind), [0, 0])
        row[0] += 1
        row[1] += t.ok
    return [(g, k, n, ok) for (g, k), (n, ok) in rows.items()]
