"""``imgprep stage-to-node``: shards from the file server onto each node's local disk.

``run`` plans and runs it (one copier per node, the others wait), ``nodelock`` is the lock and
liveness protocol of a node folder, ``copier`` the checked copy engine, ``remote`` the sources
(a folder or a URL, picked by its scheme) with ``s3`` for S3 stores, ``fanout`` replicates
with the file server read once, with its schedule (``schedule``) and peer liveness (``peers``).

May import ``inputs``, ``shards``, ``job`` and the leaf modules; not ``convert`` or ``cli``.
"""
