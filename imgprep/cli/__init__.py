"""The ``imgprep`` command: click commands that parse options and call the library.

``options`` defines every shared option once, ``report`` turns a command's JSON summary into
lines for people, ``commands`` holds the commands. Nothing here decides policy: a command reads
its options, calls one library function and prints what it returns.

May import every room (``convert``, ``stage``, ``inputs``, ``shards``, ``job``) and the leaf
modules; nothing in imgprep imports it.
"""

from imgprep.cli.commands import main

__all__ = ["main"]
