"""A small cluster on one Linux machine: network namespaces for a file server and N nodes,
joined through a bridge, the server's link throttled, the data served over sshfs.

Used by ``scripts/bench_cluster.py``; not part of the installed packages. Needs root, ``ip``,
``tc``, ``nsenter``, /dev/fuse, ``sshfs`` and ``sshd``.
"""
