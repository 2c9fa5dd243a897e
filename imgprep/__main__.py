"""``python -m imgprep`` is the ``imgprep`` command."""

from imgprep.cli import main

main()
