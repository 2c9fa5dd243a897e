"""What the framework tests share: their small shard set, the batches an uninterrupted run
yields on each rank (computed in process, a digest a batch), and the example runs they start,
hold at a step, SIGKILL and resume.

The data: 46 samples in unequal shards, 64 px JPEGs whose label is their sample id, loaded at
32 px in batches of 4 with ``tail="pad"``: 6 steps an epoch on 2 ranks (the last one padded
with 2 samples), 12 on one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import descendants
from imgprep import World
from loaders import DeviceLoader, LoaderOptions, ShardLoader, TrainTransform
from tests.frameworks.child import digest
from tests.support.images import jpeg
from tests.support.paths import REPO
from tests.support.procs import clean_env, free_port
from tests.support.shards import write_split

SIZES = (9, 14, 7, 16)
TOTAL = sum(SIZES)
BATCH, IMAGE, EPOCHS, SAVE_EVERY = 4, 32, 2, 2
# what every example run gets: the loader's options above, a checkpoint every 2 steps
EXAMPLE_ARGS = ("--batch-size", str(BATCH), "--image-size", str(IMAGE), "--workers", "1",
                "--epochs", str(EPOCHS), "--save-every", str(SAVE_EVERY), "--num-classes",
                "1000")
Record = dict[str, Any]  # one batch as a rank recorded it (tests/frameworks/child.py)
Reference = dict[tuple[int, int], list[tuple[list[int], str]]]  # (rank, epoch) -> batches


def write_data(folder: Path) -> Path:
    """The train split, and the same samples as a val split."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        write_split(folder, split, SIZES, lambda i: jpeg((64, 64), seed=i))
    return folder


def options(workers: int = 0) -> LoaderOptions:
    """The examples' loader options at the tests' sizes."""
    return LoaderOptions(batch_size=BATCH, workers=workers, tail="pad",
                         transform=TrainTransform(size=IMAGE))


def ranks(n: int) -> list[World]:
    return [World(rank=r, world_size=n, local_rank=r, local_world_size=n) for r in range(n)]


def reference(folder: Path, world_size: int) -> Reference:
    """(rank, epoch) -> each batch's (labels, digest) of an uninterrupted run, normalised as
    the examples hand batches over (``DeviceLoader`` on the CPU)."""
    out = {}
    for w in ranks(world_size):
        loader = ShardLoader(folder, "train", w, options())
        for epoch in range(EPOCHS):
            loader.set_epoch(epoch)
            out[w.rank, epoch] = [(labels.tolist(), digest(images, labels)) for images, labels
                                  in DeviceLoader(loader, "cpu", loader.mean, loader.std)]
    return out


# ---------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class Run:
    """One run of an example: its command's output folder and what its ranks recorded."""

    rec: Path
    log: Path

    def records(self, rank: int, kind: str = "rank") -> list[Record]:
        """What ``rank`` recorded of each train batch (``kind="val"``: of each val batch)."""
        path = self.rec / f"{kind}{rank}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def validated(self, nproc: int, epoch: int) -> list[int]:
        """The real samples the ranks' val batches held at the end of ``epoch``, sorted."""
        return sorted(x for r in range(nproc) for b in self.records(r, "val")
                      if b["epoch"] == epoch for x in b["labels"] if x >= 0)


def launch(kind: str, nproc: int) -> list[str]:
    """The launcher's command before ``-m MODULE`` (``python``: the example starts its own
    ranks, as Lightning's launcher does, or runs alone)."""
    py = [sys.executable]
    port = str(free_port())
    if kind == "python":
        return py
    if kind == "torchrun":
        return [*py, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                "--master-port", port]
    if kind == "accelerate":
        return [*py, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                str(nproc), "--num_machines", "1", "--mixed_precision", "no",
                "--dynamo_backend", "no", "--main_process_port", port]
    raise ValueError(kind)


