"""Check that imports run with the grain: one direction between packages and between rooms.

Between packages: ``scripts`` -> ``loaders`` -> ``imgprep`` (tests may import anything).
Inside ``imgprep``, each room (subpackage) may import only rooms below it:

    cli  ->  convert, stage  ->  inputs  ->  shards  ->  job  ->  leaf modules

(``convert`` and ``stage`` do not import each other; the leaf modules at the top of the
package import no room, except the package's public face, ``__init__`` and ``__main__``.)
Every import is checked, those inside functions too, since a deferred import is still a
dependency. Prints one line per import against the grain and
exits 1 if there is any.

    python scripts/check_layout.py
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEAF = "leaf"
RANK = {"cli": 5, "convert": 4, "stage": 4, "inputs": 3, "shards": 2, "job": 1, LEAF: 0}
PACKAGES = {"scripts": 2, "loaders": 1, "imgprep": 0}
FACE = {"imgprep/__init__.py", "imgprep/__main__.py"}  # the package's public face


def room_of(module: str) -> str:
    """The room of an ``imgprep`` module: its subpackage, or ``leaf`` for top-level ones."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in RANK) else LEAF


def imports(path: Path, package: str) -> Iterator[tuple[int, str]]:
    """``(line, module)`` for every absolute import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    here = package.split(".")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            if base == "imgprep":  # `from imgprep import shards` names a room, not the leaf
                for alias in node.names:
                    yield node.lineno, f"imgprep.{alias.name}"
            else:
                yield node.lineno, base


def problems(repo: Path = REPO) -> list[str]:
    """Every import against the grain, as ``path:line: what``."""
    out: list[str] = []
    for top, top_rank in PACKAGES.items():
        for path in sorted((repo / top).rglob("*.py")):
            rel = path.relative_to(repo)
            package = ".".join(rel.with_suffix("").parts)
            for line, module in imports(path, package):
                head = module.split(".")[0]
                if head in PACKAGES and head != top and PACKAGES[head] > top_rank:
                    out.append(f"{rel}:{line}: {top} imports {module} ({top} -> {head} runs "
                               "against scripts -> loaders -> imgprep)")
                if top != "imgprep" or head != "imgprep" or str(rel) in FACE:
                    continue
                mine, theirs = room_of(package), room_of(module)
                if theirs not in RANK:
                    continue
                if mine != theirs and RANK[theirs] >= RANK[mine]:
                    out.append(f"{rel}:{line}: room {mine} imports {module} (room {theirs}); "
                               "rooms import only rooms below them: "
                               "cli -> convert, stage -> inputs -> shards -> job -> leaf")
    return out


def main() -> int:
    found = problems()
    for line in found:
        print(line)
    print(f"check_layout: {len(found)} import(s) against the grain", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
