"""Train a ResNet data-parallel on imgprep shards, and show where each iteration's time goes.

Launch it any of these ways (the same flags everywhere):

    python scripts/train_imagenet.py --data DIR --arch tiny --steps 200         # one process
    torchrun --nproc-per-node 2 scripts/train_imagenet.py --data DIR ...         # torchrun
    mpirun -np 2 python scripts/train_imagenet.py --data DIR ...                 # Open MPI
    srun -N 2 --ntasks-per-node 4 python scripts/train_imagenet.py --data DIR ...

NCCL with CUDA (one GPU per local rank), Gloo on CPU; under mpirun rank 0's address and a
free port go out over mpi4py. Every ``--log-every`` steps rank 0 prints images/s (global and
per rank) and the iteration's time split — data wait, forward+backward, exposed all-reduce,
optimizer — as the mean and max over ranks, and appends a JSON line to ``--log-json``.
Every split is normalised with the training split's mean and std (``--normalize train``, the
default) or constants you choose (``imagenet``, or ``R,G,B/R,G,B``), never a split's own.
Checkpoints are written atomically by rank 0 and carry the run's config; ``--resume`` restores
model, optimizer, step, loader position and RNG, so a resumed CPU run gives the same losses as
an uninterrupted one, and refuses a checkpoint of another model, data or optimisation.
``--bf16 auto`` (the default) runs forward and backward under bf16 autocast only where the
device computes bf16 natively; the first line says which precision runs, and why.
``--loader-backend dali`` decodes with NVIDIA DALI (``pip install 'imgprep[dali]'``),
``--loader-backend nvjpeg`` with torchvision's nvJPEG and ``nvimgcodec`` with the GPU's
hardware JPEG decoders, instead of the pillow backend's worker processes: the same samples in
every batch, decoded on the GPU when training on CUDA, in CPU threads otherwise
(``--workers`` of them); the second line says which.
``--res-schedule 160:192@11-13`` trains each epoch at its size (FFCV's ramp; or a table,
``0=128,10=160``), made by the loader itself and recorded in checkpoints; ``--val-size`` and
``--val-crop-ratio`` set validation's crop. ``--compile auto`` (the default) runs
torch.compile on CUDA, eager on the CPU, static shapes with one graph per size; the third line
says which. The fourth says where the loader runs: on CUDA with ``--workers auto`` the
training process keeps a core of its share and the workers are pinned to the rest, at nice 10
(``--pin-cpus``, ``--worker-nice``); ``--worker-sizing demand`` keeps as many workers active
as the step's demand needs.
``--recipe torchvision-v2`` (or ``ffcv-rn50``, ``rsb-a3``) sets every option of a published
ImageNet recipe, flags given winning over it, and prints a table of them beside the source's
values after those four lines: ``--auto-augment``, ``--random-erase``, ``--mixup`` /
``--cutmix`` (soft targets), ``--ra-reps``, ``--model-ema`` (validated and checkpointed
beside the model), ``--norm-weight-decay``, ``--bce``, ``--opt lamb`` and the rest, each also
a flag of its own (docs/trainer.md).

The trainer reads top to bottom in ``trainkit/train.py`` (set-up, the loop, evaluation,
checkpoint); this file is what you launch.
"""

import sys

from trainkit.train import main

if __name__ == "__main__":
    sys.exit(main())
