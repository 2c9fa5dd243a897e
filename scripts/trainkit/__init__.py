"""Small modules of the embedded trainer (scripts/train_imagenet.py).

The trainer runs as a script (``python scripts/train_imagenet.py``, ``torchrun ...``), which
imports these as ``trainkit.*``; the tests import them as ``scripts.trainkit.*`` with the
repository root on the path. So that both work, a module here imports its siblings relatively
(``from .timing import ...``), and the library through ``imgprep``'s and ``loaders``' public
API.
"""

from imgprep import ImgprepError


class TrainError(ImgprepError, RuntimeError):
    """Training cannot go on (a non-finite loss, a bad checkpoint, a resume of another run);
    the message says why and what to do."""
