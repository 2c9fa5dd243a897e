"""``imgprep convert``: from a listed input to finished shards or label lists.

``options`` holds the options (``ConvertOptions``, ``TransformOptions``: their choices and
defaults), ``tasks`` plans what a run will do (split, tasks, fingerprint), ``outdir`` decides
what a run may do to its output folder, ``records`` keeps task records and shares the work
between ranks, ``pool`` is the worker pool, ``image`` turns one image into a 256 px RGB JPEG,
``execute`` converts tasks (whole or in parts), ``errorlog`` writes the error log,
``finalise`` writes what completes a split (the manifest last), ``summary`` says what a run
did (``ConvertSummary``), and ``run`` ties them together (``convert_splits``).

May import ``inputs``, ``shards``, ``job`` and the leaf modules; not ``stage`` or ``cli``.
"""
