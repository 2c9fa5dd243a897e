"""Write ``imgprep/inputs/data/ilsvrc2012_val_labels.bin``, the published ILSVRC2012 validation
labels, and ``imgprep/inputs/data/ilsvrc2012_devkit_ids.txt``, the 2012 devkit's ID -> wnid map.

The file holds 50,000 little-endian uint16: item n-1 is the class of ``ILSVRC2012_val_%08d``
n, as its index in the sorted list of the 1000 wnids (``imgprep/inputs/data/synset_words.txt``).
It is made from Caffe's ``val.txt`` (``caffe_ilsvrc12.tar.gz``, ``name index`` a line,
0-based sorted-wnid index) and refused unless it agrees line for line with the devkit form
(``ILSVRC2012_validation_ground_truth.txt``, devkit IDs mapped to wnids by
``map_clsloc.txt``) and, when present, Kaggle's ``LOC_val_solution.csv``. The files are parsed
here on their own, not by ``imgprep.inputs.groundtruth`` (which checks against this file). Prints
the sha256 to record as ``VAL_LABELS_SHA256`` in ``imgprep/inputs/synsets.py``.

The devkit map (line n: the wnid of ILSVRC2012_ID n) is ``map_clsloc.txt``'s, whose IDs the
check above shows are the 2012 devkit's; it must list IDs 1..1000, each class once. Prints its
sha256, to record as ``DEVKIT_IDS_SHA256`` in ``imgprep/inputs/devkit.py``.

    python scripts/make_val_labels.py [--meta ../shared/data/imagenet-sample/meta] [--out FILE]
        [--devkit-out FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

import numpy as np

from imgprep import imagenet_classes, write_bytes_atomic
from imgprep.inputs import devkit, synsets
from imgprep.inputs.devkit import DEVKIT_IDS_FILE
from imgprep.inputs.synsets import VAL_IMAGES, VAL_LABELS_FILE

REPO = Path(__file__).resolve().parents[1]
OUT = Path(synsets.__file__).resolve().parent / VAL_LABELS_FILE  # beside the module reading it
DEVKIT_OUT = Path(devkit.__file__).resolve().parent / DEVKIT_IDS_FILE
NAME = re.compile(r"^ILSVRC2012_val_(\d{8})(?:\.JPEG)?$")


def _number(name: str, where: str) -> int:
    m = NAME.match(name)
    if m is None or not 1 <= int(m.group(1)) <= VAL_IMAGES:
        sys.exit(f"{where}: {name!r} is not a validation image name")
    return int(m.group(1))


def from_caffe(path: Path) -> np.ndarray:
    labels = np.full(VAL_IMAGES, -1, dtype=np.int64)
    for n, line in enumerate(path.read_text("utf-8-sig").splitlines(), 1):
        name, label = line.split()
        labels[_number(name, f"{path}:{n}") - 1] = int(label)
    return labels


def from_devkit(truth: Path, mapping: Path, index: dict[str, int]) -> np.ndarray:
    wnid_of = {int(t[1]): t[0] for t in
               (ln.split() for ln in mapping.read_text("utf-8-sig").splitlines()) if t}
    ids = [int(ln) for ln in truth.read_text("utf-8-sig").split()]
    return np.asarray([index[wnid_of[i]] for i in ids], dtype=np.int64)


def from_kaggle(path: Path, index: dict[str, int]) -> np.ndarray:
    labels = np.full(VAL_IMAGES, -1, dtype=np.int64)
    for n, line in enumerate(path.read_text("utf-8-sig").splitlines()[1:], 2):
        name, _, pred = line.partition(",")
        labels[_number(name, f"{path}:{n}") - 1] = index[pred.split()[0]]
    return labels


def devkit_ids(mapping: Path, classes: tuple[str, ...]) -> bytes:
    """The devkit map file's bytes: the wnid of ID n on line n."""
    rows = sorted((int(t[1]), t[0]) for t in
                  (ln.split() for ln in mapping.read_text("utf-8-sig").splitlines()) if t)
    if [i for i, _ in rows] != list(range(1, len(classes) + 1)) or \
            sorted(w for _, w in rows) != sorted(classes):
        sys.exit(f"{mapping}: not IDs 1..{len(classes)} mapping each class once")
    return "".join(f"{w}\n" for _, w in rows).encode("ascii")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--meta", type=Path,
                    default=REPO.parent / "shared" / "data" / "imagenet-sample" / "meta")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--devkit-out", type=Path, default=DEVKIT_OUT)
    args = ap.parse_args(argv)
    classes = imagenet_classes()
    index = {w: i for i, w in enumerate(classes.wnids)}
    labels = from_caffe(args.meta / "caffe_val.txt")
    if (labels < 0).any() or (labels >= len(classes)).any():
        sys.exit(f"{args.meta / 'caffe_val.txt'}: not every image 1..{VAL_IMAGES} has a label "
                 f"in 0..{len(classes) - 1}")
    others = {"devkit": from_devkit(args.meta / "ILSVRC2012_validation_ground_truth.txt",
                                    args.meta / "map_clsloc.txt", index)}
    if (args.meta / "LOC_val_solution.csv").is_file():
        others["kaggle"] = from_kaggle(args.meta / "LOC_val_solution.csv", index)
    for form, other in others.items():
        if other.shape != labels.shape or (other != labels).any():
            sys.exit(f"caffe_val.txt and the {form} form disagree; fix the inputs")
    counts = np.bincount(labels, minlength=len(classes))
    if counts.min() != counts.max():
        sys.exit(f"classes hold {counts.min()}..{counts.max()} images, not the same number")
    data = labels.astype("<u2").tobytes()
    write_bytes_atomic(args.out, data)
    print(f"{args.out}: {VAL_IMAGES} labels, {counts.min()} per class, agreeing with "
          f"{', '.join(others)}; sha256 {hashlib.sha256(data).hexdigest()}")
    ids = devkit_ids(args.meta / "map_clsloc.txt", classes.wnids)
    write_bytes_atomic(args.devkit_out, ids)
    print(f"{args.devkit_out}: the devkit's {len(classes)} IDs; sha256 "
          f"{hashlib.sha256(ids).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
