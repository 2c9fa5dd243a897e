"""The extension built with AddressSanitizer and UBSan, fuzzed in a child process.

``build`` compiles ``imgprep/_jpegcrop.c`` with ``IMGPREP_SANITIZE=1`` (setup.py: strict
warnings, ``-fsanitize=address,undefined -fno-sanitize-recover=all``) into a folder of its
own, leaving the normal build alone; ``run`` starts ``python -m harness.fuzz.run`` with
that module and libasan preloaded (the interpreter is not built with it), every target
(the crop-aware decoder's, convert's, the loader's, stored pixels' and the augmentation
ops') or the one named, so that any out-of-bounds access, use after free or undefined
behaviour aborts the child with the sanitizer's report, and the input in flight names what
caused it. ``toolchain`` says why this machine cannot do it (no compiler, no libasan, no
libjpeg headers), in one line.

    python -m harness.fuzz.sanitize --inputs 200000 [--seconds 3600] [--target raw]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.checks import clean_env
from harness.fuzz.run import TARGETS

REPO = Path(__file__).resolve().parents[2]
SANITIZER_OPTIONS = {
    "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}


@dataclass(frozen=True)
class Outcome:
    """A sanitized run: its exit code, the fuzz report (None when the child died), the tail
    of its stderr (the sanitizer's report), and the input in flight when it died."""

    returncode: int
    report: dict[str, object] | None
    stderr: str
    in_flight: bytes


def _compiler() -> str | None:
    cc = os.environ.get("CC", "cc").split()[0]
    return shutil.which(cc) or shutil.which("gcc") or shutil.which("clang")


def libasan() -> Path | None:
    """The compiler's AddressSanitizer runtime, to preload."""
    cc = _compiler()
    if cc is None:
        return None
    out = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True,
                         check=False).stdout.strip()
    path = Path(out).resolve() if out else None
    return path if path is not None and path.is_file() else None


def toolchain() -> str | None:
    """None when a sanitizer build can be made and run here, else why not (one line)."""
    if _compiler() is None:
        return "no C compiler (cc, gcc or clang) on PATH"
    if libasan() is None:
        return "the compiler has no AddressSanitizer runtime (libasan.so)"
    if not any(Path(d, "jpeglib.h").is_file() for d in ("/usr/include", "/usr/local/include")):
        return "no libjpeg headers (jpeglib.h: install libjpeg-dev)"
    return None


def build(dest: Path) -> Path:
    """The sanitizer build of the extension in ``dest``; RuntimeError naming the compiler's
    output when it fails (a warning is an error there)."""
    env = clean_env(IMGPREP_SANITIZE="1")
    run = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib",
                          str(dest / "lib"), "--build-temp", str(dest / "tmp")],
                         cwd=REPO, env=env, capture_output=True, text=True, check=False)
    built = sorted((dest / "lib" / "imgprep").glob("_jpegcrop*.so"))
    if run.returncode != 0 or not built:
        raise RuntimeError(f"the sanitizer build failed: {(run.stderr or run.stdout)[-2000:]}")
    return built[0]


def run(module: Path, *, inputs: int, seconds: float, seed: int = 0,
        timeout: float | None = None, target: str = "all") -> Outcome:
    """Fuzz the sanitizer build ``module`` in a child with libasan preloaded (``target``:
    ``harness.fuzz.run``'s ``--target``)."""
    asan = libasan()
    if asan is None:
        raise RuntimeError(toolchain() or "no libasan")
    with tempfile.TemporaryDirectory(prefix="imgprep-fuzz-") as tmp:
        in_flight = Path(tmp) / "in-flight.jpg"
        env = clean_env(LD_PRELOAD=str(asan), PYTHONPATH=str(REPO), **SANITIZER_OPTIONS)
        child = subprocess.run(
            [sys.executable, "-m", "harness.fuzz.run", "--extension", str(module), "--inputs",
             str(inputs), "--seconds", str(seconds), "--seed", str(seed), "--in-flight",
             str(in_flight), "--target", target, "--json"],
            cwd=REPO, env=env, capture_output=True, text=True, check=False,
            timeout=timeout or seconds * 2 + 120)
        lines = [ln for ln in child.stdout.splitlines() if ln.startswith("{")]
        report = json.loads(lines[-1]) if lines else None
        data = in_flight.read_bytes() if in_flight.exists() else b""
    return Outcome(child.returncode, report, child.stderr[-4000:], data)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=20_000)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", choices=("all", *TARGETS), default="all")
    ap.add_argument("--keep-crash", type=Path, default=Path("bench-out/fuzz-crash.jpg"))
    args = ap.parse_args(argv)
    why = toolchain()
    if why is not None:
        print(f"sanitizer fuzz skipped: {why}")
        return 0
    with tempfile.TemporaryDirectory(prefix="imgprep-asan-") as tmp:
        out = run(build(Path(tmp)), inputs=args.inputs, seconds=args.seconds, seed=args.seed,
                  target=args.target)
    if out.report is None:
        args.keep_crash.parent.mkdir(parents=True, exist_ok=True)
        args.keep_crash.write_bytes(out.in_flight)
        print(f"the sanitized child died (exit {out.returncode}); its input is in "
              f"{args.keep_crash}:\n{out.stderr}")
        return 1
    print(json.dumps({"sanitizers": "address,undefined", **out.report}))
    return 0 if out.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
