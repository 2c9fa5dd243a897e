"""Hugging Face Accelerate (CPU, Gloo) running ``examples/accelerate_train.py``.

One run of 2 processes started by ``accelerate launch`` holds after step 5 of epoch 0, one step
past its last ``accelerator.save_state`` (step 4), and is SIGKILLed there. That checkpoint is
then loaded by ``accelerator.load_state`` on 2 processes (``accelerate launch`` again) and on
one (elastic). Every batch is compared, per rank, with the batches an uninterrupted run
yields (``tests.support.frameworks.reference``), by its labels and a digest of its pixels.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from imgprep import World, WorldError
from tests.support.frameworks import (
    EXAMPLE_ARGS,
    Run,
    check_elastic,
    check_resume,
    finish,
    hold_then_kill,
    launch,
    reference,
    start,
    write_data,
)
from tests.support.procs import torchrun_env

RUN_TIMEOUT = 240.0  # one run; a quiet 2-core machine takes 6-9 s, 25 s seen under load
HELD_AT, SAVED_AT = "0:5", 4  # held after step 5 of epoch 0; its last checkpoint is step 4


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def killed(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    """The run killed after step 5 and its checkpoint of step 4."""
    tmp = tmp_path_factory.mktemp("accelerate")
    proc, run = start(tmp, "killed", "accelerate_train", launch("accelerate", 2), HELD_AT,
                      [str(data), "--out", str(tmp / "ckpt"), "--cpu", *EXAMPLE_ARGS])
    hold_then_kill(proc, run, 2, RUN_TIMEOUT)
    return tmp / "ckpt" / f"epoch0000-step{SAVED_AT:06d}", run


def resume(data: Path, ckpt: Path, tmp: Path, launcher: str, nproc: int) -> Run:
    proc, run = start(tmp, launcher, "accelerate_train", launch(launcher, nproc), "-",
                      [str(data), "--out", str(tmp / "out"), "--cpu", "--resume", str(ckpt),
                       *EXAMPLE_ARGS])
    return finish(proc, run, RUN_TIMEOUT)


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
def test_a_run_killed_mid_epoch_resumes_exactly_from_accelerates_checkpoint(
        data: Path, killed: tuple[Path, Run], tmp_path: Path) -> None:
    """``accelerate launch`` runs torchrun: each rank its own share before the kill; from
    the checkpoint (rank 0's loader state, loaded by both) exactly the batches an
    uninterrupted run yields from step 5 of epoch 0 through epoch 1, on each rank; both
    ranks the same count; the epoch's length a whole epoch's (6); every sample once."""
    ckpt, run = killed
    assert sorted(p.name for p in ckpt.glob("custom_checkpoint_*")) == ["custom_checkpoint_0.pkl"]
    resumed = resume(data, ckpt, tmp_path, "accelerate", 2)
    check_resume(reference(data, 2), run, resumed, 2, SAVED_AT)


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
def test_an_elastic_resume_on_one_process_sees_every_remaining_sample_once(
        data: Path, killed: tuple[Path, Run], tmp_path: Path) -> None:
    """The 2-process checkpoint loaded by one process (Accelerate loads the model, the
    optimizer, process 0's random state and the loader's state): epoch 0 goes on from step 4
    with every sample the two ranks had not seen, once; epoch 1 is one process's whole
    epoch."""
    ckpt, run = killed
    resumed = resume(data, ckpt, tmp_path, "python", 1)
    check_elastic(reference(data, 1), run, resumed, 2, SAVED_AT)


def test_accelerate_world_is_the_launchers_checked_against_accelerates_ranks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The World is the launcher's (torchrun's variables, which accelerate launch sets); an
    Accelerator that runs each process alone (made without cpu=True on a machine without
    GPUs) is refused, naming both counts, instead of every rank loading the whole set."""
    from loaders.accelerate import accelerate_world

    for k, v in torchrun_env(1, 2, 2).items():
        monkeypatch.setenv(k, v)
    same = SimpleNamespace(process_index=1, num_processes=2, local_process_index=1)
    assert accelerate_world(same) == World(rank=1, world_size=2, local_rank=1,  # type: ignore[arg-type]
                                           local_world_size=2)
    alone = SimpleNamespace(process_index=0, num_processes=1, local_process_index=0)
    with pytest.raises(WorldError, match="torchrun.*rank 1 of 2, local rank 1; Accelerate runs "
                       "rank 0 of 1, local rank 0 .*cpu=True"):
        accelerate_world(alone)  # type: ignore[arg-type]
