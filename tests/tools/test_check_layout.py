"""The layout check (tools/check_layout.py): the import rules between folders and rooms, the
public face and the white-box list, the bench modules the harness may use, imports in
strings run as code, and import cycles, on small trees made here; and the repository
itself."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tests.support import REPO
from tools.check_layout import HARNESS_BENCH, WHITE_BOX, problems, public_names

TREE = {
    "imgprep/__init__.py": '__all__ = ["World", "convert_splits"]\n',
    "imgprep/errors.py": "",
    "imgprep/job/__init__.py": "",
    "imgprep/job/world.py": "from imgprep.errors import *\n",
    "imgprep/shards/__init__.py": "",
    "imgprep/shards/writers.py": "",
    "imgprep/shards/index.py": "from imgprep.shards import dali\n",
    "imgprep/shards/dali.py": "def f():\n    from imgprep.shards.index import g\n",
    "imgprep/convert/__init__.py": "",
    "imgprep/convert/run.py": "from typing import TYPE_CHECKING\n",
    "loaders/__init__.py": '__all__ = ["ShardLoader"]\n',
    "loaders/base.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    from loaders.backends import B\n",
    "loaders/backends.py": "from loaders.base import A\n",
    "scripts/train.py": "from trainkit import models\nfrom imgprep import World\n",
    "scripts/trainkit/__init__.py": "",
    "scripts/trainkit/models.py": "from .timing import Clock\nfrom loaders import ShardLoader\n",
    "scripts/trainkit/timing.py": "",
    "bench/__init__.py": "",
    "bench/common.py": "",
    "harness/__init__.py": "",
    "harness/checks.py": "",
    "harness/cluster/__init__.py": "",
    "harness/cluster/box.py": "from harness.checks import x\nfrom bench.common import y\n",
    "harness/rehearsal/__init__.py": "",
    "tools/check.py": "import ast\n",
}


def found(root: Path, extra: dict[str, str] | None = None) -> list[str]:
    """``problems`` of ``TREE`` plus ``extra`` (path -> text) written under ``root``."""
    for rel, text in {**TREE, **(extra or {})}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return problems(root)


def test_imports_with_the_grain_pass_and_a_deferred_loop_is_a_cycle(tmp_path: Path) -> None:
    """scripts' own kit (absolute from the script, relative inside it), the public face, the
    white-box list, a harness's shared modules and bench; a typing-only back edge is no loop;
    the one loop closed inside a function is reported with its path."""
    assert found(tmp_path) == [
        "imgprep/shards/dali.py:2: import cycle: imgprep.shards.dali -> imgprep.shards.index"
        " -> imgprep.shards.dali"]


def test_against_the_grain_is_named_with_its_line(tmp_path: Path) -> None:
    out = found(tmp_path, {
        "bench/stage.py": "import os\nfrom imgprep.job.world import World\n",
        "bench/loader.py": "from imgprep import World, Hidden\n",
        "bench/scaling.py": "from scripts.trainkit import models\n",
        "harness/rehearsal/run.py": "from harness.cluster.box import Box\n",
        "loaders/device.py": "from bench.common import x\n",
        "imgprep/job/assign.py": "from imgprep.shards.writers import w\n",
        "scripts/make.py": "from imgprep.shards.writers import w\n",  # white-box: fine
        "tools/more.py": "from imgprep import World\n"})
    cycle = [p for p in out if "import cycle" in p]
    assert len(cycle) == 1
    by_file = {p.split(":")[0]: p for p in out if p not in cycle}
    assert set(by_file) == {"bench/stage.py", "bench/loader.py", "bench/scaling.py",
                            "harness/rehearsal/run.py", "loaders/device.py",
                            "imgprep/job/assign.py", "tools/more.py"}
    assert by_file["bench/stage.py"].startswith("bench/stage.py:2: bench imports "
                                                "imgprep.job.world: use imgprep.__all__")
    assert "Hidden from imgprep, which are not in imgprep.__all__" in by_file["bench/loader.py"]
    assert "bench imports scripts.trainkit" in by_file["bench/scaling.py"]
    assert "harness room rehearsal imports harness.cluster.box" in by_file[
        "harness/rehearsal/run.py"]
    assert "loaders imports bench.common" in by_file["loaders/device.py"]
    assert "room job imports imgprep.shards.writers (room shards)" in by_file[
        "imgprep/job/assign.py"]
    assert "tools may import nothing of the project" in by_file["tools/more.py"]


def test_loaders_reach_imgprep_through_its_public_face_or_the_white_box_list(
        tmp_path: Path) -> None:
    out = found(tmp_path, {
        "loaders/epochs.py": "from imgprep import World\n",  # the public face: fine
        "loaders/reader.py": "from imgprep.shards.writers import w\n",  # white-box: fine
        "loaders/shards.py": "import numpy\nfrom imgprep.job.world import World\n",
        "loaders/config.py": "from imgprep import World, Hidden\n"})
    hidden = sorted(p for p in out if "import cycle" not in p)
    assert hidden == [
        "loaders/config.py:1: loaders imports Hidden from imgprep, which are not in "
        "imgprep.__all__",
        "loaders/shards.py:2: loaders imports imgprep.job.world: use imgprep.__all__ or a "
        "white-box module (tools/check_layout.py WHITE_BOX, docs/development.md)"]


def test_a_face_made_from_its_typing_imports_is_read_as_its_names(tmp_path: Path) -> None:
    """``__all__ = ["__version__", *_LAZY]``: the literal names and those imported under
    ``if TYPE_CHECKING:`` (the lazily loaded face); another entry is refused, naming it."""
    face = ('from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n'
            '    from imgprep.job.world import World\n_LAZY = {}\n'
            '__all__ = ["__version__", *_LAZY]\n')
    out = found(tmp_path, {"imgprep/__init__.py": face,
                           "bench/loader.py": "from imgprep import World, __version__\n",
                           "bench/stage.py": "from imgprep import convert_splits\n"})
    assert [p for p in out if "import cycle" not in p] == [
        "bench/stage.py:1: bench imports convert_splits from imgprep, which are not in "
        "imgprep.__all__"]
    (tmp_path / "imgprep/__init__.py").write_text("__all__ = sorted(NAMES)\n")
    with pytest.raises(ValueError, match=r"__all__ holds sorted\(NAMES\)"):
        public_names(tmp_path, "imgprep")


@pytest.mark.parametrize("package", ["imgprep", "loaders"])
def test_the_face_the_check_reads_is_the_packages_own(package: str) -> None:
    assert public_names(REPO, package) == set(importlib.import_module(package).__all__)


def test_the_repository_imports_with_the_grain() -> None:
    """No import against the grain (cycles are listed by the check, and are to go)."""
    assert [p for p in problems(REPO) if "import cycle" not in p] == []


def test_every_white_box_module_is_documented_with_its_reason() -> None:
    doc = (REPO / "docs" / "development.md").read_text()
    assert [m for m in WHITE_BOX if f"`{m}`" not in doc] == []


def test_an_import_of_the_library_in_a_string_run_as_code_is_reported(tmp_path: Path) -> None:
    """A ``python -c`` script's imports are checked like the module's own: the library not at
    all (even a white-box module or the public face: the child passes every wall unseen);
    docstrings and prose are not code; an import in a string closes no cycle."""
    out = found(tmp_path, {
        "bench/stage.py": 'P2P = """\nimport sys\nfrom imgprep.shards.writers import w\n"""\n',
        "bench/loader.py": 'CODE = f"import os, imgprep; print({1})"\n',
        "bench/doc.py": '"""Run it as\n\n    from imgprep.job.world import World\n"""\n',
        "bench/prose.py": 'SAY = "import the images from imgprep.job first"\n',
        "scripts/run.py": 'CODE = "from harness.checks import x"\n',
        "harness/rehearsal/run.py": 'MAIN = "import json; from harness.rehearsal.run import m"\n',
        "imgprep/job/assign.py": 'CODE = "from imgprep.job.world import W"\n'})
    assert sorted(p for p in out if "import cycle" not in p) == [
        "bench/loader.py:1: a string run as code: it imports imgprep in a child process, past "
        "the white-box list and the rooms; put the child's code in a module run with python -m",
        "bench/stage.py:3: a string run as code: it imports imgprep.shards.writers in a child "
        "process, past the white-box list and the rooms; put the child's code in a module run "
        "with python -m",
        "imgprep/job/assign.py:1: a string run as code: it imports imgprep.job.world in a "
        "child process, past the white-box list and the rooms; put the child's code in a "
        "module run with python -m",
        "scripts/run.py:1: a string run as code: scripts imports harness.checks, which it may "
        "not: scripts may import loaders, imgprep"]
    assert not any("harness/rehearsal/run.py" in p for p in out)  # its own module: no cycle


def test_the_harness_reaches_bench_through_its_named_modules_from_their_rooms(
        tmp_path: Path) -> None:
    out = found(tmp_path, {
        "bench/scaling.py": "", "bench/convert.py": "", "bench/loader.py": "",
        "harness/checks.py": "from bench.common import REPO\n",
        "harness/cluster/bench.py": "from bench.scaling import summarise\n",
        "harness/gpukit/__init__.py": "",
        "harness/gpukit/convert.py": "from bench.convert import floor_one\n",
        "harness/rehearsal/run.py": "from bench.scaling import summarise\n",
        "harness/rehearsal/measure.py": "import bench.loader\n"})
    assert [p for p in out if "import cycle" not in p] == [
        "harness/rehearsal/measure.py:1: harness imports bench.loader: the harness imports of "
        "bench only bench.common, bench.scaling, bench.convert (tools/check_layout.py "
        "HARNESS_BENCH, docs/development.md)",
        "harness/rehearsal/run.py:1: harness room rehearsal imports bench.scaling, which only "
        "cluster may (tools/check_layout.py HARNESS_BENCH)"]


def test_every_bench_module_the_harness_uses_is_documented_with_its_rooms() -> None:
    doc = (REPO / "docs" / "development.md").read_text()
    assert [m for m in HARNESS_BENCH if f"`{m}`" not in doc] == []
