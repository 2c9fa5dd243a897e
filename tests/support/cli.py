"""Running the ``imgprep`` CLI in-process, and the small trees its tests convert."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from imgprep.cli.commands import cli
from tests.support.images import jpeg


def invoke(*args: object) -> Result:
    """Run ``imgprep ARGS`` in-process; stdout and stderr are kept apart."""
    return CliRunner().invoke(cli, [str(a) for a in args])


def ok(r: Result) -> dict[str, Any]:
    """The ``--json`` summary of a run that must have exited 0."""
    assert r.exit_code == 0, f"exit {r.exit_code}: {r.output}"
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def jpeg_tree(root: Path, files: dict[str, int]) -> Path:
    """Write ``files`` ({relative path: seed}) as small JPEGs under ``root``; ``root``."""
    for rel, seed in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(jpeg((40, 32), seed=seed))
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root``: {relative path: bytes}."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}
