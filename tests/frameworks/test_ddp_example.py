"""``examples/ddp_train.py``: plain DDP under torchrun (CPU, Gloo), killed mid-epoch and
resumed from the file rank 0 wrote, checked batch by batch against an uninterrupted run
(``tests.support.frameworks``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.frameworks import (
    EXAMPLE_ARGS,
    check_resume,
    finish,
    hold_then_kill,
    launch,
    reference,
    start,
    write_data,
)

RUN_TIMEOUT = 180.0  # one run; a quiet 2-core machine takes about 6 s, 20 s seen under load


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
def test_a_run_killed_mid_epoch_resumes_exactly_from_rank_zeros_file(tmp_path: Path) -> None:
    """Held after step 5 of epoch 0 and SIGKILLed; its checkpoint (step 4, rank 0's loader
    state) loaded by both ranks: exactly the uninterrupted run's batches from step 5 through
    epoch 1, on each rank, every sample of epoch 0 once."""
    data = write_data(tmp_path / "data")
    args = [str(data), *EXAMPLE_ARGS]
    proc, killed = start(tmp_path, "killed", "ddp_train", launch("torchrun", 2), "0:5",
                         [*args, "--out", str(tmp_path / "ckpt")])
    hold_then_kill(proc, killed, 2, RUN_TIMEOUT)
    proc, resumed = start(tmp_path, "resumed", "ddp_train", launch("torchrun", 2), "-",
                          [*args, "--out", str(tmp_path / "out"), "--resume",
                           str(tmp_path / "ckpt" / "last.pt")])
    check_resume(reference(data, 2), killed, finish(proc, resumed, RUN_TIMEOUT), 2, 4)
