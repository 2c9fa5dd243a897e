"""Run ``imgprep ARGS`` in this process and print, last on stderr, the kernel's count of bytes
read (rchar) during the run: ``python -m bench.rchar stage-to-node ...`` from the repository
root. Everything the command imports is imported before the first look, so the count is the
command's own reads. The staging benchmark and the fan-out tests run stage-to-node through
it."""

from __future__ import annotations

import atexit
import sys

import torch.distributed  # noqa: F401  (imported before the first look, as the command would)

from bench.common import rchar
from imgprep import stage_to_node  # noqa: F401  (the staging modules, likewise)
from imgprep.cli.commands import main


def run() -> None:
    start = rchar()
    atexit.register(lambda: print(f"rchar {rchar() - start}", file=sys.stderr, flush=True))
    sys.argv = ["imgprep", *sys.argv[1:]]
    main()


if __name__ == "__main__":
    run()
