"""Fault injection: SIGKILL at random points, a full disk, a changed or vanishing source, a dead
worker or rank, a kill during a checkpoint write. Each trial injects one fault into a real run
and checks what the project promises afterwards (the rerun finishes, the output is
byte-identical to an uninterrupted run, no temporary or bad file under a final name, a one-line
error naming the file, no process left behind). Every function returns ``Trial`` records; the
tests run few trials, ``harness.reliability.report`` runs the full count.

Kill points are drawn uniformly over the duration of an uninterrupted reference run (measured
first), from a seeded generator, so a failing trial can be replayed from its seed and index.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO, descendants, free_port
from harness.checks import clean_env, one_line_problem, tmp_leftovers
from harness.reliability import Trial
from imgprep import ImgprepError, StageError, make_sample, read_manifest

TIMEOUT = 240.0
WAIT_S = 10  # stage-to-node --timeout: how long a waiter waits for a copier that never began
TRAIN = REPO / "scripts" / "train_imagenet.py"


# ---------------------------------------------------------------------------- processes


def rank_env(rank: int, size: int, **extra: object) -> dict[str, str]:
    """What torchrun gives rank ``rank`` of ``size`` on one node."""
    return clean_env(RANK=rank, WORLD_SIZE=size, LOCAL_RANK=rank, LOCAL_WORLD_SIZE=size,
                     GROUP_RANK=0, **extra)


@dataclass(frozen=True)
class Job:
    """The processes of one run, started together (one per rank, or just one)."""

    cmds: tuple[tuple[str, ...], ...]
    envs: tuple[dict[str, str], ...]

    @staticmethod
    def of(cmds: Sequence[Sequence[object]], envs: Sequence[dict[str, str]]) -> Job:
        return Job(tuple(tuple(map(str, c)) for c in cmds), tuple(envs))


@dataclass(frozen=True)
class Ended:
    """How each process of a job ended: exit codes (negative: signal) and stderr."""

    codes: tuple[int, ...]
    stderr: tuple[str, ...]
    stdout: tuple[str, ...]
    killed: bool  # the fault landed before the job finished
    orphans: tuple[int, ...]  # processes that outlived their killed parent

    def why(self) -> str:
        lines = [e.strip().splitlines()[-1] for e in self.stderr if e.strip()]
        return f"exit {list(self.codes)}" + (f": {lines[0][:300]}" if lines else "")


def _start(job: Job, logs: Path) -> list[tuple[subprocess.Popen[bytes], Path, Path]]:
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for i, (cmd, env) in enumerate(zip(job.cmds, job.envs, strict=True)):
        out, err = logs / f"{i}.out", logs / f"{i}.err"
        with open(out, "wb") as o, open(err, "wb") as e:
            procs.append((subprocess.Popen(cmd, env=env, stdout=o, stderr=e, cwd=REPO), out,
                          err))
    return procs


def _gone(pids: Sequence[int], grace: float) -> tuple[int, ...]:
    """Wait up to ``grace`` s for ``pids`` to exit; SIGKILL and return those that did not."""
    deadline = time.monotonic() + grace
    alive = [p for p in pids if _alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.01)
        alive = [p for p in alive if _alive(p)]
    for p in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return tuple(alive)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def run_job(job: Job, logs: Path, fault: Callable[[list[int]], bool] | None = None,
            timeout: float = TIMEOUT) -> Ended:
    """Run ``job`` to its end. ``fault(pids)`` is polled every few ms while it runs and does
    its damage when it returns True (it is then no longer polled). Processes that outlive a
    killed parent by 10 s are counted as orphans and killed."""
    procs = _start(job, logs)
    t0, killed, kids = time.monotonic(), False, set()
    try:
        while any(p.poll() is None for p, _, _ in procs):
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{job.cmds[0][:6]} still running after {timeout:.0f} s")
            for p, _, _ in procs:
                kids |= descendants(p.pid)
            running = any(p.poll() is None for p, _, _ in procs)
            if fault is not None and fault([p.pid for p, _, _ in procs]):
                killed, fault = running, None
            time.sleep(0.003)
    finally:
        for p, _, _ in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    orphans = _gone(sorted(kids), 10.0) if killed else _gone(sorted(kids), 0.0)
    return Ended(tuple(p.returncode for p, _, _ in procs),
                 tuple(e.read_text(errors="replace") for _, _, e in procs),
                 tuple(o.read_text(errors="replace") for _, o, _ in procs), killed, orphans)


def kill_at(delay: float, victims: Sequence[int], then: float = 0.0) -> Callable[[list[int]],
                                                                               bool]:
    """A fault: SIGKILL process ``victims[0]`` (an index into the job) ``delay`` s after the
    start, then the rest of ``victims`` ``then`` s later, as a launcher tears a job down."""
    t0 = time.monotonic()
    done: list[int] = []

    def fault(pids: list[int]) -> bool:
        now = time.monotonic() - t0
        for k, v in enumerate(victims):
            if v not in done and now >= delay + (then if k else 0.0):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pids[v], signal.SIGKILL)
                done.append(v)
        return len(done) == len(victims)
    return fault


# ---------------------------------------------------------------------------- checks


def digests(root: Path, skip: Sequence[str] = (".imgprep", ".imgprep-stage")) -> dict[str, str]:
    """sha256 of every file under ``root`` by relative path, except resume state folders."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file() and not set(p.relative_to(root).parts) & set(skip)}


