"""The input: ImageNet as users downloaded it, read in place.

One module per form ImageNet is downloaded in, over a small source protocol, and their
detection (``forms/``); listing nested tars, folders and zips (``sources``, ``tarlist``,
``tarscan``, ``ziplist``); reading an item's bytes where its form keeps them (``reader``);
keys (``keys``); validation ground truth in its four forms and its check against the
published labels (``groundtruth``); the class table and its shipped data (``synsets``,
``data/``); the fake data set with the real one's quirks (``fakeset``), written in each
form (``fakes/``); and what the Hugging Face and shard-set forms lean on: the Hub's names
(``hfnames``), parquet reading with pyarrow (``parquetio``) and the one staging copy of a
form without random access (``spool``).

May import ``shards`` (the tar format, ``shards.tarfmt``), ``job`` and the leaf modules.
"""
