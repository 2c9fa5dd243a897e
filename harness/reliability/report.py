"""Run the reliability harness and print what the project survives, as tables and one JSON line.

    python -m harness.reliability.report              # full: 20 trials per fault, full scale
    python -m harness.reliability.report --quick      # reduced: what CI runs, in minutes
    python -m harness.reliability.report --only convert,hostile --trials 5

Three parts:
- faults (harness/reliability/faults.py): each fault kind x trials x survived;
- hostile inputs (``HOSTILE_FILES``, run by pytest): each input group x cases x handled,
  read back from pytest's JUnit XML;
- scale (harness/reliability/scale.py): convert 10k/50k/200k images, stage-to-node on 8
  nodes x 4 local ranks, loaders on 4 ranks x 2 workers over 2,000 shards, with their bounds.

Exit status: 0 when every trial held and every bounded figure is within its bound, 1 if not,
2 on a usage error. ``--markdown`` prints the tables in the form the README's Guarantees
section quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import REPO
from harness.reliability import Figure, Trial, scale, tally
from harness.reliability import faults as fault_kinds

HOSTILE_FILES = ("tests/convert/test_hostile.py", "tests/inputs/test_fuzz.py",
                 "tests/convert/test_damage.py", "tests/convert/test_jpegcrop.py",
                 "tests/loaders/test_bombs.py")
FUZZ = "fuzzed ground truth and manifests (hypothesis)"
DAMAGE = "damaged JPEGs and JPEGs with libjpeg warnings"
EXTENSION = "the C extension's arguments and libjpeg's errors"
LOADER = "pixel bombs and half-written JPEGs in the loaders"
HOSTILE_GROUPS = {  # test function -> the input group it covers
    "test_hostile_image": "images",
    "test_hostile_archive": "archives",
    "test_hostile_labels": "ground-truth files",
    "test_hostile_manifest": "manifests",
    "test_hostile_label_list": "label lists",
    "test_hostile_staging": "staging destinations",
    "test_ground_truth_parsers": FUZZ,
    "test_manifest_reader": FUZZ,
    "test_the_good_manifest_parses": FUZZ,
    "test_unreadable_manifests_name_the_file": FUZZ,
    **{f"test_{name}": DAMAGE for name in (
        "a_damaged_jpeg_is_an_error_naming_the_damage",
        "a_jpeg_that_decodes_whole_with_warnings_converts_with_them",
        "what_is_whole_and_plain_converts_without_a_warning",
        "without_the_extension_the_end_of_image_marker_is_still_checked",
        "a_half_written_jpeg_fails_the_run_and_is_logged_with_its_reason",
        "warned_images_convert_and_the_summary_counts_the_warnings_log")},
    **{f"test_{name}": EXTENSION for name in (
        "pack_refuses_a_box_whose_left_edge_is_minus_one",
        "pack_checks_every_argument_in_signed_arithmetic",
        "decode_checks_its_region_before_libjpeg_runs",
        "the_whole_file_check_holds_its_memory_whatever_a_header_claims",
        "an_error_while_the_decompressor_is_made_lands_in_the_handler",
        "the_development_build_treats_every_warning_as_an_error")},
    **{f"test_{name}": LOADER for name in (
        "a_header_claiming_65000_by_65000_is_refused_before_any_frame",
        "the_limit_is_the_one_the_user_gives_pillow",
        "a_half_written_jpeg_is_a_bad_sample_on_both_paths",
        "the_loader_skips_or_names_them_as_any_bad_sample")},
}
SCALE_FULL: dict[str, dict[str, Any]] = {"convert": {}, "stage": {}, "loaders": {}}
SCALE_QUICK: dict[str, dict[str, Any]] = {
    "convert": {"sizes": (2_500, 10_000)},
    "stage": {"shards": 16},
    "loaders": {"shards": 200},
}
SCALE_RUNS: dict[str, Callable[..., tuple[list[Figure], list[Trial]]]] = {
    "convert": scale.convert_scale, "stage": scale.stage_scale, "loaders": scale.loader_scale}
PARTS = (*fault_kinds.FAULTS, "hostile", *(f"scale-{k}" for k in SCALE_RUNS))


def hostile(work: Path) -> list[Trial]:
    """Run the hostile-input and fuzzing tests; one Trial per test case (ok: passed)."""
    xml = work / "hostile.xml"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={xml}", *HOSTILE_FILES], cwd=REPO, env=env,
                   capture_output=True, text=True, timeout=1800)
    if not xml.exists():
        return [Trial("hostile", "pytest run", False, f"no report written to {xml}")]
    out = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name", "")
        func, _, param = name.partition("[")
        bad = [c for c in case if c.tag in ("failure", "error")]
        skipped = [c for c in case if c.tag == "skipped"]
        detail = (bad[0].get("message", "") if bad else
                  f"skipped: {skipped[0].get('message', '')}" if skipped else "handled")
        group = HOSTILE_GROUPS.get(func, func)
        out.append(Trial(group, name if group == FUZZ else param.rstrip("]") or func,
                         not bad and not skipped, detail[:300]))
    return out


Results = tuple[list[Trial], list[Trial], list[Trial], list[Figure], dict[str, float]]


def run(parts: Sequence[str], work: Path, trials: int, quick: bool) -> Results:
    """Run ``parts``; returns (fault trials, hostile cases, scale trials, figures, seconds)."""
    fault_out: list[Trial] = []
    hostile_out: list[Trial] = []
    scale_out: list[Trial] = []
    figures: list[Figure] = []
    seconds: dict[str, float] = {}
    sizes = SCALE_QUICK if quick else SCALE_FULL
    for part in parts:
        t0 = time.monotonic()
        sub = work / part
        sub.mkdir(parents=True, exist_ok=True)
        if part in fault_kinds.FAULTS:
            if quick and part != "convert":  # made first, so the kinds stage this smaller set
                fault_kinds.shard_source(sub, per_class=fault_kinds.REDUCED_PER_CLASS)
            fault_out += fault_kinds.FAULTS[part](sub, trials, 0)
        elif part == "hostile":
            hostile_out += hostile(sub)
        else:
            key = part.removeprefix("scale-")
            figs, tr = SCALE_RUNS[key](sub, **sizes[key])
            figures += figs
            scale_out += tr
        seconds[part] = round(time.monotonic() - t0, 1)
        print(f"reliability: {part} done in {seconds[part]:.0f} s", file=sys.stderr)
    return fault_out, hostile_out, scale_out, figures, seconds


def _table(rows: list[list[str]], head: list[str], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True))
                     for r in [head, *rows])


def _value(f: Figure) -> str:
    return f"{f.value:,.3g}" if abs(f.value) < 100 else f"{f.value:,.0f}"


def report(faults: list[Trial], hostile_cases: list[Trial], scale_trials: list[Trial],
           figures: list[Figure], markdown: bool) -> str:
    """The three tables (and every failed trial's detail) as text."""
    parts = []
    if faults:
        parts.append(_table([[g, k, str(n), str(ok)] for g, k, n, ok in tally(faults)],
                            ["part", "fault", "trials", "survived"], markdown))
    if hostile_cases:
        groups: dict[str, list[int]] = {}
        for t in hostile_cases:
            row = groups.setdefault(t.group, [0, 0])
            row[0] += 1
            row[1] += t.ok
        parts.append(_table([[g, str(n), str(ok)] for g, (n, ok) in groups.items()],
                            ["hostile input", "cases", "handled"], markdown))
    if figures or scale_trials:
        parts.append(_table(
            [[f.group, f.name, _value(f), f.unit, f.bound,
              "" if f.ok is None else ("ok" if f.ok else "OUT")] for f in figures],
            ["scale", "figure", "value", "unit", "bound", ""], markdown))
        parts.append(_table([[t.kind, "held" if t.ok else "BROKEN", t.detail[:150]]
                             for t in scale_trials], ["scale invariant", "", "detail"],
                            markdown))
    failed = [t for t in faults + hostile_cases + scale_trials if not t.ok]
    if failed:
        parts.append("failed:\n" + "\n".join(f"  {t.group}: {t.kind}: {t.detail}"
                                              for t in failed))
    return "\n\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="the reduced form: 1 trial per fault (the stage, loader and "
                         "trainer kinds on a smaller set), small scale runs")
    ap.add_argument("--trials", type=int, default=None,
                    help="trials per fault kind (convert: per set-up); default 20, 1 if --quick")
    ap.add_argument("--only", default=",".join(PARTS),
                    help=f"comma-separated parts to run, of: {', '.join(PARTS)}")
    ap.add_argument("--work", type=Path, default=None,
                    help="scratch folder (default: a temporary one, removed afterwards)")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = ap.parse_args(argv)
    parts = [p for p in args.only.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown parts {unknown}; choose from {', '.join(PARTS)}")
    trials = args.trials or (1 if args.quick else 20)
    with tempfile.TemporaryDirectory(prefix="reliability-", dir=args.work) as tmp:
        faults, hostile_cases, scale_trials, figures, seconds = run(
            parts, Path(tmp), trials, args.quick)
    print(report(faults, hostile_cases, scale_trials, figures, args.markdown))
    everything = faults + hostile_cases + scale_trials
    ok = all(t.ok for t in everything) and all(f.ok is not False for f in figures)
    print(json.dumps({
        "ok": ok, "quick": args.quick, "trials": trials, "seconds": seconds,
        "faults": [{"part": g, "fault": k, "trials": n, "survived": s}
                   for g, k, n, s in tally(faults)],
        "fault_trials": [t.as_dict() for t in faults],
        "hostile": [t.as_dict() for t in hostile_cases],
        "scale": {"figures": [f.as_dict() for f in figures],
                  "invariants": [t.as_dict() for t in scale_trials]},
    }, sort_keys=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
