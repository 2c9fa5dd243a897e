"""One image decoded in a process of its own, as convert or a loader worker decodes it, and
what that cost: ``python -m tests.support.bounds_child FILE convert|loader-train|loader-val``
prints a JSON line {"outcome", "cpu_s", "rss_mb"}: the outcome ("ok" or the error), the CPU
time of the decode alone (getrusage), and the peak resident memory above the process's own
once everything is imported and a small image decoded (Linux's peak, VmHWM, reset there
through /proc/self/clear_refs)."""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import numpy as np

from imgprep.convert.image import convert_image
from imgprep.errors import ImageError
from imgprep.sections import TransformOptions
from loaders.decode import SampleDecoder
from loaders.transforms import SampleError, TrainTransform, ValTransform
from tests.support import jpeg


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def decode(data: bytes, mode: str) -> str:
    if mode == "convert":
        try:
            convert_image(data, TransformOptions())
        except ImageError as e:
            return str(e)
        return "ok"
    t = TrainTransform(size=224) if mode == "loader-train" else ValTransform(size=224)
    out = np.zeros((3, 224, 224), np.uint8)
    try:
        SampleDecoder(t, fast=None)(data, np.random.default_rng(0), out, "s")
    except SampleError as e:
        return str(e)
    return "ok"


def status_kb(field: str) -> int:
    """A ``/proc/self/status`` field (VmRSS, VmHWM) in kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def main(path: str, mode: str) -> None:
    data = Path(path).read_bytes()
    decode(jpeg((500, 375), seed=1), mode)  # the scratch a usual image takes, warmed
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
    base = status_kb("VmRSS")
    start = cpu()
    outcome = decode(data, mode)
    spent = cpu() - start
    peak = status_kb("VmHWM")
    print(json.dumps({"outcome": outcome, "cpu_s": spent, "rss_mb": (peak - base) / 1024}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
