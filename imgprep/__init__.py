"""imgprep: ImageNet-scale data preparation for data-parallel training.

Converts ILSVRC2012 (nested tars, folders, validation ground truth in any common form) into
256 px RGB label lists or checksummed webdataset shards, deterministically and resumably.
"""

from imgprep.errors import ImgprepError

__version__ = "0.1.0"

__all__ = ["ImgprepError", "__version__"]
