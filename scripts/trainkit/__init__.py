"""Small modules of the embedded trainer (scripts/train_imagenet.py), and its error."""

from imgprep import ImgprepError


class TrainError(ImgprepError, RuntimeError):
    """Training cannot go on (a non-finite loss, a bad checkpoint, a resume of another run);
    the message says why and what to do."""
