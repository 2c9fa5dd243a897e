"""Run the GPU acceptance kit: say what the machine has, skip (one line each) the checks it
cannot run, run the others one at a time, and write the record as each finishes.

    PYTHONPATH=. python scripts/gpu_check.py --out gpu-out            # every check, the GPU run
    PYTHONPATH=. python scripts/gpu_check.py --only trainer,nccl       # some of them
    PYTHONPATH=. python scripts/gpu_check.py --device cpu --quick      # the CPU form (make test)

Checks, in this order: ``trainer``, ``nccl``, ``deviceloader``, ``loader``, ``convert``,
``dali``, ``nvjpeg``, ``nvjpeg_trainer`` (each module's docstring says what it measures
and holds); and, only when ``--only`` names them, ``feed`` and ``feed_half``
(``harness.gpukit.feed``: a study of their own, sized to fit 10 minutes of the lent H200:
``--only feed,feed_half``).
``--device auto`` (the default) runs on CUDA when torch sees it, else the CPU form;
``--quick`` runs each at the small sizes of ``harness.gpukit.profile``. ``--out DIR``
receives ``gpu_check.json`` and ``gpu_check.md`` (the table for docs/benchmarks.md),
rewritten after every check. The data (a synthetic ILSVRC2012-shaped input and its
conversion) is made in ``--work DIR`` and kept there for the next run; without ``--work``,
in a temporary folder removed at the end.
``--wheel FILE``: imgprep and loaders from that wheel, which ``scripts/gpu_check.py`` installs
and puts first on the path (``harness.gpukit.wheel``); a wheel of other sources is refused.

Exit 0 when every check ran and held (targets are judged on the full CUDA run only), 1 when
one raised, fell short of its target or found a difference, 2 for a usage error (``--device
cuda`` where torch sees no GPU; a ``--wheel`` not installed by the launcher, or built from
other sources than the checkout's).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import convert, dali, deviceloader, feed, loader, machine, nccl, nvjpeg, trainer
from .context import Context
from .profile import profile_for
from .record import JSON_NAME, Record, Row, markdown, today

CHECKS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "trainer": trainer.check,
    "nccl": nccl.check,
    "deviceloader": deviceloader.check,
    "loader": loader.check,
    "convert": convert.check,
    "dali": dali.check,
    "nvjpeg": nvjpeg.check,
    "nvjpeg_trainer": nvjpeg.trainer_check,
    "feed": feed.all_cpus,
    "feed_half": feed.half_cpus,
}
ASKED_FOR = ("feed", "feed_half")  # run only when --only names them (a study of their own)


def say(line: str) -> None:
    print(f"gpu_check: {line}", flush=True)


def names(text: str) -> list[str]:
    """``--only``: check names, comma-separated, in the kit's order."""
    wanted = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in CHECKS]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(f"unknown check(s) {', '.join(unknown) or '(none)'}; "
                                         f"choose from {', '.join(CHECKS)}")
    return [n for n in CHECKS if n in wanted]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                    help="cuda, cpu (the CPU form), or auto: cuda where torch sees a GPU")
    ap.add_argument("--quick", action="store_true", help="small sizes: a look, not figures")
    ap.add_argument("--only", type=names, metavar="NAMES",
                    default=[n for n in CHECKS if n not in ASKED_FOR],
                    help=f"comma-separated, from {','.join(CHECKS)} (default: all but "
                         f"{','.join(ASKED_FOR)}, which run only when named)")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for gpu_check.json and gpu_check.md (flat)")
    ap.add_argument("--work", type=Path, default=None,
                    help="folder for the data, kept for the next run (default: a temporary "
                         "folder, removed at the end)")
    ap.add_argument("--wheel", type=Path, default=None,
                    help="run imgprep from this wheel (scripts/gpu_check.py installs it into "
                         "build/gpu-kit/site, first on the path)")
    return ap.parse_args(argv)


def wheel_problem(asked: Path | None, found: dict[str, Any]) -> str | None:
    """Why the kit must not run on the imgprep it imports (None: it may)."""
    if asked is not None and not found["wheel"]:
        return (f"--wheel {asked}, but imgprep comes from the checkout: run it through "
                "scripts/gpu_check.py, which installs the wheel")
    if found["differ"]:
        return (f"the wheel in {found['site']} was built from other sources than this "
                f"checkout ({', '.join(found['differ'][:5])}"
                f"{', ...' if len(found['differ']) > 5 else ''}): rebuild it (make wheel)")
    return None


def device_of(asked: str) -> str | None:
    """The device to run on, or None where ``cuda`` was asked for and torch sees none."""
    import torch

    if asked == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if asked == "cuda" and not torch.cuda.is_available():
        return None
    return asked


def print_rows(rows: Sequence[Row]) -> None:
    for r in rows:
        mark = f"  [{r.target} {r.result}]" if r.target else ""
        print(f"    {r.measure}: {r.value}{mark}", flush=True)


def run_check(name: str, ctx: Context, record: Record) -> None:
    """One check, its rows printed and added to the record (or the error it raised)."""
    say(f"{name} ...")
    t0 = time.perf_counter()
    try:
        result = CHECKS[name](ctx)
    except (Exception, SystemExit) as e:  # a check that fails stops itself, not the kit
        first = (str(e).strip().splitlines() or [""])[0]
        result = {"error": f"{type(e).__name__}: {first}"[:2000]}
        say(f"{name} failed: {result['error']}")
    result["seconds"] = round(time.perf_counter() - t0, 1)
    record.add(name, result)
    print_rows([r for r in record.rows() if r.check == name])


def run(args: argparse.Namespace, device: str, work: Path) -> int:
    profile = profile_for(device, args.quick)
    form = ("CUDA" if device == "cuda" else "CPU form") + (", quick" if args.quick else "")
    record = Record(out=args.out, kit={
        "command": "PYTHONPATH=. python scripts/gpu_check.py " + shlex.join(sys.argv[1:]),
        "form": form, "profile": profile.name, "date": today(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()]})
    record.machine = machine.probe(device)
    for line in machine.lines(record.machine):
        say(line)
    if (why := wheel_problem(args.wheel, record.machine["imgprep"])) is not None:
        print(f"gpu_check: error: {why}", file=sys.stderr)
        return 2
    record.skipped = machine.unavailable(device, args.only)
    for name, why in record.skipped.items():
        say(f"skip {name}: {why}")
    record.write()
    ctx = Context(device=device, profile=profile, work=work)
    for name in args.only:
        if name not in record.skipped:
            run_check(name, ctx, record)
    record.kit["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    record.write()
    print("\n" + markdown(record), flush=True)
    if args.out is not None:
        say(f"record: {args.out / JSON_NAME} (and the table beside it)")
    if record.failed:
        say(f"failed: {', '.join(record.failed)}")
    return 1 if record.failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = device_of(args.device)
    if device is None:
        print("gpu_check: error: --device cuda, but torch sees no CUDA device; run with "
              "--device cpu for the CPU form", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return run(args, device, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
