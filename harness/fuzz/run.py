"""The fuzz runner: mutated seeds into a target until enough inputs or time, every outcome
counted, every input that broke a property kept (and the one in flight written before each
call, so that a crash in C names its input).

A target (``harness.fuzz.target``) returns a short label of what happened and raises
``Mismatch`` when a promise fails; any other exception is a finding too. Input ``n`` of a
run with ``seed`` is a pure function of (seeds, seed, n) (``case``), so a finding is
replayed from its number.

    python -m harness.fuzz.run --inputs 20000 [--seconds 120] [--extension PATH]
        [--target all|jpegcrop|convert|sample|raw|augment] [--cpu-limit 2] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.fuzz.mutate import mutate
from harness.fuzz.target import Mismatch, Target

TARGETS = ("jpegcrop", "convert", "sample", "raw", "augment")  # --target's, besides all


@dataclass(frozen=True)
class Finding:
    """One input that broke a promise: its number, how it was made, and what broke."""

    number: int
    mutation: str
    sha256: str
    problem: str


@dataclass
class Report:
    """What a run did: inputs tried, seconds, outcomes by label, findings."""

    inputs: int = 0
    seconds: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"inputs": self.inputs, "seconds": round(self.seconds, 1),
                "inputs_per_s": round(self.inputs / self.seconds, 1) if self.seconds else 0.0,
                "outcomes": dict(sorted(self.outcomes.items())),
                "findings": [f.__dict__ for f in self.findings]}


def case(seeds: Sequence[bytes], seed: int, n: int) -> tuple[str, bytes, np.random.Generator]:
    """Input ``n`` of a run with ``seed``: how it was made, its bytes, and the generator the
    target then draws from (the same on a replay)."""
    rng = np.random.default_rng([seed, n])
    base = seeds[int(rng.integers(len(seeds)))]
    name, data = mutate(base, rng, seeds)
    return name, data, rng


def fuzz(target: Target, seeds: Sequence[bytes], *, inputs: int, seconds: float | None = None,
         seed: int = 0, in_flight: Path | None = None, keep: Path | None = None) -> Report:
    """Run ``target`` on mutated ``seeds`` until ``inputs`` were tried or ``seconds`` passed
    (whichever comes first). ``in_flight``: a file that holds the input being tried (what a
    crash leaves behind); ``keep``: a folder for the inputs of findings."""
    report = Report()
    t0 = time.monotonic()
    while report.inputs < inputs and (seconds is None or time.monotonic() - t0 < seconds):
        n = report.inputs
        name, data, rng = case(seeds, seed, n)
        if in_flight is not None:
            in_flight.write_bytes(data)
        try:
            outcome = target(data, rng)
        except Mismatch as e:
            outcome, problem = "mismatch", str(e)
        except Exception as e:  # noqa: BLE001 - any escape from the target is a finding
            outcome, problem = "exception", f"{type(e).__name__}: {e}"
        else:
            problem = ""
        if problem:
            sha = hashlib.sha256(data).hexdigest()
            report.findings.append(Finding(n, name, sha, problem[:500]))
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                (keep / f"{seed}-{n}-{sha[:12]}.jpg").write_bytes(data)
        report.outcomes[outcome] += 1
        report.inputs += 1
    report.seconds = time.monotonic() - t0
    return report


def main(argv: list[str] | None = None) -> int:
    from harness.fuzz.augment import augment_target
    from harness.fuzz.convert import convert_target
    from harness.fuzz.extension import jpegcrop_target, load_extension
    from harness.fuzz.rawsample import raw_target
    from harness.fuzz.sample import sample_target
    from harness.fuzz.seeds import default_folder, load_seeds
    from harness.fuzz.target import CPU_LIMIT, alternate

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=20_000)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--extension", type=Path, default=None,
                    help="the built _jpegcrop module to load (default: imgprep's own)")
    ap.add_argument("--seeds", type=Path, default=default_folder(),
                    help="the real ImageNet sample (synthetic photos where it is absent)")
    ap.add_argument("--target", choices=("all", *TARGETS), default="all",
                    help="the crop-aware decoder's calls, convert's, the loader's, stored "
                    "pixels' (record and sample), the augmentation ops', or each input to one")
    ap.add_argument("--cpu-limit", type=float, default=CPU_LIMIT,
                    help="seconds of CPU any one call into the extension may take")
    ap.add_argument("--in-flight", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None)
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    args = ap.parse_args(argv)
    mod = load_extension(args.extension)
    seeds, where = load_seeds(args.seeds, mod)
    limit = args.cpu_limit
    targets = {"jpegcrop": jpegcrop_target(mod, limit), "convert": convert_target(mod, limit),
               "sample": sample_target(mod, limit), "raw": raw_target(mod, limit),
               "augment": augment_target(mod, limit)}
    target = alternate(*targets.values()) if args.target == "all" else targets[args.target]
    report = fuzz(target, seeds, inputs=args.inputs,
                  seconds=args.seconds, seed=args.seed, in_flight=args.in_flight,
                  keep=args.keep)
    if not args.json:
        print(f"{report.inputs} inputs from {len(seeds)} seeds ({where}) in "
              f"{report.seconds:.1f} s; {len(report.findings)} findings")
        for label, count in sorted(report.outcomes.items()):
            print(f"  {label}: {count}")
        for f in report.findings[:20]:
            print(f"  FINDING input {f.number} ({f.mutation}): {f.problem}")
    print(json.dumps({"seeds": len(seeds), "seed_source": where, **report.to_json()}))
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
