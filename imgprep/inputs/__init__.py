"""The input: ImageNet as users downloaded it, read in place.

Listing nested tars and folders (``sources``, ``tarlist``, ``tarscan``), validation ground
truth in its four forms and its check against the published labels (``groundtruth``), the
class table and its shipped data (``synsets``, ``data/``), and the fake data set with the real
one's quirks (``fakeset``). The forms other than image-net.org's lean on the names of the
Hugging Face copies (``hfnames``), parquet reading with pyarrow (``parquetio``) and the one
staging copy of a form without random access (``spool``).

May import ``shards`` (the tar header the fake set writes), ``job`` and the leaf modules.
"""
