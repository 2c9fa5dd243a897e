"""The input: ImageNet as users downloaded it, read in place.

Listing nested tars and folders (``sources``, ``tarlist``, ``tarscan``), validation ground
truth in its four forms and its check against the published labels (``groundtruth``), the
class table and its shipped data (``synsets``, ``data/``), and the fake data set with the real
one's quirks (``fakeset``).

May import ``shards`` (the tar format, ``shards.tarfmt``), ``job`` and the leaf modules.
"""
