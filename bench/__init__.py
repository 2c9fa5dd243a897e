"""The benchmarks: each module measures one part of the product against its own floor or peer
in the same run, prints a table of ratios against its targets and ends with one JSON line.
Run from the repository root as modules (``python -m bench.convert``; ``make bench`` runs
them all); not part of the installed packages.

``common`` is what they share (where the real images are, CPU-noise and process-tree
measures, an epoch timed end to end, verdicts, the run harness), ``rchar`` runs the
``imgprep`` command counting its own reads, ``chart`` draws the scaling picture,
``ffcv_peer`` runs FFCV beside ``loader`` in FFCV's own environment. They import the library
through its public API or the white-box list in docs/development.md, and never the
trainer's modules (``scripts/``): the scaling benchmark runs the trainer as users do. A child
process that needs the library runs a module (``python -m bench.rchar``), never a ``-c``
string that imports it.
"""
