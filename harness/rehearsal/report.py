"""The rehearsal's table, its projection to a 16-core node and to 16 such nodes, and the
comparison of two runs' per-image costs (the 1.3x rule).

Projection, per step, from this run's per-image costs; ``ASSUMPTIONS`` (printed under the
table) says what each column takes for granted. *Full size here* is linear in the image
count, which ``--compare`` against a smaller run checks; the trainer's steps of a tiny net on
this CPU say nothing about a GPU node and are not projected. The image counts are a
parameter (``full_images``): ILSVRC2012's by default, ImageNet-21k's (13,153,500, val held
out of them) for a record of that shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.rehearsal import in21k
from harness.rehearsal.dataset import FULL_TRAIN, FULL_VAL

CORES, NODES = 16, 16
STAGED_HERE = 4  # process-nodes the staging steps ran here
RULE = 1.3
FULL_SET = FULL_TRAIN + FULL_VAL
FULL_IMAGES = {"convert train": FULL_TRAIN, "convert val": FULL_VAL, "verify": FULL_SET,
               "index": FULL_SET, "stage fan-out 4 nodes": FULL_SET,
               "stage partition 4 nodes": FULL_TRAIN, "loader plan 16x8 ranks": FULL_TRAIN,
               "loader epoch slice": FULL_TRAIN}
PARALLEL = ("convert train", "convert val", in21k.CONVERT_STEP, "verify", "index",
            "loader epoch slice")
SHARED = ("convert train", "convert val", in21k.CONVERT_STEP, "loader epoch slice")  # /16 nodes
COUNTERPARTS = {in21k.CONVERT_STEP: "convert train", "convert train": in21k.CONVERT_STEP}
FULL_SIZE = ("full size here: the wall time per image measured here x the step's image count "
             "at full size ({counts}; the partition staging and the loader train only)")
SIXTEEN_NODES = (
    "16 nodes x 16 cores: convert under a launcher splits the shards over the ranks (/16; "
    "the {repeated} every rank repeats is left out) and so does the loader epoch (/16); verify "
    "and index run on one node; the plan's time is one rank's, each rank planning its own "
    "epoch; fan-out writes the whole set on every node at that disk rate (the ring's "
    "network keeping up), partition a 16th of it")
ASSUMPTIONS = (
    FULL_SIZE.format(counts="1,281,167 train, 50,000 val"),
    "16-core node: convert, verify, index and the loader epoch keep all 16 cores busy at the "
    "CPU time per image measured here (workers = cores, as their auto default gives; no "
    "other load); the plan is one process on one core, busy for the CPU time per image "
    "measured here x the full count; the node stages the whole set to its disk at the rate "
    "this machine's one disk took the 4 process-nodes' writes together",
    SIXTEEN_NODES.format(repeated="listing"),
    "the trainer (a few steps of a tiny net on this CPU) is not projected",
)


def in21k_full_images() -> dict[str, int]:
    """Each step's image count at ImageNet-21k's full size: the archive's 13,153,500, of
    which the train split keeps all but the held-out ones."""
    total = in21k.FULL_IMAGES
    train = total - in21k.held_out(in21k.full_counts())
    return {in21k.CONVERT_STEP: total, "verify": total, "index": total,
            "stage fan-out 4 nodes": total, "stage partition 4 nodes": train,
            "loader plan 16x8 ranks": train, "loader epoch slice": train}


def full_images(record: Mapping[str, Any]) -> dict[str, int]:
    """Each step's image count at the full size of ``record``'s shape."""
    return in21k_full_images() if record.get("shape") == in21k.SHAPE else FULL_IMAGES


def assumptions(record: Mapping[str, Any]) -> tuple[str, ...]:
    """What the projection of ``record`` takes for granted (its shape's counts)."""
    if record.get("shape") != in21k.SHAPE:
        return ASSUMPTIONS
    full = in21k_full_images()
    total, train = full[in21k.CONVERT_STEP], full["loader plan 16x8 ranks"]
    counts = (f"{total:,} in the archive: {train:,} train, {total - train:,} held out as val "
              f"by --holdout-per-class {in21k.HOLDOUT}")
    return (FULL_SIZE.format(counts=counts), ASSUMPTIONS[1],
            SIXTEEN_NODES.format(repeated="listing and holdout"), ASSUMPTIONS[3])


def full_seconds(step: dict[str, Any], full: Mapping[str, int] = FULL_IMAGES) -> float | None:
    n = full.get(step["step"])
    if n is None:
        return None
    return float(step["us_per_image"]) * 1e-6 * n


def project(step: dict[str, Any], full: Mapping[str, int] = FULL_IMAGES
            ) -> tuple[float | None, float | None]:
    """(16-core node, 16 nodes) seconds for ``step`` at full size (``full``: each step's
    image count there), or None (not projected)."""
    name, whole = step["step"], full_seconds(step, full)
    if whole is None:
        return None, None
    if name in PARALLEL:
        node = float(step["cpu_us_per_image"]) * 1e-6 * full[name] / CORES
        return node, node / NODES if name in SHARED else node
    if name.startswith("stage fan-out"):  # here 4 nodes wrote the set 4 times at once
        return whole / STAGED_HERE, whole / STAGED_HERE
    if name.startswith("stage partition"):  # here the nodes wrote the set once together
        return whole, whole / NODES
    one = float(step["cpu_us_per_image"]) * 1e-6 * full[name]  # one busy core
    return one, one  # each rank's own plan


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
    full = full_images(record)
    for s in record["steps"]:
        cells = [full_seconds(s, full), *project(s, full)]
        rows.append(f"| {s['step']} | " + " | ".join(
            "n/a" if x is None else _secs(x) for x in cells) + " |")
    rows += ["", *[f"- {a}" for a in assumptions(record)]]
    return "\n".join(rows)


def compare(this: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Per step, this run's per-image cost over ``other``'s (wall and CPU); a step is flagged
    when the run with more images pays more than 1.3x the other's wall cost per image
    (``flagged``), and, steadier on a shared machine, CPU cost per image (``cpu_flagged``).
    Records of two shapes compare too: a step absent from ``other`` is set against its
    counterpart there (the in21k shape's one convert against ILSVRC's ``convert train``), and
    at equal image counts ``this`` counts as the larger run."""
    theirs = {s["step"]: s for s in other.get("steps", [])}
    bigger = this["images"] >= other.get("images", 0)
    steps = []
    for s in this["steps"]:
        o = theirs.get(s["step"]) or theirs.get(COUNTERPARTS.get(s["step"], ""))
        if o is None or not o["us_per_image"] or not o["cpu_us_per_image"]:
            continue
        wall = s["us_per_image"] / o["us_per_image"]
        cpu = s["cpu_us_per_image"] / o["cpu_us_per_image"]
        pair = {} if o["step"] == s["step"] else {"other_step": o["step"]}
        steps.append({"step": s["step"], **pair, "this_us": s["us_per_image"],
                      "other_us": o["us_per_image"], "wall_ratio": wall, "cpu_ratio": cpu,
                      "flagged": (wall if bigger else 1 / wall) > RULE,
                      "cpu_flagged": (cpu if bigger else 1 / cpu) > RULE})
    shapes = {"this_shape": this.get("shape", "ilsvrc"),
              "other_shape": other.get("shape", "ilsvrc")}
    return {"this_images": this["images"], "other_images": other.get("images"),
            **(shapes if "shape" in this or "shape" in other else {}),
            "rule": f"the larger run's wall cost per image > {RULE}x the smaller's",
            "steps": steps, "flagged": [c["step"] for c in steps if c["flagged"]],
            "cpu_flagged": [c["step"] for c in steps if c["cpu_flagged"]]}


def _flag(c: dict[str, Any]) -> str:
    return " ".join(w for w, on in (("wall > 1.3x", c["flagged"]),
                                    ("CPU > 1.3x", c["cpu_flagged"])) if on)


def compare_table(c: dict[str, Any]) -> str:
    this, other = (f" ({c[k]} shape)" if k in c else "" for k in ("this_shape", "other_shape"))
    rows = [f"per-image cost, {c['this_images']:,} images{this} (this run) against "
            f"{c['other_images']:,} images{other}; flagged: {c['rule']}", "",
            "| step | this µs/image | other µs/image | wall ratio | CPU ratio | flag |",
            "|---|---:|---:|---:|---:|---|"]
    rows += [f"| {s['step']}{' / ' + s['other_step'] if 'other_step' in s else ''} | "
             f"{s['this_us']:.1f} | {s['other_us']:.1f} | "
             f"{s['wall_ratio']:.2f} | {s['cpu_ratio']:.2f} | "
             f"{_flag(s)} |" for s in c["steps"]]
    return "\n".join(rows)
