"""Decoding backends by name: what turns a rank's plan into batches.

Every backend makes the same plan's batches (``loaders.base``: plans, tails, resume and the
error rule are shared); they differ only in how samples are decoded:

- ``pillow``: pillow-simd in persistent worker processes (``loaders.base.WorkerBatches``);
- ``dali``: NVIDIA DALI in threads of the loader's process, on the CPU or, with
  ``device="gpu"``, with nvJPEG on this rank's GPU (``loaders.dali.DaliBatches``); an
  optional extra, ``pip install 'imgprep[dali]'``.

A backend's module is imported when the backend is first asked for, so ``import loaders``
never imports DALI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

from loaders.common import LoaderError

if TYPE_CHECKING:
    from loaders.base import Batches, Config, Options, Source

BACKENDS = {"pillow": "loaders.base:WorkerBatches", "dali": "loaders.dali:DaliBatches"}
EXTRAS = {"dali": ("nvidia.dali", "NVIDIA DALI", "imgprep[dali]")}  # what a backend needs


class MakeBatches(Protocol):
    def __call__(self, cfg: Config, source: Source, options: Options) -> Batches: ...


def backend_class(name: str) -> MakeBatches:
    """The class of backend ``name``; a ``LoaderError`` naming the extra to install when its
    library cannot be imported, a ``ValueError`` for a name no backend has."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {tuple(BACKENDS)}, not {name!r}")
    if name in EXTRAS:
        module, what, extra = EXTRAS[name]
        try:
            importlib.import_module(module)
        except (ImportError, OSError) as e:  # not installed, or its libraries do not load
            reason = (str(e).splitlines() or [type(e).__name__])[0]
            raise LoaderError(f"backend={name!r} needs {what}, which cannot be imported "
                              f"({reason}); install it with pip install '{extra}'") from None
    path, _, attr = BACKENDS[name].partition(":")
    made: MakeBatches = getattr(importlib.import_module(path), attr)
    return made
