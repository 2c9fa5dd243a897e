"""The trainer's run config: one set of normalisation statistics for every split, recorded in
the checkpoint with every option that defines the run; what a resume refuses and allows; where
the libraries' notes go. In one process (``--workers 0``), on a converted fake set."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from imgprep import World, read_manifest
from loaders import normalize
from scripts.trainkit import TrainError
from scripts.trainkit import train as train_imagenet
from scripts.trainkit.checkpoint import (
    load_checkpoint,
    order_version_of,
    resume_config,
    save_checkpoint,
)
from scripts.trainkit.logs import LOGGERS, configure_logging
from scripts.trainkit.runconfig import IMAGENET, RunConfig, normalize_arg, stats_for
from tests.support import convert_sample

FLAGS = ["--arch", "tiny", "--batch-size", "8", "--workers", "0", "--image-size", "32",
         "--epochs", "4", "--warmup-epochs", "1", "--threads", "1", "--log-every", "100"]


def set_up(data: Path, *flags: str | Path) -> train_imagenet.Run:
    args = train_imagenet.parse_args(["--data", str(data), *FLAGS, *map(str, flags)])
    return train_imagenet.set_up(args, World())


def seen_by_model(run: train_imagenet.Run) -> list[torch.Tensor]:
    """Every image batch the model is called on from now on."""
    seen: list[torch.Tensor] = []
    run.model.register_forward_pre_hook(lambda _, inputs: seen.append(inputs[0].clone()))
    return seen


def stats(mean: list[float] | tuple[float, ...], std: list[float] | tuple[float, ...]
          ) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1),
            torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1))


def test_every_split_is_normalised_with_the_train_statistics(data: Path) -> None:
    """The exact tensors the model sees, in a training step and in validation: the raw uint8
    batches normalised with the train manifest's mean and std, not the val manifest's."""
    train_m, val_m = read_manifest(data, "train"), read_manifest(data, "val")
    assert train_m.mean != val_m.mean  # the set tells the two apart
    run = set_up(data, "--steps", "1")
    assert run.val_loader is not None
    run.train_loader.set_epoch(0)
    raw_train = next(iter(run.train_loader))[0]
    raw_val = [images for images, _ in run.val_loader]
    seen = seen_by_model(run)
    train_imagenet.train_epoch(run, 0)
    train_imagenet.evaluate(run)
    assert len(seen) == 1 + len(raw_val)
    want = stats(train_m.mean, train_m.std)
    for raw, got in zip([raw_train, *raw_val], seen, strict=True):
        assert torch.equal(got, normalize(raw, *want))
        assert torch.allclose(got, (raw.float() / 255 - want[0]) / want[1], atol=1e-5)
    own = stats(val_m.mean, val_m.std)
    assert not torch.allclose(seen[1], normalize(raw_val[0], *own), atol=1e-3)


def test_normalize_takes_imagenet_or_explicit_constants(data: Path) -> None:
    assert normalize_arg("train") == "train" and normalize_arg("imagenet") == "imagenet"
    assert normalize_arg("0.5, .5,0.50/0.25,0.25,2.5e-1") == "0.5,0.5,0.5/0.25,0.25,0.25"
    for bad in ("0.5,0.5/0.2,0.2,0.2", "0.5,0.5,0.5", "a,b,c/1,1,1", "0,0,0/1,0,1",
                "0,0,0/1,1,nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="R,G,B/R,G,B"):
            normalize_arg(bad)
    assert stats_for("imagenet", [0.1] * 3, [0.2] * 3) == IMAGENET
    assert stats_for("train", [0.1] * 3, [0.2] * 3) == ((0.1,) * 3, (0.2,) * 3)
    run = set_up(data, "--normalize", "0.5,0.5,0.5/0.25,0.25,0.25")
    assert (run.config.mean, run.config.std) == ((0.5,) * 3, (0.25,) * 3)
    assert run.batches(run.train_loader).mean.flatten().tolist() == [0.5] * 3


def test_the_checkpoint_records_the_whole_run_config(data: Path, tmp_path: Path) -> None:
    run = set_up(data, "--checkpoint", tmp_path, "--lr", "0.05", "--schedule", "cosine")
    train_imagenet.save(run)
    config = load_checkpoint(tmp_path / "last.pt")["config"]
    m = read_manifest(data, "train")
    assert config == run.config.record() and config["version"] == 1
    assert {k: config[k] for k in ("arch", "image_size", "num_classes", "train_samples",
                                   "normalize", "mean", "std", "lr", "schedule", "epochs",
                                   "seed", "bf16", "world_size", "batch_size", "workers")} == {
        "arch": "tiny", "image_size": 32, "num_classes": len(m.classes), "train_samples": 48,
        "normalize": "train", "mean": m.mean, "std": m.std, "lr": 0.05, "schedule": "cosine",
        "epochs": 4, "seed": 0, "bf16": run.precision.bf16, "world_size": 1, "batch_size": 8,
        "workers": 0}
    assert config["data_fingerprint"] == m.options.fingerprint
    assert set(config) == {"version"} | set(RunConfig.__dataclass_fields__)


@pytest.mark.parametrize(("flags", "said"), [
    (("--arch", "resnet18"), "--arch was tiny, now resnet18"),
    (("--lr", "0.2", "--seed", "3"), "--seed was 0, now 3; --lr was 0.1, now 0.2"),
    (("--image-size", "48"), "--image-size was 32, now 48"),
    (("--normalize", "imagenet"), "--normalize was train, now imagenet"),
    (("--epochs", "8"), "--epochs was 4, now 8"),
    (("--bf16", "on"), "--bf16 (bf16 autocast) was off, now on"),
    (("--res-schedule", "32:64@0-2"), "--res-schedule was none, now 0=32,1=64"),
])
def test_a_resume_of_another_model_data_or_optimisation_is_refused(
        data: Path, tmp_path: Path, flags: tuple[str, ...], said: str) -> None:
    first = set_up(data, "--checkpoint", tmp_path, "--bf16", "off")
    train_imagenet.save(first)
    other = set_up(data, "--checkpoint", tmp_path, "--resume", "--bf16", "off", *flags)
    with pytest.raises(TrainError) as e:
        train_imagenet.resume(other)
    assert f"cannot resume from {tmp_path / 'last.pt'}" in str(e.value)
    assert said in str(e.value)
    assert "--checkpoint folder" in str(e.value) and not other.resumed


def test_other_data_is_refused_naming_what_differs(data: Path, sample: Path,
                                                  tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt" / "last.pt"
    first = set_up(data, "--checkpoint", ckpt.parent)
    train_imagenet.save(first)
    other = convert_sample(sample, tmp_path / "other", train_shards=1, workers=1)
    again = set_up(other, "--checkpoint", ckpt.parent, "--resume")  # another conversion
    with pytest.raises(TrainError, match=r"--data \(the train split's conversion fingerprint"
                                         r"\) was [0-9a-f]{16}…, now [0-9a-f]{16}…"):
        train_imagenet.resume(again)
    state = load_checkpoint(ckpt)
    state["config"]["data_fingerprint"] = None  # a manifest without one: its size still counts
    with pytest.raises(TrainError, match=r"--data \(train samples\) was 48, now 40"):
        resume_config(state, replace(first.config, train_samples=40), ckpt)


def test_elastic_changes_are_allowed_with_one_line(data: Path, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Another batch size per rank and worker count: the loader resumes from the samples
    done; one line says what changed."""
    first = set_up(data, "--checkpoint", tmp_path, "--steps", "2")
    train_imagenet.train_epoch(first, 0)
    train_imagenet.save(first)
    other = set_up(data, "--checkpoint", tmp_path, "--resume", "--batch-size", "4",
                   "--workers", "1")
    caplog.set_level(logging.INFO, logger="train_imagenet")
    train_imagenet.resume(other)
    lines = [r.getMessage() for r in caplog.records if r.name == "train_imagenet"]
    assert len(lines) == 1, lines
    assert lines[0].startswith("resume: --batch-size was 8, now 4; --workers was 0, now 1: "
                               "allowed"), lines
    assert (other.step, other.samples, other.resumed) == (2, 16, True)
    # the schedule goes on from the 16 images of 48 trained on, at the new global batch
    lr = train_imagenet.learning_rate(other.samples, other.steps_per_epoch, other.args,
                                      other.world)
    assert lr == pytest.approx(0.1 * 4 / 256 * (16 / 48 + 4 / 48))


