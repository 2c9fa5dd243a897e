"""The embedded trainer with real processes: torchrun, mpirun and plain launches on Gloo.

The trainer runs as a script, so its own module is imported in a child process started in
its folder, as the script sees itself; its kit imports here as ``scripts.trainkit``. One-rank
runs whose process is not what a test checks (the data-wait hint, the staging warning, a
refused resume) run its ``main`` in this process (``trainer_main``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from imgprep import read_manifest
from imgprep.convert.options import ConvertOptions
from imgprep.convert.run import convert
from scripts.trainkit import train
from scripts.trainkit.precision import choose, cpu_flags, detect, native_cpu_bf16
from scripts.trainkit.timing import DataWaitHint
from tests.support import REPO, free_port, mpirun_cmd

TRAIN = REPO / "scripts" / "train_imagenet.py"
# the trainer's main run in this process (tests/scripts/conftest.py: trainer_main)
Main = Callable[[Sequence[str | Path]], subprocess.CompletedProcess[str]]
FLAGS = ["--arch", "tiny", "--batch-size", "8", "--workers", "1", "--image-size", "64",
         "--epochs", "10", "--warmup-epochs", "1", "--log-every", "1", "--timeout", "60"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(sample: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("train-data")
    convert(ConvertOptions(input=sample / "ILSVRC2012_img_train.tar", out=out, num_shards=4))
    convert(ConvertOptions(input=sample / "ILSVRC2012_img_val.tar", out=out, num_shards=2,
                           labels=(sample / "val.txt",)))
    return out


def torchrun(n: int, *args: str | Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
            "--master-port", str(free_port()), str(TRAIN), *map(str, args)]


def run(cmd: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def parsed(attr: str, *argvs: list[str]) -> list[object]:
    """``attr`` of what the trainer's own ``parse_args`` makes of each argv."""
    return [getattr(train.parse_args(a), attr) for a in argvs]


def summary(out: str) -> dict:
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def losses(log: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, log.read_text().splitlines())
            if "loss" in r]


@dataclass(frozen=True)
class Resumed:
    """The torchrun runs the resume tests read (``resumed`` below)."""

    data: Path
    ckpt: Path
    whole: dict  # the summary of 12 steps uninterrupted, validated
    whole_log: Path
    part_log: Path  # 6 steps with a checkpoint, then resumed to step 12, in one log
    resumed: subprocess.CompletedProcess[str]  # the resume to step 12
    state: dict  # the checkpoint it wrote
    old: dict  # the summary of the resume of that checkpoint as loader order version 1
    old_state: dict  # and of the checkpoint it wrote


