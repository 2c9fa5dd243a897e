"""A small faithful copy of ImageNet-21k as image-net.org ships it.

``winter21_whole.tar.gz`` (gzip-compressed) and ``fall11_whole.tar`` (plain): an outer tar
of ``<wnid>.tar`` per synset, in wnid order, each holding ``<wnid>_<n>.JPEG``. Made from the
fake set's train images (``imgprep.inputs.fakeset``: its quirks and, with ``bad``, its
truncated and empty files), with every other class renamed to a wnid outside the 1,000
ILSVRC2012 classes (``fake_wnid``), the first in wnid order among them, and the
classes' image counts skewed (from about a seventh of ``per_class`` to all of it), as the
real synsets' are. Both archives hold the same members; the gzip header carries no time or
name, so the same spec gives the same bytes.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from imgprep.fsutil import atomic_open, ensure_writable_dir
from imgprep.inputs.fakeset import BAD, FakeSummary, SampleItem, SampleSpec, sample_set
from imgprep.shards.tarfmt import tar_header

PLAIN = "fall11_whole.tar"
GZIPPED = "winter21_whole.tar.gz"
Member = tuple[str, bytes]


def fake_wnid(wnid: str, index: int) -> str:
    """The class's wnid in the fake: even classes get one outside the ILSVRC2012 table,
    ``n00`` + its last six digits (ILSVRC2012's smallest is ``n01440764``), which sort first,
    as winter21's first synset ``n00004475`` does."""
    return wnid if index % 2 else f"n00{wnid[3:]}"


def kept(index: int, per_class: int, item: SampleItem, j: int) -> bool:
    """Whether image ``j`` of class ``index`` is in the fake (a skewed share; the quirks and
    faults, among the first two images of a class, always are)."""
    share = max(1, per_class * ((index * 5) % 7 + 1) // 7)
    return j < share or item.kind is not None


def _tar(members: Sequence[Member]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            tf.addfile(tar_header(name, len(data)), io.BytesIO(data))
    return raw.getvalue()


def class_members(spec: SampleSpec) -> tuple[dict[str, list[Member]], list[str], list[str]]:
    """{wnid: its images as (name, bytes)} of the fake, with the quirks and faults it holds."""
    ss = sample_set(replace(spec, val=0, test=0))
    rename = {w: fake_wnid(w, i) for i, w in enumerate(ss.wnids)}
    if len(set(rename.values())) < len(rename):
        raise ValueError(f"{spec.classes} classes give two fake wnids alike; pass fewer")
    classes: dict[str, list[Member]] = {rename[w]: [] for w in ss.wnids}
    quirks: list[str] = []
    bad: list[str] = []
    seen: dict[str, int] = {}
    for it in ss.items():
        if it.split != "train":
            continue
        j = seen[it.wnid] = seen.get(it.wnid, -1) + 1
        if not kept(ss.wnids.index(it.wnid), spec.per_class, it, j):
            continue
        wnid = rename[it.wnid]
        name = f"{wnid}_{1000 + j}.JPEG"
        classes[wnid].append((name, it.data))
        if it.kind is not None:
            (bad if it.kind in BAD else quirks).append(
                f"{name}: {it.kind}")
    return classes, quirks, bad


def archive_bytes(classes: dict[str, list[Member]]) -> bytes:
    """The outer tar: one class tar per wnid, in wnid order."""
    return _tar([(f"{w}.tar", _tar(classes[w])) for w in sorted(classes)])


def write(out: Path, spec: SampleSpec) -> FakeSummary:
    """The fake set ``spec`` as ImageNet-21k's two archives in ``out``."""
    classes, quirks, bad = class_members(spec)
    raw = archive_bytes(classes)
    ensure_writable_dir(out)
    with atomic_open(out / PLAIN) as f:
        f.write(raw)
    with atomic_open(out / GZIPPED) as f, gzip.GzipFile(filename="", mode="wb", fileobj=f,
                                                        mtime=0) as gz:
        gz.write(raw)
    return FakeSummary(form="in21k", out=str(out), classes=sorted(classes),
                       train_images=sum(len(m) for m in classes.values()), val_images=0,
                       test_images=0, quirks=quirks, bad=bad,
                       inputs=[str(out / GZIPPED), str(out / PLAIN)])
