"""One rank of an example run under a test: ``python -m tests.frameworks.child EXAMPLE OUT
HOLD -- ARGS``.

Runs ``examples/<EXAMPLE>.py``'s ``main(ARGS)`` with a recorder that appends one JSON line a
batch to ``OUT/rank<r>.jsonl``: the epoch, the steps of it done (this batch included), the
epoch's length as the framework counts it, the batch's labels (a sample's label is its id in
the tests' data) and a sha256 of its pixels. With ``HOLD`` = ``E:S`` the rank writes
``OUT/held<r>`` (its pid) after step S of epoch E is recorded and then sleeps, for the test
to SIGKILL it there; ``-`` never holds. It imports nothing of the tests' support (each rank
would pay for its imports), only what the example does.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]


def digest(images: torch.Tensor, labels: torch.Tensor) -> str:
    """A batch's pixels and labels, whatever their memory layout."""
    h = hashlib.sha256(images.detach().cpu().contiguous().numpy().tobytes())
    h.update(labels.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class Recorder:
    def __init__(self, out: Path, hold: tuple[int, int] | None) -> None:
        self.out, self.hold = out, hold

    def __call__(self, epoch: int, step: int, images: torch.Tensor, labels: torch.Tensor,
                 length: int) -> None:
        r = rank()
        line = {"epoch": epoch, "step": step, "len": length, "labels": labels.tolist(),
                "digest": digest(images, labels)}
        with open(self.out / f"rank{r}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        if (epoch, step) == self.hold:
            (self.out / f"held{r}").write_text(str(os.getpid()))
            time.sleep(3600)  # the test kills this process here


    def validated(self, epoch: int, labels: torch.Tensor) -> None:
        """A val batch's labels, to ``OUT/val<r>.jsonl``."""
        with open(self.out / f"val{rank()}.jsonl", "a") as f:
            f.write(json.dumps({"epoch": epoch, "labels": labels.tolist()}) + "\n")


def rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def lightning_callback(record: Recorder) -> Any:
    from pytorch_lightning.callbacks import Callback

    class Record(Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            record(trainer.current_epoch, batch_idx + 1, batch[0], batch[1],
                   int(trainer.num_training_batches))

        def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any,
                                    batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            record.validated(trainer.current_epoch, batch[1])

    return Record()


def main(argv: list[str]) -> None:
    example, out, hold, sep, *args = argv
    if sep != "--":
        raise SystemExit("usage: python -m tests.frameworks.child EXAMPLE OUT HOLD -- ARGS")
    epoch, _, step = hold.partition(":")
    record = Recorder(Path(out), None if hold == "-" else (int(epoch), int(step)))
    sys.path.insert(0, str(REPO / "examples"))
    module = importlib.import_module(example)
    if example == "lightning_train":
        module.main(args, callbacks=[lightning_callback(record)])
    else:
        module.main(args, on_batch=record)


if __name__ == "__main__":
    main(sys.argv[1:])