def test_a_resume_keeps_the_recorded_statistics_and_says_so(
        data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = set_up(data, "--checkpoint", tmp_path / "ckpt")
    train_imagenet.save(first)
    moved = tmp_path / "moved"
    shutil.copytree(data, moved)
    doc = json.loads((moved / "train.json").read_text())
    doc["mean"] = [0.5, 0.5, 0.5]
    (moved / "train.json").write_text(json.dumps(doc))
    other = set_up(moved, "--checkpoint", tmp_path / "ckpt", "--resume")
    assert other.config.mean == (0.5, 0.5, 0.5)
    caplog.set_level(logging.INFO, logger="train_imagenet")
    train_imagenet.resume(other)
    assert other.config.mean == first.config.mean  # the checkpoint's, for every split
    assert other.batches(other.train_loader).mean.flatten().tolist() == \
        torch.tensor(first.config.mean).tolist()
    lines = [r.getMessage() for r in caplog.records if r.name == "train_imagenet"]
    assert len(lines) == 2, lines  # the folder moved (allowed), and the statistics
    assert lines[0].startswith(f"resume: --data (folder) was {data}, now {moved}: allowed")
    mean, std = list(first.config.mean), list(first.config.std)
    ckpt = tmp_path / "ckpt" / "last.pt"
    assert lines[1] == (f"normalize: the train statistics recorded in {ckpt} (mean {mean}, "
                        f"std {std}), not those the train manifest now gives "
                        f"(mean [0.5, 0.5, 0.5], std {std})")


def old_checkpoint(run: train_imagenet.Run, path: Path, **extra: Any) -> None:
    """A checkpoint as the trainer wrote it before it recorded the run config."""
    save_checkpoint(path, {"model": run.model.state_dict(),
                           "optimizer": run.optimizer.state_dict(), "step": 3,
                           "samples": 24, "loader": run.train_loader.state_dict(),
                           "rng": torch.get_rng_state(), **extra})


def test_a_checkpoint_from_before_the_config_still_loads(
        data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = set_up(data, "--steps", "3")
    train_imagenet.train_epoch(first, 0)
    old_checkpoint(first, tmp_path / "last.pt", arch="tiny")
    assert "config" not in load_checkpoint(tmp_path / "last.pt")
    other = set_up(data, "--checkpoint", tmp_path, "--resume", "--steps", "4")
    caplog.set_level(logging.INFO, logger="train_imagenet")
    train_imagenet.resume(other)
    assert (other.step, other.samples, other.resumed) == (3, 24, True)
    train = read_manifest(data, "train")  # the statistics of today's manifest
    assert (list(other.config.mean), list(other.config.std)) == (train.mean, train.std)
    lines = [r.getMessage() for r in caplog.records if r.name == "train_imagenet"]
    assert lines == [f"{tmp_path / 'last.pt'} was written before checkpoints recorded their "
                     "run config: only --arch is checked, the other options are taken as given"]
    train_imagenet.train_epoch(other, 0)  # and it trains on from there
    assert other.step == 4
    resnet = set_up(data, "--checkpoint", tmp_path, "--resume", "--arch", "resnet18")
    with pytest.raises(TrainError, match="--arch was tiny, now resnet18"):
        train_imagenet.resume(resnet)


@pytest.fixture
def restore_loggers() -> Iterator[None]:
    """The loggers as the trainer finds them in a fresh process (an earlier test in this one
    may have run the imgprep command, which adds its own handler), and as they were after."""
    saved = {name: logging.getLogger(name).handlers[:] for name in LOGGERS}
    for name in LOGGERS:
        logging.getLogger(name).handlers.clear()
    yield
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = saved[name]
        logger.setLevel(logging.NOTSET)
        logger.propagate = True


@pytest.mark.usefixtures("restore_loggers")
def test_library_notes_show_on_rank_zero_and_warnings_everywhere(
        capsys: pytest.CaptureFixture[str]) -> None:
    for rank in (0, 1):
        configure_logging(World(rank=rank, world_size=2, local_rank=rank, local_world_size=2,
                                node_rank=0, num_nodes=1))
        configure_logging(World(rank=rank, world_size=2, local_rank=rank, local_world_size=2,
                                node_rank=0, num_nodes=1))  # again: still one handler each
        assert all(len(logging.getLogger(name).handlers) == 1 for name in LOGGERS)
        logging.getLogger("loaders").info("a note from rank %d", rank)
        logging.getLogger("imgprep.shards").warning("a warning from rank %d", rank)
        logging.getLogger("train_imagenet").info("the trainer's note from rank %d", rank)
    assert capsys.readouterr().err.splitlines() == [
        "loaders: a note from rank 0",
        "imgprep.shards: warning: a warning from rank 0",
        "train_imagenet: the trainer's note from rank 0",
        "imgprep.shards: warning: a warning from rank 1",
    ]


def test_the_epoch_order_a_checkpoint_ran_is_read_version_1_where_unnamed(tmp_path: Path
                                                                         ) -> None:
    path = tmp_path / "last.pt"
    for loader, version in (({"epoch": 1, "batch": 3}, 1),
                            ({"epoch": 1, "batch": 3, "order_version": 2}, 2)):
        save_checkpoint(path, {"model": {"w": torch.zeros(2)}, "loader": loader})
        assert order_version_of(path) == version
    save_checkpoint(path, {"model": {}})
    with pytest.raises(TrainError, match="holds no loader state"):
        order_version_of(path)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(TrainError, match="cannot load checkpoint"):
        order_version_of(path)
