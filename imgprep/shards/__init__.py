"""The shard format and what reads it back.

The tar format, for every module that writes or reads tar bytes (``tarfmt``); the manifest
(``manifest``); the sample index (``index``) over each shard's layout (``layout``), built by
``indexing``, and the DALI index files made from it beside each shard (``dali``); writing
shards deterministically (``writers``, past the page cache with ``directio``), strict fast
reading (``tario``), what an output folder holds, finished or not (``folder``), and the
commands that only read a conversion: ``verify``, ``info``, ``preview``.

May import ``job`` and the leaf modules.
"""
