"""Stored-pixel sets for the tests: a converted folder's shards rewritten with
``--from-shards`` (the JPEGs decoded, nothing else read), one folder a store mode."""

from __future__ import annotations

from pathlib import Path

from imgprep.convert.fromshards import from_shards
from imgprep.sections import StoreOptions

STORES = {"yuv420": StoreOptions(mode="yuv420"), "rgb": StoreOptions(mode="rgb"),
          "mixed": StoreOptions(mode="mixed", fraction=0.5)}


def stored_sets(jpeg: Path, root: Path, modes: tuple[str, ...] = tuple(STORES)
                ) -> dict[str, Path]:
    """``jpeg`` (a converted folder) and its shards kept as each of ``modes``, by name."""
    out = {"jpeg": jpeg}
    for mode in modes:
        out[mode] = root / mode
        from_shards(jpeg, out[mode], STORES[mode], workers=1)
    return out