def _problems(*checks: tuple[bool, str]) -> str:
    return "; ".join(msg for bad, msg in checks if bad)


def _trial(group: str, kind: str, where: str, problems: str, seen: str) -> Trial:
    return Trial(group, kind, not problems, f"{where}: {problems or seen}")


def _timed(job: Job, logs: Path) -> tuple[Ended, float]:
    t0 = time.monotonic()
    ended = run_job(job, logs)
    return ended, time.monotonic() - t0


# ---------------------------------------------------------------------------- convert


@dataclass(frozen=True)
class ConvertCase:
    """One convert set-up under fault: output format, workers per process, ranks."""

    fmt: str
    workers: int
    ranks: int

    @property
    def kind(self) -> str:
        where = "single process" if self.ranks == 1 else f"{self.ranks} ranks (shared --out)"
        return f"SIGKILL, {self.fmt}, {self.workers} worker(s), {where}"


CONVERT_CASES = tuple(ConvertCase(f, w, r) for f in ("shards", "list") for w in (1, 2)
                      for r in (1, 2))


def convert_source(work: Path, per_class: int) -> Path:
    """The fake ILSVRC2012 train tar (10 classes, every quirk, the bad images too), made once
    beside ``work`` (in its parent, which holds every fault kind's own folder) and shared by
    the kinds of a run."""
    raw = work.parent / f"raw-{per_class}"
    if not (raw / "ILSVRC2012_img_train.tar").exists():
        make_sample(raw, classes=10, per_class=per_class, val=0, bad=True)
    return raw / "ILSVRC2012_img_train.tar"


def convert_job(src: Path, out: Path, case: ConvertCase) -> Job:
    args = [sys.executable, "-m", "imgprep", "convert", src, "-o", out, "--format", case.fmt,
            "-j", case.workers, "--max-errors", 20, "--shard-size", 40, "--wait-timeout", 120,
            "-q", "--json"]
    if case.ranks == 1:
        return Job.of([args], [clean_env()])
    return Job.of([args] * case.ranks, [rank_env(r, case.ranks) for r in range(case.ranks)])


