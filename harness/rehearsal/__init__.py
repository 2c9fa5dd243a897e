"""The full-size rehearsal: ``run`` (``python -m harness.rehearsal.run``) and what it is made
of: the input at ILSVRC2012's real counts (``dataset``) or at ImageNet-21k's shape
(``in21k``), each step run as child processes under a sampler (``measure``), the checks made
after the steps (``checks``), the loader's plan and epoch slice in a child of their own
(``loaderstep``), and the table, projection and comparison (``report``). Not part of the
installed packages."""