def start(tmp: Path, name: str, example: str, launcher: list[str], hold: str,
          args: Sequence[str]) -> tuple[subprocess.Popen[bytes], Run]:
    """Start ``examples/<example>.py`` under ``launcher`` through the recording child."""
    run = Run(tmp / name, tmp / f"{name}.log")
    run.rec.mkdir(parents=True)
    # HF_HOME: no accelerate config of this machine's user (~/.cache/huggingface) applies
    env = clean_env(OMP_NUM_THREADS=1, PYTHONPATH=str(REPO), HF_HOME=tmp / "hf")
    cmd = [*launcher, "-m", "tests.frameworks.child", example, str(run.rec), hold, "--",
           *args]
    with open(run.log, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc, run


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` and every process under it (launchers put ranks in sessions of
    their own)."""
    pids = descendants(proc.pid) | {proc.pid}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def finish(proc: subprocess.Popen[bytes], run: Run, timeout: float) -> Run:
    """Wait for a run to exit 0 (killing it past ``timeout``)."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        raise AssertionError(f"{run.rec.name} hung past {timeout} s (killed):\n{tail(run)}") \
            from None
    assert proc.returncode == 0, f"{run.rec.name} exited {proc.returncode}:\n{tail(run)}"
    return run


def hold_then_kill(proc: subprocess.Popen[bytes], run: Run, nproc: int, timeout: float) -> Run:
    """Wait until every rank holds (``OUT/held<r>``), then SIGKILL the whole run there."""
    deadline = time.monotonic() + timeout
    try:
        while not all((run.rec / f"held{r}").exists() for r in range(nproc)):
            if proc.poll() is not None:
                raise AssertionError(f"{run.rec.name} exited {proc.returncode} before it "
                                     f"held:\n{tail(run)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{run.rec.name} did not hold within {timeout} s:\n"
                                     f"{tail(run)}")
            time.sleep(0.05)
    finally:
        kill_tree(proc)
    return run


def tail(run: Run) -> str:
    return run.log.read_text(errors="replace")[-4000:] if run.log.exists() else ""


# ---------------------------------------------------------------------------- checks


def as_batches(records: Sequence[Record]) -> list[tuple[list[int], str]]:
    return [(r["labels"], r["digest"]) for r in records]


def check_resume(ref: Reference, killed: Run,
                 resumed: Run, nproc: int, at: int) -> None:
    """The killed run's batches, and the resumed run's from step ``at`` of epoch 0 on, are
    the uninterrupted run's on every rank; every step of epoch 0 from ``at`` came once; the
    epoch's length as the framework counted it is the whole epoch's; epoch 0 (the checkpoint's
    steps of the killed run, then the resumed run's) saw every sample once."""
    whole = len(ref[0, 0])
    seen: list[int] = []
    for r in range(nproc):
        before = killed.records(r)
        assert before and as_batches(before) == ref[r, 0][:len(before)], f"rank {r}"
        after = resumed.records(r)
        for epoch in range(EPOCHS):
            got = [x for x in after if x["epoch"] == epoch]
            start = at if epoch == 0 else 0
            assert [x["step"] for x in got] == list(range(start + 1, whole + 1)), (r, epoch)
            assert as_batches(got) == ref[r, epoch][start:], (r, epoch)
            assert {x["len"] for x in got} == {whole}, (r, epoch)
        seen += [x for b in before[:at] + [x for x in after if x["epoch"] == 0]
                 for x in b["labels"]]
    real = sorted(x for x in seen if x >= 0)
    assert real == list(range(TOTAL))


def check_elastic(ref1: Reference, killed: Run,
                  resumed: Run, before_ranks: int, at: int) -> None:
    """A resume on one rank from a checkpoint of ``before_ranks`` at step ``at``: epoch 0
    goes on from there (the framework's count, steps ``at``+1 on, to its length) with every
    sample the checkpoint's steps had not seen, once; epoch 1 is the one-rank run's whole
    epoch."""
    seen = [x for r in range(before_ranks) for b in killed.records(r)[:at] for x in b["labels"]]
    after = resumed.records(0)
    first = [x for x in after if x["epoch"] == 0]
    assert [x["step"] for x in first] == list(range(at + 1, at + len(first) + 1))
    assert {x["len"] for x in first} == {at + len(first)}
    seen += [x for b in first for x in b["labels"]]
    assert sorted(x for x in seen if x >= 0) == list(range(TOTAL))
    assert as_batches([x for x in after if x["epoch"] == 1]) == ref1[0, 1]
