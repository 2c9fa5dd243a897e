"""The sizes each form of the kit runs at: the full GPU run (the acceptance figures), a quick
GPU run (a look at the CUDA paths in about a minute), and the CPU forms (a small model, few
steps, Gloo: what ``make test`` runs, so that the kit cannot rot).

The full GPU run trains ResNet-50 at 224 px, batch 256 (the trainer's defaults on CUDA are
bf16 autocast and channels_last), on a synthetic input of 32,000 ImageNet-sized JPEGs; the
nvjpeg check trains ResNet-50 and ResNet-18 the same way (the CPU forms: the tiny model).
The trainer check also runs fed and synthetic at each of ``res_sizes`` (160 and 224 px: a
resolution schedule's ends), eager and with ``--compile``. The quick CPU form, which ``make
test`` runs to keep those rows from rotting, does so at its own 64 px alone, where its first
(eager) pair stands for the eager one: one size eager, one compiled (each compile of a size
costs about a minute of CPU there before an inductor cache holds it), the rest of the kit
unchanged; each of its children has 480 s, more than twice the 133-205 s that compile's run
took on 2 cores with two CPU-bound processes beside it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Profile:
    """How big each check runs."""

    name: str
    images: int  # train images of the synthetic input (convert's input, the trainer's data)
    pool: int  # distinct JPEGs the input cycles
    arch: str  # the trainer's model, image size, batch and steps
    image_size: int
    batch: int
    steps: int
    log_every: int  # the first interval (start-up) is left out of every rate
    nccl_arch: str  # the NCCL/Gloo pair: a few steps
    nccl_batch: int
    nccl_steps: int
    loader_batch: int
    one_worker_batches: int  # timed batches of a one-worker loader
    many_batches: int  # timed batches of the loaders at their default worker count
    floor_images: int  # convert's one-process floor loop
    rounds: int  # interleaved rounds of the loader, device-loader and convert measures
    timeout_s: float  # for each child process
    nvjpeg_archs: tuple[str, ...] = ("resnet50", "resnet18")  # the nvjpeg check's trainers
    res_sizes: tuple[int, ...] = (160, 224)  # the trainer's rows by size, eager and compiled
    # the feed checks' trainer runs: steps (the first log interval the warm-up), size and
    # --compile
    feed_steps: int = 250
    feed_log_every: int = 50
    feed_size: int = 160
    feed_compile: str = "on"

    def __post_init__(self) -> None:
        small = min(self.images, self.pool, self.batch, self.steps, self.log_every,
                    self.nccl_batch, self.nccl_steps, self.loader_batch,
                    self.one_worker_batches, self.many_batches, self.floor_images,
                    self.rounds)
        if small < 1 or self.steps < 2 * self.log_every \
                or self.feed_steps < 2 * self.feed_log_every:
            raise ValueError(f"{self.name}: every size must be >= 1 and steps at least two "
                             "log intervals (the first one is left out)")


PROFILES = {
    "cuda": Profile(name="cuda", images=32_000, pool=128, arch="resnet50", image_size=224,
                    batch=256, steps=120, log_every=30, nccl_arch="resnet50", nccl_batch=64,
                    nccl_steps=6, loader_batch=256, one_worker_batches=8, many_batches=100,
                    floor_images=512, rounds=3, timeout_s=480),
    "cuda-quick": Profile(name="cuda-quick", images=4096, pool=32, arch="resnet50",
                          image_size=224, batch=128, steps=24, log_every=8,
                          nccl_arch="resnet50", nccl_batch=32, nccl_steps=4, loader_batch=128,
                          one_worker_batches=4, many_batches=24, floor_images=128, rounds=1,
                          timeout_s=300, feed_steps=60, feed_log_every=20),
    "cpu": Profile(name="cpu", images=2048, pool=32, arch="tiny", image_size=64, batch=32,
                   steps=40, log_every=10, nccl_arch="tiny", nccl_batch=16, nccl_steps=6,
                   loader_batch=32, one_worker_batches=10, many_batches=40, floor_images=256,
                   rounds=3, timeout_s=300, nvjpeg_archs=("tiny",), feed_steps=40,
                   feed_log_every=10, feed_size=64, feed_compile="off"),
    "cpu-quick": Profile(name="cpu-quick", images=192, pool=12, arch="tiny", image_size=64,
                         batch=16, steps=6, log_every=2, nccl_arch="tiny", nccl_batch=8,
                         nccl_steps=3, loader_batch=16, one_worker_batches=3, many_batches=6,
                         floor_images=24, rounds=1, timeout_s=480, nvjpeg_archs=("tiny",),
                         res_sizes=(64,), feed_steps=6, feed_log_every=2, feed_size=64,
                         feed_compile="off"),
}


def profile_for(device: str, quick: bool) -> Profile:
    """The profile of a run on ``device`` ("cuda" or "cpu")."""
    return PROFILES[device + ("-quick" if quick else "")]
