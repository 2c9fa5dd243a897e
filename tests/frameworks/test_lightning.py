"""PyTorch Lightning (CPU, the ddp strategy on Gloo) running ``examples/lightning_train.py``.

One run of 2 ranks started by Lightning's own launcher (which sets no ``RANK``) holds after
step 5 of epoch 0, one step past its last checkpoint (step 4), and is SIGKILLed there. Its
``last.ckpt`` is then resumed by ``Trainer.fit(ckpt_path=...)`` on 2 ranks under torchrun and
on one process (elastic). Every batch is compared, per rank, with the batches an
uninterrupted run yields (computed in process: ``tests.support.frameworks.reference``), by
its labels (a sample's label is its id) and a digest of its pixels.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.frameworks import (
    EXAMPLE_ARGS,
    TOTAL,
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

RUN_TIMEOUT = 240.0  # one run; a quiet 2-core machine takes 8-12 s, 30 s seen under load
HELD_AT, SAVED_AT = "0:5", 4  # held after step 5 of epoch 0; its last checkpoint is step 4


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def killed(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    """The run started by Lightning's launcher and killed after step 5; its checkpoint."""
    tmp = tmp_path_factory.mktemp("lightning")
    proc, run = start(tmp, "killed", "lightning_train", launch("python", 2), HELD_AT,
                      [str(data), "--out", str(tmp / "ckpt"), "--devices", "2", *EXAMPLE_ARGS])
    hold_then_kill(proc, run, 2, RUN_TIMEOUT)
    return tmp / "ckpt" / "last.ckpt", run


def resume(data: Path, ckpt: Path, tmp: Path, launcher: str, nproc: int) -> Run:
    proc, run = start(tmp, launcher, "lightning_train", launch(launcher, nproc), "-",
                      [str(data), "--out", str(tmp / "out"), "--devices", str(nproc),
                       "--resume", str(ckpt), *EXAMPLE_ARGS])
    return finish(proc, run, RUN_TIMEOUT)


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
def test_lightnings_own_launcher_gives_each_rank_its_share(data: Path, killed: tuple[Path, Run]
                                                           ) -> None:
    """Lightning's launcher sets LOCAL_RANK, NODE_RANK and WORLD_SIZE but no RANK: the World
    comes from the trainer, so each rank yields its own batches of a 2-rank job (read as one
    process, each would yield the whole set's, 12 steps an epoch) and the two are disjoint."""
    ref = reference(data, 2)
    _, run = killed
    mine = [run.records(r) for r in range(2)]
    for r in range(2):
        assert [(x["labels"], x["digest"]) for x in mine[r]] == ref[r, 0][:5], f"rank {r}"
        assert {x["len"] for x in mine[r]} == {6}
    first, second = ({x for b in records for x in b["labels"]} for records in mine)
    assert not first & second and len(first | second) == 5 * 2 * 4 <= TOTAL


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
def test_a_run_killed_mid_epoch_resumes_exactly_from_lightnings_checkpoint(
        data: Path, killed: tuple[Path, Run], tmp_path: Path) -> None:
    """Resumed under torchrun from ``last.ckpt`` (step 4): on each rank exactly the batches
    an uninterrupted run yields from step 5 of epoch 0 (the step the killed run had done is
    done again), through epoch 1 (set_epoch at its start, not at the restart); both ranks
    the same count; Lightning counts a whole epoch (6 steps); epoch 0 every sample once; the
    val split's every sample once at each epoch's end."""
    ckpt, run = killed
    resumed = resume(data, ckpt, tmp_path, "torchrun", 2)
    check_resume(reference(data, 2), run, resumed, 2, SAVED_AT)
    for epoch in range(2):  # the val split, each rank its share, at each epoch's end
        assert resumed.validated(2, epoch) == list(range(TOTAL))
    assert len(resumed.records(0, "val")) == len(resumed.records(1, "val")) == 2 * 6


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
def test_an_elastic_resume_on_one_process_sees_every_remaining_sample_once(
        data: Path, killed: tuple[Path, Run], tmp_path: Path) -> None:
    """The 2-rank checkpoint resumed by one process: Lightning's count goes on from step 4
    and ends the epoch where the loader's batches do (4 + 4 steps, every sample the two
    ranks had not seen once); epoch 1 is one process's whole epoch (12 steps)."""
    ckpt, run = killed
    resumed = resume(data, ckpt, tmp_path, "python", 1)
    check_elastic(reference(data, 1), run, resumed, 2, SAVED_AT)
    assert len([x for x in resumed.records(0) if x["epoch"] == 0]) == 4
    assert resumed.validated(1, 0) == resumed.validated(1, 1) == list(range(TOTAL))