@pytest.fixture(scope="module")
def resumed(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Resumed:
    """2 ranks under torchrun: 12 steps uninterrupted; 6 steps with a checkpoint, resumed to
    step 12; that checkpoint made one written before loader states named their epoch order
    (version 1) and resumed to step 14 with --allreduce-dtype fp16 (an elastic change)."""
    tmp = tmp_path_factory.mktemp("resume")
    whole_log, part_log, ckpt = tmp / "whole.jsonl", tmp / "part.jsonl", tmp / "ckpt"
    whole = summary(run(torchrun(2, "--data", data, *FLAGS, "--steps", "12",
                                 "--log-json", whole_log)).stdout)
    run(torchrun(2, "--data", data, *FLAGS, "--steps", "6", "--checkpoint", ckpt,
                 "--log-json", part_log))
    assert (ckpt / "last.pt").is_file()
    done = run(torchrun(2, "--data", data, *FLAGS, "--steps", "12", "--checkpoint", ckpt,
                        "--resume", "--log-json", part_log))
    state = torch.load(ckpt / "last.pt", map_location="cpu", weights_only=True)
    older = {**state, "loader": {k: v for k, v in state["loader"].items()
                                 if k != "order_version"}}
    torch.save(older, ckpt / "last.pt")
    old = summary(run(torchrun(2, "--data", data, *FLAGS, "--steps", "14", "--checkpoint",
                               ckpt, "--resume", "--allreduce-dtype", "fp16")).stdout)
    old_state = torch.load(ckpt / "last.pt", map_location="cpu", weights_only=True)
    return Resumed(data, ckpt, whole, whole_log, part_log, done, state, old, old_state)


def test_torchrun_trains_validates_and_resumes_with_identical_losses(resumed: Resumed) -> None:
    s = resumed.whole
    assert (s["world_size"], s["backend"], s["step"]) == (2, "gloo", 12)
    assert s["replicas_identical"] is True  # DDP kept both ranks' weights equal
    assert s["val"]["samples"] == 20  # exact validation: every val image once
    assert 0.0 <= s["val"]["top1"] <= s["val"]["top5"] <= 1.0
    split = s["last_log"]["mean"]
    assert set(split) == {"data", "compute", "allreduce", "optimizer"}
    assert split["compute"] > 0 and s["last_log"]["images_per_s"] > 0
    done, ckpt, part = resumed.resumed, resumed.ckpt, resumed.part_log
    out = done.stdout
    assert "resume:" not in done.stderr  # the same run: nothing to say about its options
    assert losses(part) == losses(resumed.whole_log)
    assert len(losses(resumed.whole_log)) == 12
    # where it went on: 6 steps of 2 ranks x 8 images, i.e. 2 whole epochs of 3 steps
    said = [line for line in out.splitlines() if line.startswith("resumed from ")]
    assert said == [f"resumed from {ckpt / 'last.pt'} at step 6: epoch 1 (3 of its 3 steps "
                    "done), 96 samples seen"], out
    assert summary(out)["resumed"] == {"step": 6, "epoch": 1, "epoch_batches_done": 3,
                                       "samples": 96}
    assert {"resumed": summary(out)["resumed"]} in map(json.loads, part.read_text().splitlines())
    state = resumed.state
    assert (state["step"], state["samples"]) == (12, 192)  # the count goes on after a resume
    train = read_manifest(resumed.data, "train")
    assert (state["config"]["mean"], state["config"]["std"]) == (train.mean, train.std)
    assert summary(out)["config"] == state["config"]
    assert state["loader"]["order_version"] == 2


def test_a_resume_of_another_arch_is_refused_in_one_line(resumed: Resumed,
                                                         trainer_main: Main) -> None:
    refused = trainer_main(["--data", resumed.data, *FLAGS, "--workers", "0", "--checkpoint",
                            resumed.ckpt, "--resume", "--arch", "resnet18"])
    assert refused.returncode == 3, refused.stderr[-3000:]
    assert "--arch was tiny, now resnet18" in refused.stderr
    assert "world size" not in refused.stderr and "Traceback" not in refused.stderr


def test_a_checkpoint_of_loader_order_version_1_resumes_on_that_order(
        resumed: Resumed) -> None:
    """A checkpoint written before loader states named their epoch order (version 1) resumes
    on that order, and its next checkpoint says so."""
    assert resumed.old["resumed"]["step"] == 12
    assert (resumed.old_state["step"], resumed.old_state["loader"]["order_version"]) == (14, 1)


def test_allreduce_dtype_on_the_wire(resumed: Resumed) -> None:
    """The gradients travel in the --allreduce-dtype asked for: fp32 (the default) in the
    uninterrupted run, fp16 in the last resume; both ranks stay equal. bf16: the mpirun run
    (``test_mpirun_bootstraps_over_mpi4py``)."""
    for s, wire in ((resumed.whole, "float32"), (resumed.old, "float16")):
        assert s["wire_dtypes"] == [wire] and s["buckets"] > 0
        assert s["replicas_identical"] is True


def test_mpirun_bootstraps_over_mpi4py(data: Path) -> None:
    """Two ranks under mpirun, with bf16 gradients on the wire (the third --allreduce-dtype,
    beside the torchrun runs' fp32 and fp16)."""
    cmd = [*mpirun_cmd(2), "-x", "OMP_NUM_THREADS=1", sys.executable, str(TRAIN),
           "--data", str(data), *FLAGS, "--steps", "3", "--no-validate", "--allreduce-dtype",
           "bf16"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env={k: v for k, v in os.environ.items()
                               if k not in ("MASTER_ADDR", "MASTER_PORT")})
    assert done.returncode == 0, done.stderr[-3000:]
    s = summary(done.stdout)
    assert (s["world_size"], s["step"], s["replicas_identical"]) == (2, 3, True)
    assert s["wire_dtypes"] == ["bfloat16"] and s["buckets"] > 0


def test_a_killed_rank_makes_the_other_fail_within_the_timeout(data: Path) -> None:
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(
            [sys.executable, str(TRAIN), "--data", str(data), *FLAGS, "--epochs", "1000",
             "--timeout", "20"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    try:
        assert procs[0].stdout is not None
        for line in procs[0].stdout:  # rank 0 prints once training runs
            if line.startswith("step "):
                break
        procs[1].send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        rc = procs[0].wait(timeout=90)
        assert rc != 0
        assert time.monotonic() - t0 < 60
        assert "rank failed" in (procs[0].stderr.read() if procs[0].stderr else "")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_missing_manifest_is_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(TRAIN), "--data", str(tmp_path), *FLAGS],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3
    assert "train.json" in done.stderr and "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def waiting(data: Path, tmp_path_factory: pytest.TempPathFactory,
            trainer_main: Main) -> tuple[str, Path]:
    """One rank decoding in the training process (--workers 0), --bf16 auto: its stdout and
    its --log-json. At 32 px on one thread the tiny model's step is short beside decoding its
    256 px JPEGs, so the step waits for data in every interval even when other work shares
    the cores (two threads there stretched a step to 0.7 s and hid the wait)."""
    log = tmp_path_factory.mktemp("waiting") / "log.jsonl"
    done = trainer_main(["--data", data, *FLAGS, "--workers", "0", "--steps", "8",
                         "--image-size", "32", "--threads", "1", "--no-validate",
                         "--log-json", log])
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, log


def test_data_wait_hint_is_printed_once_by_rank_zero(waiting: tuple[str, Path]) -> None:
    """Decoding in the training process (--workers 0) keeps the step waiting for data: one
    hint line saying what to change, however many intervals stay slow."""
    out, _ = waiting
    hints = [line for line in out.splitlines() if line.startswith("hint:")]
    assert len(hints) == 1, out
    assert "--workers auto" in hints[0] and "--stage-from" in hints[0]
    assert summary(out)["hint"] == hints[0]


def test_data_wait_hint_rules() -> None:
    """Three slow intervals in a row after the first (worker start-up) one; said once; the
    advice follows the cores left."""
    hint = DataWaitHint(workers=3, cores_per_rank=8, ranks_per_node=2, staged=True)
    said = [hint.update(f) for f in (0.9, 0.2, 0.2, 0.01, 0.2, 0.2, 0.2, 0.3, 0.3)]
    assert [i for i, s in enumerate(said) if s] == [6]
    assert "at least 20% of the time in 3 log intervals" in (said[6] or "")
    assert "raise --workers (3 now; this rank may use 8 cores)" in (said[6] or "")
    assert "--stage-from" not in (said[6] or "")
    full = DataWaitHint(workers=4, cores_per_rank=4, ranks_per_node=8, staged=False).advice()
    assert "fewer ranks per node (8 now)" in full and "--stage-from" in full
    bound = DataWaitHint(workers=1, cores_per_rank=1, ranks_per_node=2, staged=True,
                         one_cpu=True).advice()
    assert "share the one CPU" in bound and "--bind-to none" in bound


def test_bf16_auto_runs_it_only_where_the_device_computes_it_natively() -> None:
    """--bf16 auto: bf16 autocast on CUDA with bf16 and on CPUs with AMX or AVX-512 BF16,
    fp32 elsewhere (emulated bf16 is many times slower); on and off force either."""
    info = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\nbugs\t: x\n"
    assert "avx512_bf16" in cpu_flags(info) and cpu_flags("no flags here") == frozenset()
    assert native_cpu_bf16(["avx2", "amx_tile", "amx_bf16"]) == "amx_bf16"
    assert native_cpu_bf16(["avx2", "avx512f", "avx512_vnni"]) is None
    zen = ["fpu", "sse2", "avx2", "fma"]
    assert choose("auto", "cpu", flags=zen).bf16 is False
    assert choose("auto", "cpu", flags=cpu_flags(info)).bf16 is True
    assert choose("auto", "cpu", flags=["amx_bf16"]).bf16 is True
    assert choose("auto", "cuda", cuda_bf16=True).bf16 is True
    assert choose("auto", "cuda", cuda_bf16=False).bf16 is False
    assert choose("on", "cpu", flags=zen).bf16 is True
    assert choose("off", "cuda", cuda_bf16=True).bf16 is False
    line = choose("auto", "cpu", flags=zen).line()
    assert line == ("precision: fp32 (--bf16 auto: this CPU reports neither amx_bf16 nor "
                    "avx512_bf16, so bf16 would run emulated; --bf16 on forces bf16)")
    assert "slower than fp32" in choose("on", "cpu", flags=zen).why
    assert choose("auto", "cpu", flags=["amx_bf16"]).line().startswith(
        "precision: bf16 autocast (--bf16 auto: this CPU reports amx_bf16")
    with pytest.raises(ValueError, match="auto, on, off"):
        choose("yes", "cpu")


@pytest.fixture(scope="module")
def staged(sample: Path, tmp_path_factory: pytest.TempPathFactory, trainer_main: Main
           ) -> tuple[subprocess.CompletedProcess[str], Path, Path, Path]:
    """One step with --stage-from a folder holding a train split alone, and --bf16 on: the
    run, the folders staged from and to, and its --log-json."""
    tmp = tmp_path_factory.mktemp("staged")
    src, dst, log = tmp / "src", tmp / "local", tmp / "log.jsonl"
    convert(ConvertOptions(input=sample / "ILSVRC2012_img_train.tar", out=src, num_shards=2))
    done = trainer_main(["--stage-from", src, "--data", dst, *FLAGS, "--steps", "1", "--bf16",
                         "on", "--log-json", log])
    assert done.returncode == 0, done.stderr[-3000:]
    return done, src, dst, log


def test_the_run_says_its_precision_and_why_first(
        waiting: tuple[str, Path],
        staged: tuple[subprocess.CompletedProcess[str], Path, Path, Path]) -> None:
    """The first line, the first --log-json record and the summary (--bf16 auto, the
    default, and --bf16 on); --bf16 and --no-bf16 still parse."""
    for (out, log), mode in ((waiting, "auto"), ((staged[0].stdout, staged[3]), "on")):
        want = detect(mode, "cpu")
        assert out.splitlines()[0] == want.line(), out
        assert json.loads(log.read_text().splitlines()[0]) == {"precision": want.record()}
        assert summary(out)["precision"] == want.record()
    assert detect("on", "cpu").bf16 is True
    cases = (((), "auto"), (("--bf16",), "on"), (("--no-bf16",), "off"),
             (("--bf16", "off"), "off"), (("--bf16", "auto"), "auto"))
    assert parsed("bf16", *(["--data", "d", *flags] for flags, _ in cases)) == [
        mode for _, mode in cases]


def test_no_val_warning_names_the_folder_staged_from(
        staged: tuple[subprocess.CompletedProcess[str], Path, Path, Path]) -> None:
    """With --stage-from the val split must be converted where the data is staged from."""
    done, src, dst, _ = staged
    warning = [line for line in done.stderr.splitlines() if "no val split" in line]
    assert len(warning) == 1, done.stderr
    assert f"staged from {src}, which has none" in warning[0]
    assert f"imgprep convert ILSVRC2012_img_val.tar -o {src} --labels" in warning[0]
    assert f"-o {dst}" not in warning[0]
