"""The input: ImageNet as users downloaded it, read in place.

One module per form ImageNet is downloaded in, over a small source protocol, and their
detection (``forms/``); listing nested tars, folders and zips (``sources``, ``tarlist``,
``tarscan``, ``ziplist``); reading an item's bytes where its form keeps them (``reader``);
keys (``keys``); validation ground truth in its four forms and its check against the
published labels (``groundtruth``); the class table and its shipped data (``synsets``,
``data/``); and the fake data set with the real one's quirks (``fakeset``), written in each
form (``fakes/``).

May import ``shards`` (the tar format, ``shards.tarfmt``), ``job`` and the leaf modules.
"""
