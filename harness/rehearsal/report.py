"""The rehearsal's table, its projection to a 16-core node and to 16 such nodes, and the
comparison of two runs' per-image costs (the 1.3x rule).

Projection, per step, from this run's per-image costs; ``ASSUMPTIONS`` (printed under the
table) says what each column takes for granted. *Full size here* is linear in the image
count, which ``--compare`` against a smaller run checks; the trainer's steps of a tiny net on
this CPU say nothing about a GPU node and are not projected.
"""

from __future__ import annotations

from typing import Any

from harness.rehearsal.dataset import FULL_TRAIN, FULL_VAL

CORES, NODES = 16, 16
STAGED_HERE = 4  # process-nodes the staging steps ran here
RULE = 1.3
FULL_SET = FULL_TRAIN + FULL_VAL
FULL_IMAGES = {"convert train": FULL_TRAIN, "convert val": FULL_VAL, "verify": FULL_SET,
               "index": FULL_SET, "stage fan-out 4 nodes": FULL_SET,
               "stage partition 4 nodes": FULL_TRAIN, "loader plan 16x8 ranks": FULL_TRAIN,
               "loader epoch slice": FULL_TRAIN}
PARALLEL = ("convert train", "convert val", "verify", "loader epoch slice")
ASSUMPTIONS = (
    "full size here: the wall time per image measured here x the step's image count at full "
    "size (1,281,167 train, 50,000 val; the partition staging and the loader train only)",
    "16-core node: convert, verify and the loader epoch keep all 16 cores busy at the CPU "
    "time per image measured here (workers = cores, as their auto default gives; no other "
    "load); index and the plan are one process on one core, busy for the CPU time per image "
    "measured here x the full count; the node stages the whole set to its disk at the rate "
    "this machine's one disk took the 4 process-nodes' writes together",
    "16 nodes x 16 cores: convert under a launcher splits the shards over the ranks (/16; "
    "the listing every rank repeats is left out) and so does the loader epoch (/16); verify "
    "and index run on one node; the plan's time is one rank's, each rank planning its own "
    "epoch; fan-out writes the whole set on every node at that disk rate (the ring's "
    "network keeping up), partition a 16th of it",
    "the trainer (a few steps of a tiny net on this CPU) is not projected",
)


def full_seconds(step: dict[str, Any]) -> float | None:
    n = FULL_IMAGES.get(step["step"])
    if n is None:
        return None
    return float(step["us_per_image"]) * 1e-6 * n


def project(step: dict[str, Any]) -> tuple[float | None, float | None]:
    """(16-core node, 16 nodes) seconds for ``step`` at full size, or None (not projected)."""
    name, full = step["step"], full_seconds(step)
    if full is None:
        return None, None
    if name in PARALLEL:
        node = float(step["cpu_us_per_image"]) * 1e-6 * FULL_IMAGES[name] / CORES
        shared = name in ("convert train", "convert val", "loader epoch slice")
        return node, node / NODES if shared else node
    if name.startswith("stage fan-out"):  # here 4 nodes wrote the set 4 times at once
        return full / STAGED_HERE, full / STAGED_HERE
    if name.startswith("stage partition"):  # here the nodes wrote the set once together
        return full, full / NODES
    one = float(step["cpu_us_per_image"]) * 1e-6 * FULL_IMAGES[name]  # one busy core
    return one, one  # one process (index), or each rank's own plan


def _secs(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def table(record: dict[str, Any]) -> str:
    """The Markdown table of the steps, then the projection with its assumptions."""
    rows = ["| step | images | time s | images/s | µs/image | CPU µs/image | cores busy | "
            "peak RSS MB (tree) | peak fds (tree) | disk after MB | check |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for s in record["steps"]:
        rows.append(f"| {s['step']} | {s['images']:,} | {_secs(s['seconds'])} | {s['rate']:,.0f} | "
                    f"{s['us_per_image']:.1f} | {s['cpu_us_per_image']:.1f} | "
                    f"{s['cores_busy']:.2f} | {s['peak_rss_mb']:.0f} | {s['peak_fds']} | "
                    f"{s.get('disk_bytes', 0) / 1e6:.0f} | {'ok' if s['ok'] else 'FAILED'} |")
    rows += ["", "| step | full size on this machine, s | 16-core node, s | "
             "16 nodes x 16 cores, s |", "|---|---:|---:|---:|"]
    for s in record["steps"]:
        cells = [full_seconds(s), *project(s)]
        rows.append(f"| {s['step']} | " + " | ".join(
            "n/a" if x is None else _secs(x) for x in cells) + " |")
    rows += ["", *[f"- {a}" for a in ASSUMPTIONS]]
    return "\n".join(rows)


def compare(this: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Per step, this run's per-image cost over ``other``'s (wall and CPU); a step is flagged
    when the run with more images pays more than 1.3x the other's wall cost per image
    (``flagged``), and, steadier on a shared machine, CPU cost per image (``cpu_flagged``)."""
    theirs = {s["step"]: s for s in other.get("steps", [])}
    bigger = this["images"] >= other.get("images", 0)
    steps = []
    for s in this["steps"]:
        o = theirs.get(s["step"])
        if o is None or not o["us_per_image"] or not o["cpu_us_per_image"]:
            continue
        wall = s["us_per_image"] / o["us_per_image"]
        cpu = s["cpu_us_per_image"] / o["cpu_us_per_image"]
        steps.append({"step": s["step"], "this_us": s["us_per_image"],
                      "other_us": o["us_per_image"], "wall_ratio": wall, "cpu_ratio": cpu,
                      "flagged": (wall if bigger else 1 / wall) > RULE,
                      "cpu_flagged": (cpu if bigger else 1 / cpu) > RULE})
    return {"this_images": this["images"], "other_images": other.get("images"),
            "rule": f"the larger run's wall cost per image > {RULE}x the smaller's",
            "steps": steps, "flagged": [c["step"] for c in steps if c["flagged"]],
            "cpu_flagged": [c["step"] for c in steps if c["cpu_flagged"]]}


def _flag(c: dict[str, Any]) -> str:
    return " ".join(w for w, on in (("wall > 1.3x", c["flagged"]),
                                    ("CPU > 1.3x", c["cpu_flagged"])) if on)


def compare_table(c: dict[str, Any]) -> str:
    rows = [f"per-image cost, {c['this_images']:,} images (this run) against "
            f"{c['other_images']:,} images; flagged: {c['rule']}", "",
            "| step | this µs/image | other µs/image | wall ratio | CPU ratio | flag |",
            "|---|---:|---:|---:|---:|---|"]
    rows += [f"| {s['step']} | {s['this_us']:.1f} | {s['other_us']:.1f} | "
             f"{s['wall_ratio']:.2f} | {s['cpu_ratio']:.2f} | "
             f"{_flag(s)} |" for s in c["steps"]]
    return "\n".join(rows)
