"""The ``imgprep`` command: click commands that parse options and call the library.

``options`` defines every shared option once, ``report`` turns a command's summary into lines
for people, ``logs`` prints the library's warnings and notes on stderr. ``commands`` holds
the group (with ``stage-to-node`` and ``make-sample``), ``convert_command`` the ``convert``
command and ``folder_commands`` those that read a converted folder. Nothing here decides
policy: a command reads its options, calls one library function and prints what it returns.

May import every room (``convert``, ``stage``, ``inputs``, ``shards``, ``job``) and the leaf
modules; nothing in imgprep imports it.
"""

from imgprep.cli.commands import main

__all__ = ["main"]
