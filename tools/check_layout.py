"""Check that imports run with the grain, and that there are no import cycles.

Between the top-level folders (tests may import anything; nothing imports ``scripts``)::

    scripts  ->  loaders  ->  imgprep
    harness  ->  bench  ->  loaders, imgprep
    tools: nothing of the project

``scripts``, ``bench`` and ``harness`` reach the library only through its public face, the
names in ``imgprep.__all__`` and ``loaders.__all__`` (read as ``public_names`` says), or
through the white-box modules named
in ``WHITE_BOX`` below (docs/development.md says why each is needed); ``loaders`` reaches
``imgprep`` the same way. Inside ``imgprep``,
each room (subpackage) imports only rooms below it:

    cli  ->  convert, stage  ->  inputs  ->  shards  ->  job  ->  leaf modules

(``convert`` and ``stage`` do not import each other; the leaf modules at the top of the
package import no room, except the package's public face, ``__init__`` and ``__main__``).
Inside ``harness``, a room (``cluster``, ``reliability``, ``rehearsal``) imports no other
room, only the modules at the top of ``harness`` (``checks``).

``harness`` reaches ``bench`` only through the modules named in ``HARNESS_BENCH``, each from
the harness rooms named there (docs/development.md says what each takes).

Every import is checked, those inside functions too, since a deferred import is still a
dependency, and those in a string that is Python code (a ``python -c`` script run as a child):
such a string imports nothing of the library (``imgprep``, ``loaders``), whose walls it would
pass unseen; the child's code goes in a module run with ``python -m``, where these rules see
it. Every import cycle between modules of the project is reported, deferred imports included
(imports under ``if TYPE_CHECKING:`` never run, and a string's run in another process: they
are checked for direction only). Prints one line per problem and exits 1 if there is any.

    python tools/check_layout.py
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("imgprep", "loaders", "scripts", "bench", "harness", "tools")
MAY_IMPORT = {  # top-level folder -> the folders it may import besides itself
    "imgprep": (),
    "loaders": ("imgprep",),
    "scripts": ("loaders", "imgprep"),
    "bench": ("loaders", "imgprep"),
    "harness": ("bench", "loaders", "imgprep"),
    "tools": (),
}
LIBRARY = ("imgprep", "loaders")
OUTSIDE = ("scripts", "bench", "harness")  # held to the public face and the white-box list
HELD = {"loaders": ("imgprep",), **{f: LIBRARY for f in OUTSIDE}}  # folder -> faces it keeps to
WHITE_BOX = {  # module -> why benchmarks and harnesses need it (docs/development.md)
    "imgprep.shards.writers": "tar records and the shard writer, for inputs and shard sets "
                              "written at memory speed",
    "imgprep.shards.tario": "a shard's samples read back, for the loaders' and verify's floors",
    "imgprep.shards.manifest": "write_manifest and index_name, for shard sets assembled from "
                               "repeated shards",
    "imgprep.shards.index": "write_index, the sample index of an assembled shard set; "
                            "read_index, where the loaders read each sample",
    "imgprep.shards.tarfmt": "the tar headers the loaders check before reading a sample",
    "imgprep.shards.layout": "Layout, where each sample of an assembled shard lies",
    "imgprep.inputs.keys": "member_key, the key every input form gives an image",
    "imgprep.inputs.spool": "the staging copy of a form without random access, timed alone",
    "imgprep.inputs.fakes.parquet": "the Hub's parquet layout, from the benchmark's images",
    "imgprep.inputs.fakes.targz": "the Hub's tar.gz layout, from the benchmark's images",
    "imgprep.inputs.fakes.wds": "a webdataset shard set, written from the benchmark's own images",
    "imgprep.inputs.parquetio": "a parquet file's images read alone (the container's own cost)",
    "imgprep.inputs.forms.parquet": "the parquet form's staging copy, timed alone",
    "imgprep.inputs.forms.targz": "the tar.gz form's staging copy, timed alone",
    "imgprep.inputs.fakeset": "synthetic photos and JPEG pools for inputs of any size",
    "imgprep.inputs.synsets": "the published validation labels and the file that holds them",
    "imgprep.inputs.devkit": "the 2012 devkit's ID map and the file that holds it",
    "imgprep.inputs.sources": "list_source, convert's listing timed alone",
    "imgprep.convert.tasks": "make_plan, convert's planning timed alone",
    "imgprep.convert.image": "convert_image, convert's per-image work timed alone",
    "imgprep.convert.native": "one_call, the C path's call per image alone: convert's floor",
    "imgprep.convert.pillowpath": "convert_pillow, transform version 1, the reference the C "
                                  "path's output is compared with",
    "imgprep.job.assign": "balanced_split, the whole-shard plans the shuffle study compares",
    "imgprep.procs": "die_with_parent, for the harnesses' own children",
    "loaders.transforms": "the Pillow path's stages (crop_box, geometry, apply, into_chw), "
                          "timed one by one",
    "imgprep.jpegcrop": "the crop-aware decoder's stages, timed one by one; the extension "
                        "module the fuzz target drives",
    "imgprep.resample": "the resampler timed alone, beside the installed Pillow's resize",
    "imgprep.augment": "the per-sample augmentation ops the loaders carry out (Op, apply, "
                       "Pillow's matrices), timed alone beside stock Pillow's calls",
    "imgprep.rawformat": "the stored-pixel record's header and member extensions, where the "
                         "loaders and the benchmarks read stored-pixel samples",
    "imgprep.rawpixels": "stored-pixel records made and carried to a batch row (the loaders' "
                         "per-sample call; FFCV's raw images in its storage modes)",
    "imgprep.cropdraw": "a random-resized crop's box and flip drawn in the extension from the "
                        "sample's generator (the loaders' train transform)",
    "imgprep.convert.store": "the key hash that picks the images a mixed store keeps as pixels, "
                             "so that FFCV's proportion modes keep the same ones",
    "imgprep.imagefile": "an image opened for Pillow as convert opens it: the accepted formats, "
                         "the per-image budget, the damage rule, decoder failures as errors",
    "imgprep.budget": "the per-image budget's limits, the declared sizes the fuzz mutators aim at",
    "loaders.shards": "open_shards, where each sample's bytes lie, to check batch labels",
    "imgprep.stage.fanout_net": "NET_CHUNK and IN_FLIGHT, for a Gloo floor streamed as "
                                "fan-out streams",
    "loaders.nvjpeg": "the nvjpeg backend's decodes (nvJPEG's batch, Pillow's fallback), timed "
                      "alone by the GPU kit's spike",
    "loaders.batchcrop": "the batched crop, resize and flip, timed alone by the GPU kit's spike",
    "imgprep.cli.commands": "main, the imgprep command run in a child that counts its reads",
}
# bench module -> the harness rooms that may import it (None: every room and harness's top)
HARNESS_BENCH: dict[str, tuple[str, ...] | None] = {
    "bench.common": None,  # the repository root, ports, verdicts, CPU-noise and process trees
    "bench.scaling": ("cluster",),  # summarise: the cluster box's scaling table
    "bench.convert": ("gpukit",),  # the GPU kit's conversion floor and timing
}
LEAF = "leaf"
RANK = {"cli": 5, "convert": 4, "stage": 4, "inputs": 3, "shards": 2, "job": 1, LEAF: 0}
FACE = {"imgprep/__init__.py", "imgprep/__main__.py"}  # the package's public face
IMPORT_WORD = re.compile(r"\b(?:import|from)\s+[A-Za-z_]")  # a string that may import


@dataclass(frozen=True)
class Import:
    """One imported module (``names``: what ``from module import`` took from it)."""

    line: int
    module: str
    names: tuple[str, ...] = ()
    typing_only: bool = False
    in_string: bool = False  # in a string that is Python code, run by a child process


@dataclass(frozen=True)
class Module:
    name: str  # dotted, from the repository root (scripts' own modules under ``scripts.``)
    path: Path
    rel: str  # the path from the repository root
    is_package: bool

    @property
    def folder(self) -> str:
        return self.name.split(".")[0]


def find_modules(repo: Path) -> dict[str, Module]:
    """Every module of the checked folders, by dotted name."""
    out = {}
    for top in FOLDERS:
        for path in sorted((repo / top).rglob("*.py")):
            parts = path.relative_to(repo).with_suffix("").parts
            package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if package else parts)
            out[name] = Module(name, path, path.relative_to(repo).as_posix(), package)
    return out


def _typing_lines(tree: ast.AST) -> set[int]:
    """Line numbers of the statements under ``if TYPE_CHECKING:``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for stmt in node.body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def imports(mod: Module, known: dict[str, Module]) -> Iterator[Import]:
    """Every import in ``mod``, those in strings that are Python code included: relative ones
    resolved, ``from a import b`` named ``a.b`` when that is a module, a script's own modules
    named as the folder it runs from sees them."""
    tree = ast.parse(mod.path.read_text(), str(mod.path))
    yield from _imports_in(tree, mod, known, _typing_lines(tree))
    for line, code in code_strings(tree):
        for imp in _imports_in(code, mod, known, set()):
            yield replace(imp, line=line + imp.line - 1, in_string=True)


