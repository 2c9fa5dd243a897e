"""``imgprep stage-to-node``: shards from the file server onto each node's local disk.

``run`` is the entry point (one copier per node, the others wait) with its summary;
``options`` what it is asked, ``plan`` what a node needs (from the manifests alone),
``markers`` the done-markers that say a node holds its plan, ``nodelock`` the lock and liveness
protocol of a node folder, ``fill`` the copier's work under the lock. ``copier`` is the checked
copy engine over the thread pool ``pool``, ``localdisk`` the node folder's writes and their
errors, ``remote`` the sources (a folder or a URL, picked by its scheme) with ``s3`` for S3
stores. ``fanout`` replicates with the file server read once (its network side
``fanout_net``, its disk side ``fanout_disk``), with its schedule (``schedule``) and peer
liveness (``peers``).

Inside the room, imports go one way, with no loop: ``run`` -> ``fill`` -> (``copier``,
``fanout`` -> ``fanout_net`` -> ``fanout_disk``, ``markers`` -> ``nodelock``) -> ``plan`` ->
``options``; ``pool``, ``localdisk``, ``remote``, ``schedule`` and ``peers`` sit below.

May import ``inputs``, ``shards``, ``job`` and the leaf modules; not ``convert`` or ``cli``.
"""