def convert_kills(work: Path, trials: int, seed: int = 0,
                  cases: Sequence[ConvertCase] = CONVERT_CASES,
                  per_class: int = 120) -> list[Trial]:
    """SIGKILL a convert of ``per_class`` x 10 images at ``trials`` random points per case,
    then rerun it: the rerun must exit 0 and the output equal the uninterrupted run's byte
    for byte, with no ``.tmp-`` file, and no worker may outlive its killed parent. Under
    ranks, one rank is killed and the rest up to 0.5 s later, as a launcher does."""
    src = convert_source(work, per_class)
    rng = random.Random(seed)
    out: list[Trial] = []
    for case in cases:
        name = f"{case.fmt}-{case.workers}w-{case.ranks}r"
        ref = work / f"ref-{name}"
        shutil.rmtree(ref, ignore_errors=True)  # a fresh run: its duration spans the kills
        ended, seconds = _timed(convert_job(src, ref, case), work / "logs" / f"ref-{name}")
        if any(ended.codes):
            out.append(Trial("convert", case.kind, False, f"reference run: {ended.why()}"))
            continue
        want = digests(ref)
        for i in range(trials):
            dst = work / f"{name}-{i}"
            delay = rng.uniform(0.02, 1.0) * seconds
            victims = rng.sample(range(case.ranks), case.ranks)
            hit = run_job(convert_job(src, dst, case), work / "logs" / f"{name}-{i}",
                          kill_at(delay, victims, rng.uniform(0, 0.5)))
            rerun = run_job(convert_job(src, dst, case), work / "logs" / f"{name}-{i}-rerun")
            where = f"kill at {delay:.2f} s of {seconds:.2f} s"
            out.append(_trial("convert", case.kind, where, _problems(
                (bool(hit.orphans), f"workers {hit.orphans} outlived the kill"),
                (any(rerun.codes), f"rerun: {rerun.why()}"),
                (not any(rerun.codes) and digests(dst) != want,
                 "output differs from the uninterrupted run"),
                (bool(tmp_leftovers(dst)), f"left {tmp_leftovers(dst)[:3]}")),
                "killed; rerun identical" if hit.killed else "finished before the kill"))
            shutil.rmtree(dst)
    return out


# ---------------------------------------------------------------------------- stage-to-node


STAGE_PER_CLASS = 48  # images per class of the set the stage, loader and trainer kinds use
# The same in reduced runs (the tests, the report's --quick): every quirk and the bad images
# still, and an epoch of 15 batches of 8 for the loader and trainer kinds.
REDUCED_PER_CLASS = 12


def shard_source(work: Path, shards: int = 24, per_class: int = STAGE_PER_CLASS) -> Path:
    """``convert_source`` of ``per_class`` images a class converted (``shards`` shards, a few
    MB in all), made once beside ``work`` like it and shared by the kinds of a run: none of
    them changes it for good. The kinds call it with the defaults; a reduced run calls it
    first with fewer images, and they stage that set."""
    out = work.parent / "shards"
    if not (out / "train.json").exists():
        src = convert_source(work, per_class)
        done = subprocess.run([sys.executable, "-m", "imgprep", "convert", str(src), "-o",
                               str(out), "--shards", str(shards), "--max-errors", "20", "-q"],
                              env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT)
        if done.returncode:
            raise RuntimeError(f"cannot make the shards to stage: {done.stderr}")
    return out


def stage_job(src: Path, dst: Path, local_ranks: int = 1, *extra: object) -> Job:
    cmd = [sys.executable, "-m", "imgprep", "stage-to-node", "--src", src, "--dst", dst,
           "--split", "train", "--jobs", 2, "--timeout", WAIT_S, "-q", "--json", *extra]
    if local_ranks == 1:
        return Job.of([cmd], [clean_env()])
    return Job.of([cmd] * local_ranks, [rank_env(r, local_ranks) for r in range(local_ranks)])


def bad_finals(dst: Path, src: Path) -> list[str]:
    """Files under a final shard name whose bytes are not the manifest's."""
    want = {s.name: s.sha256 for s in read_manifest(src, "train").shards}
    return [p.name for p in sorted(dst.glob("*.tar")) if not p.name.startswith(".") and
            hashlib.sha256(p.read_bytes()).hexdigest() != want.get(p.name)]


