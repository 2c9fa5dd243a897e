"""Check the size rules of the library code: modules under a line limit, functions under another.

Library code is ``imgprep/`` and ``loaders/`` (the trainer, the benchmarks, the harnesses and
the tests are not held to it). A function's length counts its lines from ``def`` to its last
statement, docstring included, decorators
not. Prints each offender as ``path:line: what`` and exits 1 when
there is one.

    python tools/check_sizes.py [--module-lines 450] [--function-lines 60] [PATH ...]
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIBRARY = ("imgprep", "loaders")


def functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def offences(path: Path, module_lines: int, function_lines: int) -> list[str]:
    text = path.read_text("utf-8")
    rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    found = []
    if (n := len(text.splitlines())) > module_lines:
        found.append(f"{rel}:1: module has {n} lines (limit {module_lines})")
    for fn in functions(ast.parse(text, str(path))):
        length = (fn.end_lineno or fn.lineno) - fn.lineno + 1
        if length > function_lines:
            found.append(f"{rel}:{fn.lineno}: function {fn.name} has {length} lines "
                         f"(limit {function_lines})")
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", type=Path)
    ap.add_argument("--module-lines", type=int, default=450)
    ap.add_argument("--function-lines", type=int, default=60)
    args = ap.parse_args(argv)
    roots = args.paths or [REPO / d for d in LIBRARY]
    files = sorted(p for r in roots for p in ([r] if r.is_file() else r.rglob("*.py")))
    found = [o for p in files for o in offences(p, args.module_lines, args.function_lines)]
    for o in found:
        print(o)
    print(f"check_sizes: {len(files)} files, {len(found)} over the limits", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
