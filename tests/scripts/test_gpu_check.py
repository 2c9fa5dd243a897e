"""The GPU acceptance kit (``scripts/gpu_check.py``, the harness room ``harness/gpukit``).

Its CPU form runs here as users run it (``python scripts/gpu_check.py --device cpu --quick``)
so that the kit cannot rot; the tests marked ``gpu`` hold what only a CUDA machine shows, and
skip with one line elsewhere (``tests/conftest.py``)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.checks import clean_env
from harness.gpukit.data import class_counts, write_train_tar
from harness.gpukit.nvjpeg import worker_counts
from harness.gpukit.profile import PROFILES, Profile
from harness.gpukit.record import Record, figure, holds, markdown, ratio
from harness.gpukit.run import main as run_kit
from harness.gpukit.run import wheel_problem
from harness.gpukit.wheel import PACKAGES, differences
from imgprep import World
from loaders import DeviceLoader, normalize
from scripts.trainkit import distributed
from tests.support import REPO

KIT = REPO / "scripts" / "gpu_check.py"
EVERY = ("trainer", "nccl", "deviceloader", "loader", "convert", "dali", "nvjpeg",
         "nvjpeg_trainer")
# The CPU form runs the whole kit once, in a module fixture that the first test using it pays
# for: 2.5-3 minutes on the shared 2-core machine with an empty inductor cache, 5-8.5 with
# two CPU-bound processes beside it (docs/gpu_check.md). The kit's timeout, and those tests'
# (pytest's 300 s counts a test's fixtures), leave more than twice that.
KIT_TIMEOUT_S = 1080
with_the_kit = pytest.mark.timeout(KIT_TIMEOUT_S + 60)


def kit(*args: str | Path, timeout: float = 600, pythonpath: str = "",
        ) -> subprocess.CompletedProcess[str]:
    """The documented command, from the repository root."""
    path = ":".join(p for p in (pythonpath, str(REPO)) if p)
    return subprocess.run([sys.executable, str(KIT), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=clean_env(PYTHONPATH=path))


def record_of(out: Path) -> dict[str, Any]:
    return json.loads((out / "gpu_check.json").read_text())


def rows_of(record: dict[str, Any], check: str) -> dict[str, dict[str, str]]:
    return {r["measure"]: r for r in record["checks"][check]["rows"]}


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str],
                                                               Path, Path]:
    """The CPU form, once: its run, its --out folder and its --work folder (data kept)."""
    out, work = tmp_path_factory.mktemp("gpu-out"), tmp_path_factory.mktemp("gpu-work")
    return (kit("--device", "cpu", "--quick", "--out", out, "--work", work,
                timeout=KIT_TIMEOUT_S), out, work)


@pytest.mark.slow
@with_the_kit
def test_cpu_form_runs_every_check_it_has_and_holds(cpu_run: Any) -> None:
    done, out, _ = cpu_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rec = record_of(out)
    ran = set(rec["checks"]) | set(rec["skipped"])
    assert ran == set(EVERY) and not rec["failed"] and rec["all_pass"]
    assert set(rec["skipped"]) <= {"dali"}  # DALI only where it imports
    assert rec["kit"]["profile"] == "cpu-quick" and rec["machine"]["gpu"] is None
    for check in rec["checks"].values():  # every equality held, no target judged on a CPU
        assert {r["result"] for r in check["rows"]} <= {"", "PASS", "info"}


@pytest.mark.slow
@with_the_kit
def test_cpu_form_says_what_it_found_first(cpu_run: Any) -> None:
    done, _, _ = cpu_run
    lines = done.stdout.splitlines()
    heads = [line.split(":", 2)[1].strip() for line in lines[:5]]
    assert heads[0] == "GPU" and heads[1].startswith("torch")
    assert heads[2].startswith("PIL") and "cores" in heads[3]
    assert heads[4] == "optional packages missing"
    assert "pillow-simd" in lines[2] and "crop-aware decoder" in lines[2]


@pytest.mark.slow
@with_the_kit
def test_cpu_form_records_the_figures_each_check_promises(cpu_run: Any) -> None:
    _, out, _ = cpu_run
    rec = record_of(out)
    trainer = rec["checks"]["trainer"]
    assert trainer["synthetic"]["images_per_s"] > 0 and trainer["fed"]["images_per_s"] > 0
    assert set(trainer["fed"]["ms"]) == {"data", "compute", "allreduce", "optimizer"}
    assert rows_of(rec, "trainer")["fed / synthetic"]["target"] == ">= 0.95"
    recipe = trainer["recipe"]  # --recipe torchvision-v2, fed and synthetic
    assert recipe["synthetic"]["images_per_s"] > 0 and recipe["fed"]["images_per_s"] > 0
    assert (recipe["config"]["ra_reps"], recipe["config"]["model_ema"]) == (4, True)
    assert (recipe["config"]["arch"], recipe["config"]["mixup"]) == ("tiny", 0.2)  # given, preset
    assert [m for m in rows_of(rec, "trainer") if m.startswith("--recipe")] == [
        "--recipe torchvision-v2 (ta_wide, random erasing, mixup/cutmix, RA x4, EMA): "
        "synthetic / fed img/s (fed / synthetic)",
        "--recipe torchvision-v2: fed / the plain fed run"]
    nccl = rows_of(rec, "nccl")
    assert any(m.startswith("losses equal") and r["result"] == "PASS" for m, r in nccl.items())
    assert rec["checks"]["nccl"]["pair"] == ["gloo", "gloo"]
    assert rec["checks"]["nccl"]["losses"]["a"] == rec["checks"]["nccl"]["losses"]["b"]
    device = rows_of(rec, "deviceloader")
    assert device["DeviceLoader / loader alone"]["result"] == "info"
    assert any(r["result"] == "PASS" for r in device.values())
    convert = " ".join(rows_of(rec, "convert"))
    assert "1,281,167 images" in convert and "(measured" in convert and "derived" not in convert
    assert "convert / ceiling" in convert and rec["checks"]["convert"]["ceiling"][0] > 0
    assert "fixed cost + marginal rate" in convert and "marginal rate / ceiling" in convert
    conv = rec["checks"]["convert"]
    assert "sequential write" in convert and conv["disk_mbps"] > 0
    assert 1000 < conv["out_bytes_per_image"] < 200_000
    assert conv["marginal"] > 0 and conv["fixed_s"] >= 0 and len(conv["half"]) == len(
        conv["convert"])
    assert rec["checks"]["loader"]["ratio"] > 0


@pytest.mark.slow
@with_the_kit
def test_cpu_form_has_fed_and_synthetic_rows_at_its_size_eager_and_compiled(
        cpu_run: Any) -> None:
    """One size, eager and compiled: each pair's rows and the compiled / eager row, from
    runs that did compile (their logs say so) and runs that did not. At the quick CPU form's
    own 64 px its first pair, eager (``--compile auto`` on a CPU), is the eager one: no run
    repeats it."""
    _, out, work = cpu_run
    rec = record_of(out)
    trainer = rec["checks"]["trainer"]
    sizes = trainer["sizes"]
    assert set(sizes) == {"64px-eager", "64px-compiled"}
    assert sizes["64px-eager"] == {"synthetic": trainer["synthetic"], "fed": trainer["fed"]}
    assert all(run[kind]["images_per_s"] > 0 for run in sizes.values()
               for kind in ("synthetic", "fed"))
    rows = rows_of(rec, "trainer")
    sized = [m for m in rows if m.split(" ", 1)[0].isdigit()]
    assert sized == ["64 px, eager: synthetic / fed img/s (fed / synthetic)",
                     "64 px, compiled: synthetic / fed img/s (fed / synthetic)",
                     "64 px: torch.compile / eager, synthetic / fed"]
    speedups = rows["64 px: torch.compile / eager, synthetic / fed"]["value"].split(" / ")
    assert len(speedups) == 2 and all(float(x) > 0 for x in speedups)
    for kind in ("synthetic", "fed"):
        for name, mode, on in ((kind, "auto", False), (f"{kind}-64-compiled", "on", True)):
            log = (work / f"train-{name}.jsonl").read_text().splitlines()
            assert {"compile": {"mode": mode, "on": on, "sizes": [64]}} in [
                json.loads(line) for line in log], name
    assert not list(work.glob("train-*-eager.jsonl"))  # the eager pair ran once
    assert rows["torch.compile (--compile auto)"]["value"] == "off"  # eager on the CPU


@pytest.mark.slow
@with_the_kit
def test_cpu_form_runs_the_nvjpeg_check_without_torchvision(cpu_run: Any) -> None:
    """The nvjpeg backend's CPU form decodes with Pillow: the check runs where torchvision
    is absent, with the same samples as Pillow, its rate beside the Pillow loader's, and the
    tiny model fed by each beside its ceiling."""
    _, out, _ = cpu_run
    rec = record_of(out)
    assert {"nvjpeg", "nvjpeg_trainer"} <= set(rec["checks"]) and not rec["skipped"].keys() & {
        "nvjpeg", "nvjpeg_trainer"}
    rows = rows_of(rec, "nvjpeg")
    assert rows["device='cpu': the same samples per rank and step as Pillow"]["result"] == "PASS"
    nv = rec["checks"]["nvjpeg"]
    assert all(p["images_per_s"] > 0 for passes in nv["loaders"].values() for p in passes)
    assert set(nv["loaders"]) == {"nvjpeg"} | {f"pillow-{w}" for w in worker_counts()}
    tiny = rec["checks"]["nvjpeg_trainer"]["trainer"]["tiny"]
    assert {"synthetic", "nvjpeg", "pillow"} == set(tiny)
    assert all(run["images_per_s"] > 0 for run in tiny.values())
    assert any(m.startswith("tiny, 64 px, batch 16: fed / synthetic")
               for m in rows_of(rec, "nvjpeg_trainer"))


@pytest.mark.slow
@with_the_kit
def test_cpu_form_writes_a_table_with_every_row(cpu_run: Any) -> None:
    done, out, _ = cpu_run
    rec, table = record_of(out), (out / "gpu_check.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_check.md"]
    assert table.startswith("### GPU acceptance, CPU form, quick (")
    assert "PYTHONPATH=. python scripts/gpu_check.py --device cpu --quick" in table
    body = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    rows = [r for c in rec["checks"].values() for r in c["rows"]]
    assert len(body) == 1 + len(rows)  # the header, then one line a row
    assert all(line.count(" | ") == 4 for line in body)  # no cell broke the table
    assert table in done.stdout  # printed too


@pytest.fixture(scope="module")
def only_run(cpu_run: Any, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``--only loader,dali`` on the CPU form's data, where nvidia.dali is found but cannot
    load: its run and its --out folder."""
    _, _, work = cpu_run  # the data made there is reused
    tmp = tmp_path_factory.mktemp("only")
    fake = tmp / "site" / "nvidia" / "dali"  # nvidia.dali found, but it cannot load
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")  # before any installed nvidia package
    (fake / "__init__.py").write_text("raise ImportError('libcudart.so.12: cannot open "
                                      "shared object file')\n")
    done = kit("--device", "cpu", "--quick", "--only", "loader,dali", "--out", tmp / "out",
               "--work", work, pythonpath=str(tmp / "site"), timeout=300)
    return done, tmp / "out"


