"""The loaders' options (``loaders.config.LoaderOptions``): one record every entry takes,
one home for their defaults and checks, resolved once per loader, keyword-only construction,
the loose form deprecated, and decoder backends imported only when asked for."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

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
from loaders.config import ResolvedOptions
from tests.support import REPO, jpeg
from tests.support.shards import write_label_list, write_split

ENTRIES = {"make_loader": make_loader, "ShardLoader": ShardLoader,
           "LabelListLoader": LabelListLoader}


@pytest.mark.parametrize("name", ENTRIES)
def test_every_entry_takes_the_one_record_and_restates_none_of_its_fields(name: str) -> None:
    params = inspect.signature(ENTRIES[name], eval_str=True).parameters
    assert params["options"].annotation is LoaderOptions
    restated = {f.name for f in dataclasses.fields(LoaderOptions)} & set(params)
    assert not restated, f"{name} restates {sorted(restated)}"


@pytest.mark.parametrize("bad", [
    {"batch_size": 0}, {"workers": -1}, {"workers": "many"}, {"tail": "sideways"},
    {"on_error": "ignore"}, {"prefetch_factor": 0}, {"device": "tpu"},
    {"transform": "center"}, {"memory_format": "nhwc"}, {"order_version": 3},
], ids=lambda bad: next(iter(bad)))
def test_a_wrong_option_fails_when_the_record_is_made(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))) as made:
        LoaderOptions(**{"batch_size": 4, **bad})
    assert not isinstance(made.value, ImgprepError)  # a programming error, not the data's


def test_the_record_is_resolved_once_for_a_split_and_a_rank() -> None:
    options = LoaderOptions(batch_size=2, tail="short")
    val = options.resolve(train=False, world=World())
    assert (val.tail, val.shuffle, val.transform) == ("short", False, ValTransform())
    train = options.resolve(train=True, world=World())
    assert (train.shuffle, train.transform) == (True, TrainTransform())
    assert isinstance(train.workers, int) and train.workers >= 1  # "auto": the rank's cores
    assert isinstance(train.pin_memory, bool)
    assert dataclasses.replace(train, workers=0).batch_size == 2
    with pytest.raises(ValueError, match="tail left open"):
        ResolvedOptions(**{f.name: getattr(train, f.name)
                           for f in dataclasses.fields(train)} | {"tail": None})


@pytest.mark.parametrize("name", ENTRIES)
def test_the_loose_form_is_deprecated_and_loads_what_the_record_loads(tmp_path: Path,
                                                                      name: str) -> None:
    image = lambda i: jpeg((64, 64), seed=i)  # noqa: E731
    write_split(tmp_path, "train", [3, 2], image)
    head: tuple[Any, ...] = (tmp_path, "train", World())
    if name == "LabelListLoader":
        head = (write_label_list(tmp_path / "list", 5, image), World())
    transform = TrainTransform(size=16)
    entry = ENTRIES[name]
    record = entry(*head, LoaderOptions(batch_size=2, workers=0, seed=3, transform=transform))
    with pytest.warns(DeprecationWarning, match="LoaderOptions"):
        loose = entry(*head, 2, 0, seed=3, transform=transform)
    assert loose.options == record.options
    for (a, x), (b, y) in zip(loose, record, strict=True):
        assert torch.equal(a, b) and torch.equal(x, y)
    with pytest.raises(TypeError, match="unexpected keyword|not both"):
        entry(*head, LoaderOptions(batch_size=2), seed=3)
    with pytest.raises(TypeError), pytest.warns(DeprecationWarning):
        entry(*head, 2, colour="red")


HEAD_NAMES = {"make_loader": ("data", "split", "world"),
              "ShardLoader": ("folder", "split", "world"),
              "LabelListLoader": ("list_file", "world")}


@pytest.mark.parametrize("name", ENTRIES)
def test_the_loose_form_takes_the_arguments_before_the_options_by_name(tmp_path: Path,
                                                                       name: str) -> None:
    """``make_loader(folder, split="train", world=w, batch_size=64)`` and the like: every
    split of the leading arguments into positional and named ones."""
    image = lambda i: jpeg((64, 64), seed=i)  # noqa: E731
    write_split(tmp_path, "train", [3, 2], image)
    head: tuple[Any, ...] = (tmp_path, "train", World())
    if name == "LabelListLoader":
        head = (write_label_list(tmp_path / "list", 5, image), World())
    names, entry = HEAD_NAMES[name], ENTRIES[name]
    assert tuple(inspect.signature(entry).parameters)[:len(names)] == names
    loose = {"batch_size": 2, "workers": 0, "seed": 3, "transform": TrainTransform(size=16)}
    record = entry(*head, LoaderOptions(**loose))
    batches = [labels.tolist() for _, labels in record]
    for positional in range(len(head)):
        named = dict(zip(names[positional:], head[positional:], strict=True))
        with pytest.warns(DeprecationWarning, match="LoaderOptions"):
            loader = entry(*head[:positional], **named, **loose)
        assert loader.options == record.options, (positional, named)
        assert [labels.tolist() for _, labels in loader] == batches
    with pytest.raises(TypeError, match="not both"):
        entry(*head[:1], **dict(zip(names[1:], head[1:], strict=True)),
              options=LoaderOptions(batch_size=2), seed=3)


def test_list_options_are_refused_for_a_folder_whose_manifest_says_them(tmp_path: Path
                                                                         ) -> None:
    write_split(tmp_path, "train", [3, 2], lambda i: jpeg((64, 64), seed=i))
    with pytest.raises(ValueError, match="num_classes"):
        make_loader(tmp_path, "train", World(), LoaderOptions(batch_size=2, workers=0),
                    num_classes=10)


def test_a_label_list_is_loaded_whole_by_every_rank(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(jpeg((64, 64), seed=1))
    (tmp_path / "l.txt").write_text("a.jpg 0\n")
    with pytest.raises(ValueError, match="replicate"):
        make_loader(tmp_path / "l.txt", "train", World(), LoaderOptions(batch_size=1, workers=0),
                    mode="partition")
    loader = make_loader(tmp_path / "l.txt", "val", World(),
                         LoaderOptions(batch_size=1, workers=0,
                                       transform=ValTransform(size=32, resize=32)),
                         mode="replicate")
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
    assert (cfg.options.tail, cfg.options.shuffle, cfg.options.transform) == (
        "pad", False, ValTransform())
    with pytest.raises(ValueError, match="mode"):
        LoaderOptions(batch_size=2).config(train=True, samples=[3], world=World(),
                                           mode="scatter", layout_seed=0)


def test_import_loaders_imports_no_decoder_backend() -> None:
    code = ("import sys, loaders; print(sorted(m for m in sys.modules if m in "
            "('loaders.pillow', 'loaders.dali', 'nvidia.dali')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert out.strip() == "[]"
