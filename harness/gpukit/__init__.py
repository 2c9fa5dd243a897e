"""The GPU acceptance kit: one command that proves the CUDA paths on the first GPU machine it
meets, and runs its CPU form everywhere else so that it cannot rot.

    PYTHONPATH=. python scripts/gpu_check.py --out gpu-out            # a GPU machine
    PYTHONPATH=. python scripts/gpu_check.py --device cpu --quick      # the CPU form (tests)

``scripts/gpu_check.py`` only launches ``python -m harness.gpukit.run``. Modules, one a
concern: ``run`` (options, the order of the checks, exit code), ``machine`` (what the machine
has, and which checks it cannot run), ``profile`` (the sizes each form runs at), ``record``
(rows, verdicts, the JSON record and the markdown table), ``data`` (the synthetic
ILSVRC-shaped input and its conversion), ``timing`` (batches per second), and one module a
check: ``trainer``, ``nccl``, ``deviceloader``, ``loader``, ``convert``, ``dali``,
``nvjpeg`` (with ``nvjpeg_trainer``); and the nvJPEG spike (``nvjpeg_spike``, run alone: ``python -m
harness.gpukit.nvjpeg_spike --out DIR``), which times the GPU decode's stages apart.

Like every harness room it imports the library through its public API and the white-box list
(docs/development.md), ``bench`` (``bench.common``'s ratio and verdict, ``bench.convert``'s
floor and conversion timing) and ``harness.checks``, never another room; the trainer runs as
a child process, as users launch it. It imports nothing a GPU machine without network lacks
(docs/gpu_check.md: torch, numpy, Pillow, click, tqdm); DALI only inside its own check,
torchvision only inside the nvjpeg backend on a GPU.
"""