def _imports_in(tree: ast.AST, mod: Module, known: dict[str, Module],
                typing: set[int]) -> Iterator[Import]:
    package = mod.name.split(".") if mod.is_package else mod.name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(node.lineno, _own(alias.name, mod, known), (),
                             node.lineno in typing)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base
                                                                           else []))
            base = _own(base, mod, known)
            plain = []
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    yield Import(node.lineno, f"{base}.{alias.name}", (), node.lineno in typing)
                else:
                    plain.append(alias.name)
            if plain:
                yield Import(node.lineno, base, tuple(plain), node.lineno in typing)


def code_strings(tree: ast.AST) -> Iterator[tuple[int, ast.Module]]:
    """The strings of ``tree`` that are Python code holding an import (a ``python -c``
    script, however it is run), parsed, each with the line it starts on; docstrings are
    prose, and an f-string counts with each placeholder read as a name."""
    prose = _docstrings(tree)
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
             for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) in prose or id(node) in parts:
                continue
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(str(v.value) if isinstance(v, ast.Constant) else "_"
                           for v in node.values)
        else:
            continue
        if not IMPORT_WORD.search(text):
            continue
        try:
            code = ast.parse(textwrap.dedent(text))
        except SyntaxError:
            continue  # prose that mentions importing
        if any(isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(code)):
            yield node.lineno, code


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of ``tree``'s module, classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _own(name: str, mod: Module, known: dict[str, Module]) -> str:
    """``trainkit.x`` imported by a script is ``scripts.trainkit.x``: a script's folder is
    first on the path of the process that runs it."""
    if mod.folder == "scripts" and f"scripts.{name}" in known:
        return f"scripts.{name}"
    return name


