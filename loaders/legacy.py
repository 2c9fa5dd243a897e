"""The options as loose arguments, the form before ``LoaderOptions`` was passed: deprecated.

``make_loader``, ``ShardLoader`` and ``LabelListLoader`` take one ``LoaderOptions``. For one
release they still accept the old calls, ``make_loader(data, split, world, 256, seed=0,
tail="pad")``: ``batch_size``, ``workers`` and ``seed`` in the record's place (in that order,
the record's first three fields) and any field of the record as a keyword; the arguments
before the record positional or by name (``make_loader(data, split="train", world=world,
batch_size=64)``). Such a call warns (``DeprecationWarning``) and goes on with the record made
from those values, so it loads what it loaded before; a name the record does not have is
refused as ``LoaderOptions`` refuses it.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from dataclasses import fields
from typing import Any, ParamSpec, TypeVar

from loaders.config import LoaderOptions

P = ParamSpec("P")
R = TypeVar("R")
NAMES = tuple(f.name for f in fields(LoaderOptions))
POSITIONAL = 3  # the old calls' batch_size, workers and seed


def takes_loose_options(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn``, whose parameter ``options`` takes a ``LoaderOptions``, also called the old
    way (module docstring): with a warning, and the record made from the loose values."""
    at = list(inspect.signature(fn).parameters).index("options")
    name = fn.__qualname__.removesuffix(".__init__")

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> R:
        loose = {k: kwargs.pop(k) for k in NAMES if k in kwargs}
        head, rest = args[:at], args[at:]
        if not loose and (not rest or isinstance(rest[0], LoaderOptions)):
            return fn(*args, **kwargs)
        if "options" in kwargs or len(rest) > POSITIONAL \
                or any(isinstance(a, LoaderOptions) for a in rest):
            raise TypeError(f"{name}: pass one LoaderOptions after the World (or, deprecated, "
                            f"batch_size, workers and seed and the options' keywords), not "
                            "both")
        warnings.warn(f"{name}(..., batch_size=..., ...) with loose options is deprecated: "
                      f"pass one record, {name}(..., LoaderOptions(batch_size=..., ...)); "
                      "the loose form goes in the next release", DeprecationWarning,
                      stacklevel=2)
        options = LoaderOptions(**dict(zip(NAMES, rest, strict=False)), **loose)
        # by name: the arguments before it may have come as keywords (split=..., world=...)
        return fn(*head, options=options, **kwargs)  # type: ignore[arg-type]

    return call