@pytest.mark.slow
@with_the_kit
def test_only_runs_the_named_checks(only_run: Any) -> None:
    done, out = only_run
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(record_of(out)["checks"]) == ["loader"]
    assert "gpu_check: trainer" not in done.stdout


def test_only_refuses_an_unknown_check(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        run_kit(["--only", "loader,warp"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "warp" in err and "deviceloader" in err


@pytest.mark.slow
@with_the_kit
def test_a_missing_dependency_is_skipped_with_one_line(only_run: Any) -> None:
    done, out = only_run
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stdout.splitlines() if line.startswith("gpu_check:")
            and "dali" in line]
    assert said == ["gpu_check: skip dali: nvidia.dali does not import: ImportError: "
                    "libcudart.so.12: cannot open shared object file"]
    rec = record_of(out)
    assert "dali" not in rec["checks"] and set(rec["skipped"]) == {"dali"}
    assert rec["machine"]["optional"]["nvidia.dali"] is True


def test_device_cuda_without_a_gpu_is_refused_in_one_line() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    done = kit("--device", "cuda", timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "gpu_check: error: --device cuda, but torch sees no CUDA device; run with --device "
        "cpu for the CPU form"]


def test_trainer_refuses_nccl_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(distributed.DistError, match="--backend nccl needs a CUDA device"):
        distributed.init(World(), 10.0, "nccl")


def test_markdown_keeps_one_cell_per_column_and_failures_fail() -> None:
    rec = Record(out=None, kit={"form": "CPU form", "date": "d", "command": "c"})
    rec.add("deviceloader", {"rows": [holds("deviceloader", "a|b", False, "x | y"),
                                      ratio("deviceloader", "r", 0.5, 0.95, applies=True),
                                      figure("deviceloader", "n", 1234.5)]})
    rec.add("loader", {"error": "RuntimeError: boom"})
    lines = [line for line in markdown(rec).splitlines() if line.startswith("| ")]
    assert all(line.replace("\\|", "").count("|") == 6 for line in lines)
    assert "| 1,234.5 |" in lines[3] and lines[-1].endswith("| FAIL |")
    assert rec.failed == ["deviceloader", "loader"] and not rec.as_json()["all_pass"]
    assert ratio("c", "r", 0.5, 0.95, applies=False).result == "info"


def test_profiles_leave_a_log_interval_after_the_first() -> None:
    assert all(p.steps >= 2 * p.log_every for p in PROFILES.values())
    with pytest.raises(ValueError, match="two"):
        Profile(**{**PROFILES["cpu-quick"].__dict__, "steps": 3})


def test_only_the_quick_cpu_form_leaves_a_size_out() -> None:
    """The GPU runs and the full CPU form keep both ends of a resolution schedule; the quick
    CPU form (make test's) runs one size, its own, eager and compiled."""
    assert {n: p.res_sizes for n, p in PROFILES.items()} == {
        "cuda": (160, 224), "cuda-quick": (160, 224), "cpu": (160, 224), "cpu-quick": (64,)}
    assert PROFILES["cpu-quick"].image_size == 64


def test_synthetic_input_is_an_ilsvrc_train_tar(tmp_path: Path) -> None:
    assert sum(class_counts(32_000)) == 32_000 and len(class_counts(32_000)) == 1000
    assert class_counts(100) == [34, 33, 33]
    pool = [b"\xff\xd8a", b"\xff\xd8bc"]
    write_train_tar(tmp_path / "t.tar", 100, pool)
    with tarfile.open(tmp_path / "t.tar") as outer:
        names = outer.getnames()
        inner = outer.extractfile(names[0])
        assert inner is not None
        with tarfile.open(fileobj=io.BytesIO(inner.read())) as tf:
            members = tf.getnames()
    assert len(names) == 3 and all(n.startswith("n") and n.endswith(".tar") for n in names)
    assert len(members) == 34 and members[0] == f"{names[0][:-4]}_1.JPEG"


# ---------------------------------------------------------------------------- the wheel

WHEELS = sorted((REPO / "dist").glob("imgprep-*-manylinux*.whl"))


def copy_sources(site: Path) -> Path:
    """The Python files of imgprep and loaders, as a wheel installs them, in ``site``."""
    for pkg in PACKAGES:
        for f in (REPO / pkg).rglob("*.py"):
            dest = site / f.relative_to(REPO)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)
    return site


def test_a_wheels_sources_are_compared_with_the_checkouts(tmp_path: Path) -> None:
    site = copy_sources(tmp_path / "site")
    (site / "imgprep" / "data.bin").write_bytes(b"x")  # not a source: not compared
    assert differences(site) == []
    (site / "loaders" / "base.py").write_text("# changed\n")
    (site / "imgprep" / "errors.py").unlink()
    (site / "imgprep" / "extra.py").write_text("")
    assert differences(site) == ["imgprep/errors.py", "imgprep/extra.py", "loaders/base.py"]


def test_the_kit_runs_only_on_the_wheel_of_its_checkout() -> None:
    from_checkout = {"site": str(REPO), "wheel": False, "differ": []}
    assert wheel_problem(None, from_checkout) is None
    assert "run it through scripts/gpu_check.py" in str(wheel_problem(Path("w.whl"),
                                                                      from_checkout))
    other = {"site": "/s", "wheel": True, "differ": [f"imgprep/m{i}.py" for i in range(7)]}
    why = wheel_problem(Path("w.whl"), other)
    assert why is not None and "/s was built from other sources" in why
    assert "imgprep/m4.py, ..." in why and why.endswith("rebuild it (make wheel)")


@pytest.mark.slow
@pytest.mark.skipif(not WHEELS, reason=f"no wheel in {REPO / 'dist'} (make wheel makes it)")
def test_the_kit_runs_imgprep_from_the_wheel_without_ld_library_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    done = kit("--wheel", WHEELS[-1].relative_to(REPO), "--device", "cpu", "--quick", "--only",
               "loader", "--out", tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    site = REPO / "build" / "gpu-kit" / "site"
    m = record_of(tmp_path)["machine"]
    assert m["imgprep"] == {"site": str(site), "wheel": True, "differ": [],
                            "ld_library_path": None}
    lib = m["libjpeg"]
    assert lib["bundled"] and lib["simd"] is True
    assert lib["extension"].startswith(str(site / "imgprep" / "_jpegcrop"))
    assert (f"gpu_check: imgprep from the wheel installed in {site} (its sources are the "
            f"checkout's); LD_LIBRARY_PATH unset; the decoder's extension: {lib['extension']}"
            in done.stdout.splitlines())


# ---------------------------------------------------------------------------- CUDA only


@pytest.mark.gpu
def test_device_loader_on_cuda_equals_the_cpu_normalisation() -> None:
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (8, 3, 32, 32), generator=gen, dtype=torch.uint8)
    images = images.contiguous(memory_format=torch.channels_last)
    batches = [(images, torch.arange(8)), (images.flip(0), torch.arange(8).flip(0))]
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    got = [(x.cpu(), y.cpu()) for x, y in DeviceLoader(batches, "cuda", mean, std)]
    m, s = (torch.tensor(v).view(1, 3, 1, 1) for v in (mean, std))
    for (x, y), (ix, iy) in zip(got, batches, strict=True):
        assert torch.equal(x, normalize(ix, m, s)) and torch.equal(y, iy)
        assert x.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.gpu
@pytest.mark.timeout(900)
def test_gpu_kit_proves_the_cuda_paths(tmp_path: Path) -> None:
    done = kit("--device", "cuda", "--quick", "--out", tmp_path, timeout=840)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rec = record_of(tmp_path)
    assert rec["machine"]["gpu"]["name"] and rec["checks"]["trainer"]["precision"]["bf16"]
    assert rec["checks"]["nccl"]["pair"] == ["nccl", "gloo"]
    assert rec["checks"]["nccl"]["losses"]["a"] == rec["checks"]["nccl"]["losses"]["b"]
    assert set(rec["checks"]) | set(rec["skipped"]) == set(EVERY)
    assert set(rec["skipped"]) <= {"dali", "nvjpeg", "nvjpeg_trainer"}  # where they import
