"""A small cluster on one Linux machine: network namespaces for a file server and N nodes,
joined through a bridge, the server's link throttled, the data served over sshfs.

Run by ``python -m harness.cluster.bench``; not part of the installed packages. Needs root,
``ip``, ``tc``, ``nsenter``, /dev/fuse, ``sshfs`` and ``sshd``.
"""