def _stage_trial(kind: str, where: str, src: Path, job: Job, dst: Path, logs: Path,
                 checks: Sequence[tuple[bool, str]], seen: str) -> Trial:
    """Finish a stage-to-node trial: after the fault, no file under a final name may differ
    from the manifest (besides ``checks``); then the same ``job`` rerun must exit 0 with the
    source's shards and no leftovers. ``dst`` is removed afterwards."""
    bad = bad_finals(dst, src)
    rerun = run_job(job, logs)
    staged = {k: v for k, v in digests(dst).items() if k.endswith(".tar")} if dst.exists() else {}
    source = {k: v for k, v in digests(src).items() if k.endswith(".tar")}
    problems = _problems(*checks, (bool(bad), f"bad final files {bad}")) or _problems(
        (any(rerun.codes), f"rerun: {rerun.why()}"),
        (not any(rerun.codes) and staged != source, "staged shards differ from the source"),
        (bool(tmp_leftovers(dst)), f"left {tmp_leftovers(dst)[:3]}"))
    shutil.rmtree(dst, ignore_errors=True)
    return _trial("stage-to-node", kind, where, problems, seen)


def stage_kills(work: Path, trials: int, seed: int = 0) -> list[Trial]:
    """SIGKILL the copier of a two-rank node at a random point: no bad file under a final
    name; the waiting rank exits 0 (copy done) or 3 with one line saying the copier died
    (within seconds) or, when it was killed before it took the node's lock, that it never
    started (after ``--timeout``); the rerun completes with every shard valid and no
    temporary file."""
    src = shard_source(work)
    rng = random.Random(seed)
    _, seconds = _timed(stage_job(src, work / "ref", 2), work / "logs" / "stage-ref")
    out = []
    for i in range(trials):
        dst = work / f"stage-{i}"
        delay = rng.uniform(0.0, 1.0) * seconds
        hit = run_job(stage_job(src, dst, 2), work / "logs" / f"stage-{i}",
                      kill_at(delay, [0]))
        waiter = hit.codes[1]
        told = one_line_problem(hit.stderr[1], "copier", "rerun") if waiter else None
        if told is None and waiter and not ("died" in hit.stderr[1] or
                                            "never started" in hit.stderr[1]):
            told = f"the waiter does not say the copier died: {hit.stderr[1]!r}"
        out.append(_stage_trial(
            "SIGKILL of the copier; its waiting rank", f"kill at {delay:.2f} s of "
            f"{seconds:.2f} s", src, stage_job(src, dst, 2), dst,
            work / "logs" / f"stage-{i}-rerun",
            [(waiter not in (0, 3), f"waiter exit {waiter}"),
             (told is not None, f"waiter: {told}"),
             (bool(hit.orphans), f"orphans {hit.orphans}")],
            f"waiter exit {waiter}; rerun complete"))
    return out


