"""The job a process belongs to: who it is, what it may use, where it meets the others.

``world`` (the frozen ``World`` detected from torchrun, Open MPI, Slurm or PMI), ``cpus``
(affinity, cgroup cpuset and quota: the CPUs a rank may keep busy), ``assign`` (which node
holds which shards, pure functions), ``rendezvous`` (one address and port under any launcher).

May import the leaf modules only.
"""