def public_names(repo: Path, package: str) -> set[str]:
    """The names in ``package/__init__.py``'s ``__all__``: a list of literal names, where a
    starred entry (``*_LAZY``) stands for the names imported under the file's ``if
    TYPE_CHECKING:``, the face the package loads lazily and makes that table from
    (``imgprep/__init__.py``). Any other entry is a ``ValueError``: the check would not know
    the face."""
    path = repo / package / "__init__.py"
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            names: set[str] = set()
            for entry in getattr(node.value, "elts", [node.value]):
                if isinstance(entry, ast.Constant) and isinstance(entry.value, str):
                    names.add(entry.value)
                elif isinstance(entry, ast.Starred):
                    names |= typing_imports(tree)
                else:
                    raise ValueError(f"{path}:{node.lineno}: __all__ holds "
                                     f"{ast.unparse(entry)}; the layout check reads literal "
                                     "names and *<the table of the TYPE_CHECKING imports>")
            return names
    return set()


def typing_imports(tree: ast.Module) -> set[str]:
    """The names imported under a module's top-level ``if TYPE_CHECKING:``."""
    return {alias.asname or alias.name for node in tree.body if isinstance(node, ast.If)
            and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
            for imp in node.body if isinstance(imp, ast.ImportFrom) for alias in imp.names}


