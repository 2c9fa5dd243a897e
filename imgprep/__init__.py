"""imgprep: ImageNet-scale data preparation for data-parallel training.

Converts ILSVRC2012 (nested tars, folders, validation ground truth in any common form) into
256 px RGB label lists or checksummed webdataset shards, deterministically and resumably,
and stages them onto each node's local disk.

The public API is what ``__all__`` names; everything else may move between releases. Each
name is written once, in the imports under ``if TYPE_CHECKING:`` below (what mypy reads);
``__all__`` and the table of the modules they load from (``_LAZY``) are made from those
lines. The names load on first use, so ``import imgprep`` stays cheap for the command line:

    from imgprep import ConvertOptions, World, convert_splits, detect, stage_to_node, verify

Warnings and notes go to the ``imgprep`` logger (``logging.getLogger("imgprep")`` and its
children, one a module); the library adds no handler but a ``NullHandler``, so an application
decides where they go (the ``imgprep`` command prints them on stderr).

Inside the package, rooms by concern, each importing only the rooms below it:
``cli`` -> ``convert``, ``stage`` -> ``inputs`` -> ``shards`` -> ``job`` -> the leaf modules
at the top (``errors``, ``fsutil``, ``procs``, ``sections``: the manifest's typed sections).
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgprep.errors import DependencyError

__version__ = "0.1.0"
PIL_MINIMUM = "11.2"  # Image.im.__arrow_c_array__, which imgprep.jpegcrop.pack reads
PIL_ONE_LINER = "pip install 'imgprep[pillow]'"  # pyproject.toml's extra: pillow>=PIL_MINIMUM


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:2])


def _require_pil() -> None:
    """PIL is needed but not declared (pip cannot say "Pillow or pillow-simd", and each would
    replace the other): refuse to import without it, saying the one-liner that brings it."""
    try:
        import PIL
    except ImportError as e:
        raise DependencyError(
            f"imgprep needs PIL, which this Python ({sys.executable}) does not have: "
            f"{PIL_ONE_LINER} installs stock Pillow (or build pillow-simd: make setup; "
            "docs/install.md)") from e
    if _release(PIL.__version__) < _release(PIL_MINIMUM):
        raise DependencyError(
            f"imgprep needs PIL {PIL_MINIMUM} or later; this Python ({sys.executable}) has "
            f"{PIL.__version__} ({PIL.__file__}): pip install -U 'pillow>={PIL_MINIMUM}', or "
            "rebuild pillow-simd (make setup; docs/install.md)")


_require_pil()

if TYPE_CHECKING:  # the public face, each name once: what mypy reads, and _LAZY and __all__
    from imgprep.convert.fromshards import Restored, from_shards
    from imgprep.convert.options import ConvertOptions
    from imgprep.convert.run import convert_splits
    from imgprep.convert.summary import ConvertSummary
    from imgprep.errors import (
        ImageError,
        ImgprepError,
        InputMissingError,
        LabelError,
        ManifestError,
        OutputError,
        OutputExistsError,
        ShardError,
        SourceFormatError,
        StageError,
        UnsafeArchiveError,
        WaitTimeout,
        WorldError,
    )
    from imgprep.fsutil import atomic_open, write_bytes_atomic
    from imgprep.inputs.fakeset import FakeSummary, make_sample
    from imgprep.inputs.synsets import ClassTable, imagenet_classes, load_class_table
    from imgprep.job.assign import MODES, node_shards
    from imgprep.job.cpus import CpuPlan, cpu_list, pin_threads, read_limits, unpin_threads
    from imgprep.job.rendezvous import Rendezvous, RendezvousError, rendezvous
    from imgprep.job.world import World, detect
    from imgprep.sections import ManifestOptions, SourceSection, StoreOptions, TransformOptions
    from imgprep.shards.indexing import IndexedSplit, index_folder
    from imgprep.shards.info import PilInfo, pil_info
    from imgprep.shards.manifest import Manifest, ShardEntry, manifest_path, read_manifest
    from imgprep.shards.verify import verify
    from imgprep.stage.options import StageOptions
    from imgprep.stage.run import stage_to_node


def _face() -> dict[str, str]:
    """Each name of the public face -> the module it loads from: the imports under ``if
    TYPE_CHECKING:`` above, read from this file (at run time they import nothing)."""
    import ast

    tree = ast.parse(Path(__file__).read_text("utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    return {alias.asname or alias.name: imp.module for imp in block.body
            if isinstance(imp, ast.ImportFrom) and imp.module for alias in imp.names}


_LAZY = _face()

logging.getLogger(__name__).addHandler(logging.NullHandler())


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'imgprep' has no attribute {name!r}")


__all__ = ["__version__", *_LAZY]
