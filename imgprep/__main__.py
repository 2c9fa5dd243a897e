"""``python -m imgprep`` is the ``imgprep`` command."""

from imgprep.cli.commands import main

main()