def room_of(module: str) -> str:
    """The room of an ``imgprep`` module: its subpackage, or ``leaf`` for top-level ones."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in RANK) else LEAF


def direction(mod: Module, imp: Import, public: dict[str, set[str]],
              known: dict[str, Module]) -> str | None:
    """What is wrong with ``imp`` in ``mod`` (None: it runs with the grain)."""
    mine, head = mod.folder, imp.module.split(".")[0]
    if imp.in_string and mine == "tools":
        return None  # tools/wheel_check.py: its children test the installed wheel, by design
    if imp.in_string and head in LIBRARY:
        return (f"it imports {imp.module} in a child process, past the white-box list and "
                "the rooms; put the child's code in a module run with python -m")
    if head not in FOLDERS or head == mine:
        return _inside(mod, imp, known)
    if head not in MAY_IMPORT[mine]:
        return (f"{mine} imports {imp.module}, which it may not: {mine} may import "
                f"{', '.join(MAY_IMPORT[mine]) or 'nothing of the project'}")
    if mine == "harness" and head == "bench":
        return _harness_bench(mod, imp, known)
    if head in HELD.get(mine, ()):
        if imp.module == head:
            hidden = sorted(set(imp.names) - public[head])
            if hidden:
                return (f"{mine} imports {', '.join(hidden)} from {head}, which are not in "
                        f"{head}.__all__")
        elif imp.module not in WHITE_BOX:
            return (f"{mine} imports {imp.module}: use {head}.__all__ or a white-box module "
                    "(tools/check_layout.py WHITE_BOX, docs/development.md)")
    return None


def _harness_bench(mod: Module, imp: Import, known: dict[str, Module]) -> str | None:
    """The harness reaches bench through ``HARNESS_BENCH`` alone, from the rooms named."""
    if imp.module not in HARNESS_BENCH:
        return (f"harness imports {imp.module}: the harness imports of bench only "
                f"{', '.join(HARNESS_BENCH)} (tools/check_layout.py HARNESS_BENCH, "
                "docs/development.md)")
    rooms, room = HARNESS_BENCH[imp.module], harness_room(mod.name, known)
    if rooms is not None and room not in rooms:
        return (f"harness {'room ' + room if room else 'top'} imports {imp.module}, which "
                f"only {', '.join(rooms)} may (tools/check_layout.py HARNESS_BENCH)")
    return None


def _inside(mod: Module, imp: Import, known: dict[str, Module]) -> str | None:
    """The rules between rooms of one folder: imgprep's ranks, harness's separate rooms."""
    if mod.folder == "imgprep" and imp.module.startswith("imgprep") and mod.rel not in FACE:
        mine, theirs = room_of(mod.name), room_of(imp.module)
        if mine != theirs and RANK[theirs] >= RANK[mine]:
            return (f"room {mine} imports {imp.module} (room {theirs}); rooms import only "
                    "rooms below them: cli -> convert, stage -> inputs -> shards -> job -> leaf")
    if mod.folder == "harness":
        here, there = harness_room(mod.name, known), harness_room(imp.module, known)
        if here and there and here != there:
            return (f"harness room {here} imports {imp.module} (room {there}); the "
                    "harness rooms share only the modules at the top of harness/")
    return None


def harness_room(module: str, known: dict[str, Module]) -> str | None:
    """The room (subpackage) of a ``harness`` module; None for the modules at its top."""
    parts = module.split(".")
    if parts[0] != "harness" or len(parts) < 2:
        return None
    room = known.get(f"harness.{parts[1]}")
    return parts[1] if room is not None and room.is_package else None


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One shortest cycle through each strongly connected group of modules (Tarjan's
    algorithm, iterative), as ``[a, b, ..., a]``; ``graph``: module -> {imported: line}."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        top = stack.pop()
                        on.discard(top)
                        group.add(top)
                        if top == node:
                            break
                    if len(group) > 1 or node in graph[node]:
                        groups.append(group)
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt in on:
                low[node] = min(low[node], index[nxt])
    return sorted(_shortest(graph, group) for group in groups)


def _shortest(graph: dict[str, dict[str, int]], group: set[str]) -> list[str]:
    """The shortest cycle inside ``group`` through its first module (breadth first)."""
    start = min(group)
    came: dict[str, str] = {}
    todo = [start]
    while todo:
        node = todo.pop(0)
        for nxt in sorted(graph[node]):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came[path[-1]])
                return [*reversed(path), start]
            if nxt in group and nxt not in came:
                came[nxt] = node
                todo.append(nxt)
    return [start, start]


def problems(repo: Path = REPO) -> list[str]:
    """Every import against the grain and every import cycle, as ``path:line: what``."""
    known = find_modules(repo)
    public = {p: public_names(repo, p) for p in LIBRARY}
    out: list[str] = []
    graph: dict[str, dict[str, int]] = {name: {} for name in known}
    for mod in known.values():
        for imp in imports(mod, known):
            wrong = direction(mod, imp, public, known)
            if wrong:
                where = "a string run as code: " if imp.in_string else ""
                out.append(f"{mod.rel}:{imp.line}: {where}{wrong}")
            if imp.module in known and not (imp.typing_only or imp.in_string):
                graph[mod.name].setdefault(imp.module, imp.line)
    for cycle in cycles(graph):
        first = known[cycle[0]]
        out.append(f"{first.rel}:{graph[cycle[0]][cycle[1]]}: import cycle: "
                   + " -> ".join(cycle))
    return out


def main() -> int:
    found = problems()
    for line in found:
        print(line)
    print(f"check_layout: {len(found)} problem(s): imports against the grain or cycles",
          file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
