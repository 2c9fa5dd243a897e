"""The loaders' options (``loaders.config.LoaderOptions``): one home for their defaults and
checks, keyword-only construction, and decoder backends imported only when asked for."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from imgprep.errors import ImgprepError
from imgprep.job.world import World
from loaders import (
    LabelListLoader,
    LoaderOptions,
    ShardLoader,
    TrainTransform,
    ValTransform,
    make_loader,
)
from tests.support import REPO, jpeg
from tests.support.shards import write_split

OWN_DEFAULT = {make_loader: {"workers": "auto"}}  # make_loader sizes workers from the cores


@pytest.mark.parametrize("entry", [make_loader, ShardLoader, LabelListLoader],
                         ids=["make_loader", "ShardLoader", "LabelListLoader"])
def test_every_entry_names_each_option_with_the_options_default(entry: Callable[..., Any]
                                                                ) -> None:
    params = inspect.signature(entry).parameters
    for f in dataclasses.fields(LoaderOptions):
        assert f.name in params, f"{entry.__name__} does not take {f.name}"
        own = f.default if f.default is not dataclasses.MISSING else inspect.Parameter.empty
        want = OWN_DEFAULT.get(entry, {}).get(f.name, own)
        assert params[f.name].default == want, f.name
        if f.name not in ("batch_size", "workers", "seed"):
            assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY, f.name


@pytest.mark.parametrize("bad", [
    {"batch_size": 0}, {"workers": -1}, {"tail": "sideways"}, {"on_error": "ignore"},
    {"prefetch_factor": 0}, {"device": "tpu"}, {"transform": "center"},
    {"memory_format": "nhwc"}, {"order_version": 3},
], ids=lambda bad: next(iter(bad)))
def test_a_wrong_option_fails_before_anything_is_read(tmp_path: Path, bad: dict[str, Any]
                                                       ) -> None:
    options = {"batch_size": 4, **bad}
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name) as shards:
        ShardLoader(tmp_path / "missing", "train", World(), **options)
    with pytest.raises(ValueError, match=name) as listed:
        LabelListLoader(tmp_path / "missing.txt", World(), **options)
    assert not isinstance(shards.value, ImgprepError)  # not the missing data's error
    assert not isinstance(listed.value, ImgprepError)


def test_list_options_are_refused_for_a_folder_whose_manifest_says_them(tmp_path: Path
                                                                         ) -> None:
    write_split(tmp_path, "train", [3, 2], lambda i: jpeg((64, 64), seed=i))
    with pytest.raises(ValueError, match="num_classes"):
        make_loader(tmp_path, "train", World(), 2, workers=0, num_classes=10)


def test_a_label_list_is_loaded_whole_by_every_rank(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(jpeg((64, 64), seed=1))
    (tmp_path / "l.txt").write_text("a.jpg 0\n")
    with pytest.raises(ValueError, match="replicate"):
        make_loader(tmp_path / "l.txt", "train", World(), 1, workers=0, mode="partition")
    loader = make_loader(tmp_path / "l.txt", "val", World(), 1, workers=0, mode="replicate",
                         transform=ValTransform(size=32, resize=32))
    assert [labels.tolist() for _, labels in loader] == [[0]]


def test_options_and_transforms_are_keyword_only_and_checked() -> None:
    with pytest.raises(TypeError):
        TrainTransform(224)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        LoaderOptions(4)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="scale"):
        TrainTransform(scale=(0.5, 0.2))
    with pytest.raises(ValueError, match="resize"):
        ValTransform(resize=0)
    cfg = LoaderOptions(batch_size=2).config(train=False, samples=[3], world=World(),
                                             mode="replicate", layout_seed=0)
    assert (cfg.tail, cfg.shuffle, cfg.transform) == ("pad", False, ValTransform())
    with pytest.raises(ValueError, match="mode"):
        LoaderOptions(batch_size=2).config(train=True, samples=[3], world=World(),
                                           mode="scatter", layout_seed=0)


def test_import_loaders_imports_no_decoder_backend() -> None:
    code = ("import sys, loaders; print(sorted(m for m in sys.modules if m in "
            "('loaders.pillow', 'loaders.dali', 'nvidia.dali')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert out.strip() == "[]"
