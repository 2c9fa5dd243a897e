"""Harnesses that hold the product to its promises at scale and under faults; not part of the
installed packages. Each room runs as a module from the repository root:

- ``cluster``: a file server and N nodes in network namespaces on one machine, and a real
  Slurm on them (``python -m harness.cluster.bench``; root);
- ``reliability``: fault injection, hostile inputs and scale runs
  (``python -m harness.reliability.report``);
- ``rehearsal``: the whole pipeline at ILSVRC2012's real counts
  (``python -m harness.rehearsal.run``);
- ``gpukit``: the GPU acceptance kit, which proves the CUDA paths on a GPU machine and runs
  its CPU form everywhere else (``python scripts/gpu_check.py``, which starts
  ``python -m harness.gpukit.run``);
- ``fuzz``: the C extension fed mutated real JPEGs, in its normal build and in an
  AddressSanitizer + UBSan build in a child (``python -m harness.fuzz.sanitize``).

``checks`` (the environment a child process gets and the checks made after it) is shared by
every room and by the tests. The rooms do not import each other; of ``bench`` they import
``bench.common`` (every room), ``bench.scaling`` (``cluster``: ``summarise``) and
``bench.convert`` (``gpukit``: the conversion floor and timing), and nothing else
(``HARNESS_BENCH`` in tools/check_layout.py); the library through its public API or the
white-box list in docs/development.md.
"""