@contextlib.contextmanager
def tiny_disk(where: Path, size: int) -> Iterator[Path | None]:
    """A ``size``-byte tmpfs at ``where`` (None where mounting is refused: not root)."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True, timeout=30).returncode:
        yield None
        return
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def _grow(disk: Path, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True,
                   capture_output=True, timeout=30)


def stage_disk_full(work: Path, trials: int, seed: int = 0) -> list[Trial]:
    """ENOSPC mid-copy on a real (tmpfs) disk sized at random below the node's share, with
    the free-space check told there is room: one line naming the shard and the full disk, no
    bad file under a final name; once the disk grows, the rerun completes."""
    from unittest import mock

    from imgprep import StageOptions, World, stage_to_node

    src = shard_source(work)
    total = read_manifest(src, "train").total_bytes
    rng = random.Random(seed)
    out = []
    real = shutil.disk_usage
    for i in range(trials):
        size = int(rng.uniform(0.1, 0.9) * total) // 4096 * 4096 + 4096
        with tiny_disk(work / f"disk-{i}", size) as disk:
            if disk is None:
                return [Trial("stage-to-node", "ENOSPC mid-copy", False,
                              "cannot mount a tmpfs here (needs root and mount(8))")]
            dst = disk / "dst"
            opts = StageOptions(src=src, dst=dst, split="train", jobs=2)
            try:
                with mock.patch("shutil.disk_usage",
                                lambda p: real(p)._replace(free=1 << 40)):
                    stage_to_node(opts, World())
                problem, seen = "the copy fitted on a disk smaller than the share", ""
            except StageError as e:
                msg = str(e)
                problem = one_line_problem(msg, "disk full", "train-", str(dst)) or ""
                seen = msg
            bad = bad_finals(dst, src)
            _grow(disk, total * 2 + (1 << 20))
            try:
                stage_to_node(opts, World())
                rest = _problems((bool(bad), f"bad final files {bad}"),
                                 (bool(tmp_leftovers(dst)), f"left {tmp_leftovers(dst)[:3]}"),
                                 (bool(bad_finals(dst, src)), "rerun left bad shards"))
            except ImgprepError as e:
                rest = f"rerun failed: {e}"
        out.append(_trial("stage-to-node", "ENOSPC mid-copy (real tmpfs)",
                          f"disk {size / 1e6:.2f} MB for {total / 1e6:.2f} MB",
                          _problems((bool(problem), problem), (bool(rest), rest)),
                          seen[:200]))
    return out


def _damage(path: Path, how: str, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip a byte":
        data[rng.randrange(len(data))] ^= 0xFF
    elif how == "truncate":
        del data[rng.randrange(len(data)):]
    else:
        data += b"\0" * 512
    path.write_bytes(bytes(data))


def stage_changed_source(work: Path, trials: int, seed: int = 0) -> list[Trial]:
    """A source shard changed after its manifest was written (a byte flipped, truncated, or
    grown): one line naming the shard and telling to reconvert, no bad final file; after the
    shard is restored the rerun completes."""
    src = shard_source(work)
    rng = random.Random(seed)
    out = []
    names = [s.name for s in read_manifest(src, "train").shards]
    for i in range(trials):
        victim = src / rng.choice(names)
        how = rng.choice(["flip a byte", "truncate", "grow"])
        dst = work / f"changed-{i}"
        keep = victim.read_bytes()
        _damage(victim, how, rng)
        try:
            hit = run_job(stage_job(src, dst), work / "logs" / f"changed-{i}")
        finally:
            victim.write_bytes(keep)
        told = one_line_problem(hit.stderr[0], victim.name, "reconvert") if hit.codes[0] else \
            "the changed shard was staged without error"
        out.append(_stage_trial(
            "source shard changed after the manifest", f"{how} in {victim.name}", src,
            stage_job(src, dst), dst, work / "logs" / f"changed-{i}-rerun",
            [(told is not None, str(told))], hit.why()))
    return out


def stage_vanishing_source(work: Path, trials: int, seed: int = 0) -> list[Trial]:
    """The source folder vanishes (renamed away) at a random point of the copy: exit 0 if
    it was done, else one line naming the missing file (exit 3; exit 2, click's usage error
    naming --src, when it was gone before the command parsed its options); never a bad
    final file; once the source is back the rerun completes."""
    src = shard_source(work)
    rng = random.Random(seed)
    _, seconds = _timed(stage_job(src, work / "vanish-ref"), work / "logs" / "vanish-ref")
    aside = src.with_name("shards-away")
    out = []
    for i in range(trials):
        dst = work / f"vanish-{i}"
        delay = rng.uniform(0.0, 1.0) * seconds
        t0 = time.monotonic()

        def vanish(_: list[int], t0: float = t0, delay: float = delay) -> bool:
            if time.monotonic() - t0 < delay:
                return False
            os.rename(src, aside)
            return True
        try:
            hit = run_job(stage_job(src, dst), work / "logs" / f"vanish-{i}", vanish)
        finally:
            if aside.exists():
                os.rename(aside, src)
        told = one_line_problem(hit.stderr[0], str(src)) if hit.codes[0] == 3 else None
        if hit.codes[0] == 2 and not (str(src) in hit.stderr[0] and
                                      "does not exist" in hit.stderr[0]):
            told = f"usage error without the path: {hit.stderr[0]!r}"
        out.append(_stage_trial(
            "source vanishing mid-copy", f"gone at {delay:.2f} s of {seconds:.2f} s", src,
            stage_job(src, dst), dst, work / "logs" / f"vanish-{i}-rerun",
            [(hit.codes[0] not in (0, 2, 3), f"exit {hit.codes[0]}"),
             (told is not None, str(told))], hit.why()))
    return out


# ---------------------------------------------------------------------------- loaders, trainer


def worker_kills(work: Path, trials: int, seed: int = 0) -> list[Trial]:
    """SIGKILL one DataLoader worker at a random batch: a LoaderError naming the worker, its
    batch and that batch's shards (never a hang or a bare traceback); a fresh loader resumed at
    the last batch taken gives exactly the batches an uninterrupted run gives from there."""
    import torch

    from imgprep import World
    from loaders import LoaderError, LoaderOptions, ShardLoader, TrainTransform

    src = shard_source(work)
    rng = random.Random(seed)
    transform = TrainTransform(size=32)

    def loader() -> ShardLoader:
        return ShardLoader(src, "train", World(), LoaderOptions(batch_size=8, workers=2,
                                                                transform=transform, seed=1))

    whole = [lab.clone() for _, lab in loader()]
    out = []
    for _ in range(trials):
        at, victim = rng.randrange(1, len(whole) - 1), rng.randrange(2)
        ld = loader()
        taken, problem, seen = 0, "", ""
        try:
            for k, (_, labels) in enumerate(ld):
                if not torch.equal(labels, whole[k]):
                    problem = f"batch {k} differs before the kill"
                taken = k + 1
                if k == at:
                    os.kill(ld.worker_pids[victim], signal.SIGKILL)
            problem = problem or "the epoch ended as if nothing happened"
        except LoaderError as e:
            seen = str(e)
            if f"worker {victim} (pid " not in seen:
                problem = f"the error does not name worker {victim}: {seen[:300]}"
        resumed = loader()
        resumed.load_state_dict(resumed.state_dict() | {"epoch": 0, "batch": taken})
        tail = [lab for _, lab in resumed]
        if len(tail) != len(whole) - taken or not all(
                torch.equal(a, b) for a, b in zip(tail, whole[taken:], strict=False)):
            problem += f"; resuming at batch {taken} does not give the uninterrupted tail"
        out.append(_trial("loader", "SIGKILL of a DataLoader worker mid-epoch",
                          f"worker {victim} after batch {at}", problem, seen[:200]))
    return out


def _train_cmd(data: Path, *args: object) -> list[object]:
    return [sys.executable, TRAIN, "--data", data, "--arch", "tiny", "--batch-size", 8,
            "--workers", 1, "--image-size", 32, "--epochs", 100, "--warmup-epochs", 1,
            "--log-every", 1, "--threads", 1, "--no-validate", *args]


def losses(log: Path) -> dict[int, float]:
    if not log.exists():
        return {}
    return {r["step"]: r["loss"] for r in map(json.loads, log.read_text().splitlines())
            if "loss" in r}


def rank_kills(work: Path, trials: int, seed: int = 0) -> list[Trial]:
    """SIGKILL one of two training ranks at a random step: the survivor exits non-zero with
    one line saying a rank failed, within the process-group timeout (20 s), never hanging."""
    data = shard_source(work)
    rng = random.Random(seed)
    out = []
    for i in range(trials):
        victim, steps = rng.randrange(2), rng.randrange(2, 12)
        port = free_port()
        cmd = _train_cmd(data, "--timeout", 20)
        envs = [rank_env(r, 2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port) for r in range(2)]
        log = work / "logs" / f"rank-{i}"
        t_kill: list[float] = []

        def at_step(pids: list[int], victim: int = victim, steps: int = steps,
                    log: Path = log, t_kill: list[float] = t_kill) -> bool:
            text = (log / "0.out").read_text() if (log / "0.out").exists() else ""
            if text.count("\nstep ") + text.startswith("step ") < steps:
                return False
            os.kill(pids[victim], signal.SIGKILL)
            t_kill.append(time.monotonic())
            return True
        hit = run_job(Job.of([cmd, cmd], envs), log, at_step, timeout=120)
        waited = time.monotonic() - t_kill[0] if t_kill else 0.0
        other = 1 - victim
        last = hit.stderr[other].strip().splitlines()[-1] if hit.stderr[other].strip() else ""
        told = one_line_problem(last, "rank") if hit.codes[other] else "the survivor exited 0"
        out.append(_trial("trainer", "SIGKILL of a rank mid-epoch (2 Gloo ranks)",
                          f"rank {victim} killed after step {steps}", _problems(
                              (not t_kill, "training ended before the kill"),
                              (told is not None, f"survivor: {told}"),
                              (waited > 60, f"the survivor took {waited:.0f} s"),
                              (bool(hit.orphans), f"orphans {hit.orphans}")),
                          f"survivor exit {hit.codes[other]} after {waited:.1f} s"))
    return out


def trainer_kills(work: Path, trials: int, seed: int = 0) -> list[Trial]:
    """SIGKILL a single-process training run at a random moment (checkpoints every step, so
    many kills land inside a checkpoint write), then ``--resume``: the checkpoint on disk
    always loads (``weights_only``), and the resumed losses equal the uninterrupted run's."""
    import torch

    data = shard_source(work)
    rng = random.Random(seed)
    steps = 16
    ref_log = work / "train-ref.jsonl"
    ref, seconds = _timed(Job.of([_train_cmd(data, "--steps", steps, "--log-json", ref_log)],
                                 [clean_env()]), work / "logs" / "train-ref")
    if any(ref.codes):
        return [Trial("trainer", "resume after SIGKILL", False, f"reference: {ref.why()}")]
    want = losses(ref_log)
    out = []
    for i in range(trials):
        ckpt, log = work / f"ckpt-{i}", work / f"train-{i}.jsonl"
        cmd = _train_cmd(data, "--steps", steps, "--checkpoint", ckpt, "--checkpoint-every", 1,
                         "--log-json", log)
        delay = rng.uniform(0.3, 1.0) * seconds
        mid_write: list[bool] = []

        def fault(pids: list[int], delay: float = delay, t0: float = time.monotonic(),
                  ckpt: Path = ckpt, mid_write: list[bool] = mid_write) -> bool:
            if time.monotonic() - t0 < delay:
                return False
            os.kill(pids[0], signal.SIGKILL)
            mid_write.append(any(ckpt.glob(".tmp-*")))
            return True
        run_job(Job.of([cmd], [clean_env()]), work / "logs" / f"train-{i}", fault)
        last = ckpt / "last.pt"
        loads, broken = "no checkpoint yet", ""
        if last.exists():
            try:
                loads = f"checkpoint at step {torch.load(last, weights_only=True)['step']}"
            except (RuntimeError, OSError, KeyError, EOFError, ValueError) as e:
                broken = f"the checkpoint left by the kill does not load: {e}"
        rerun = run_job(Job.of([[*cmd, "--resume"]], [clean_env()]),
                        work / "logs" / f"train-{i}-rerun")
        got = losses(log)
        problem = _problems((bool(broken), broken),
                            (any(rerun.codes), f"resume: {rerun.why()}"),
                            (not any(rerun.codes) and
                             any(got.get(s) != v for s, v in want.items()),
                             "resumed losses differ from the uninterrupted run"))
        out.append(_trial("trainer", "SIGKILL, then --resume (checkpoint every step)",
                          f"kill at {delay:.2f} s of {seconds:.2f} s"
                          f"{' during a checkpoint write' if mid_write and mid_write[0] else ''}",
                          problem, f"{loads}; resumed losses identical"))
        shutil.rmtree(ckpt, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------- all of it


FAULTS: dict[str, Callable[[Path, int, int], list[Trial]]] = {
    "convert": convert_kills,
    "stage-kill": stage_kills,
    "stage-enospc": stage_disk_full,
    "stage-changed": stage_changed_source,
    "stage-vanish": stage_vanishing_source,
    "worker-kill": worker_kills,
    "rank-kill": rank_kills,
    "trainer-kill": trainer_kills,
}


def run_faults(work: Path, trials: int, seed: int = 0,
               only: Sequence[str] = tuple(FAULTS)) -> list[Trial]:
    """Every fault kind in ``only``, ``trials`` trials each (convert: per set-up)."""
    out: list[Trial] = []
    for name in only:
        sub = work / name
        sub.mkdir(parents=True, exist_ok=True)
        out += FAULTS[name](sub, trials, seed)
    return out

