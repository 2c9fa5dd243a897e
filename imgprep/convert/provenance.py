"""The manifest's ``source``: what a split was converted from and what its labels passed.

Written once, by the run that makes the split's shards. A rerun that finds the split
finished with the same fingerprint (the same images, labels and options) writes the manifest
again but converts nothing, so it keeps the ``source`` it finds: a no-op rerun from another
form of the same images (the Kaggle tree after the Kaggle zip) does not claim shards it did
not make. The label check (``trusted`` where ``--trust-labels`` took the labels as given)
is recorded, so that ``imgprep verify`` and ``imgprep info`` note it on every check. The
images a ground truth lists that the input lacked are recorded too, but said once, by the
run that converted the split (the one that can act on it); ``imgprep info`` shows their
count as a fact of the manifest, not as a note.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from imgprep.convert.tasks import Plan, source_section
from imgprep.errors import ImgprepError
from imgprep.sections import SourceSection
from imgprep.shards.manifest import Manifest, manifest_path, read_manifest


def _kept(plan: Plan) -> SourceSection | None:
    """The ``source`` of the finished manifest of ``plan``'s split when it is this very
    conversion (same fingerprint); None otherwise."""
    path = manifest_path(plan.opts.out, plan.split)
    if not path.is_file():
        return None
    try:
        old = read_manifest(path)
    except ImgprepError:
        return None  # replaced by this run (--overwrite): nothing to keep
    if old.options.fingerprint != plan.fingerprint:
        return None
    return old.source


def source_of(plan: Plan) -> SourceSection:
    """The ``source`` the manifest of ``plan`` records (module docstring)."""
    kept = _kept(plan)
    if kept is not None:
        return kept
    check = plan.label_check
    return replace(source_section(plan.listing), label_check=check.mode,
                   expected=check.expected, missing=check.missing,
                   missing_first=", ".join(check.missing_first))


def source_notes(manifests: Iterable[Manifest]) -> list[str]:
    """What ``verify`` and ``info`` note of each split's source on every check: labels taken
    as given (module docstring: what a ground truth lacked is not repeated)."""
    return [f"{m.split}: its labels were taken as given (--trust-labels), not checked against "
            "the published labels or the images' names"
            for m in manifests if m.source is not None and m.source.label_check == "trusted"]
