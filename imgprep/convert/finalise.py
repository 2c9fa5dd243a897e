"""Finishing a split once every task is in: the error and warnings logs, then (when the
errors are within ``--max-errors``) the label list and its mean image, the sample index, and
the manifest last.

Everything here is computed from the task results sorted by task, so the files are the same
for any worker count or rank layout. The manifest is written only after every shard's rename
is on disk: a folder that has it holds the whole split.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from imgprep import __version__
from imgprep.convert.errorlog import (
    ErrorRecord,
    error_log_path,
    warning_log_path,
    write_error_log,
)
from imgprep.convert.execute import npy_bytes
from imgprep.convert.provenance import source_of
from imgprep.convert.samples import list_line
from imgprep.convert.tasks import Plan, TaskResult, manifest_options
from imgprep.fsutil import fsync_dir, write_bytes_atomic
from imgprep.inputs.spool import remove_spool
from imgprep.shards.indexing import index_shards
from imgprep.shards.manifest import Manifest, NodeSection, ShardEntry, write_manifest


@dataclass(frozen=True, kw_only=True)
class Finalised:
    """What finishing a split wrote: the manifest (None when the errors were over
    ``--max-errors``), the error log (None when there were none), and how many errors; the
    warnings log (None when none) and how many images converted with a warning."""

    manifest: Path | None
    error_log: Path | None
    errors: int
    warning_log: Path | None = None
    warnings: int = 0


@dataclass(frozen=True, kw_only=True)
class _ListFiles:
    """The label list's name and sha256, as the manifest records them."""

    name: str
    sha256: str


def mean_std(sums: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-channel mean and std on the 0..1 scale from exact integer sums."""
    n = sums[2].astype(np.float64)
    if not n.all():
        return [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    mean = sums[0] / n
    var = np.maximum(sums[1] / n - mean * mean, 0.0)
    return ([round(float(x) / 255, 6) for x in mean],
            [round(float(x) / 255, 6) for x in np.sqrt(var)])


def _write_list(plan: Plan, results: list[TaskResult], total: int) -> _ListFiles:
    """``<split>.txt``, ``classes.txt`` and (train) ``mean.npy`` of a label list."""
    out = plan.opts.out
    text = "".join(list_line(f.path, f.label) for r in results for f in r.files)
    data = text.encode("utf-8")
    write_bytes_atomic(out / f"{plan.split}.txt", data)
    write_bytes_atomic(out / "classes.txt", plan.classes.to_text().encode("utf-8"))
    if plan.wants_mean_image and total:
        side = plan.opts.transform.size
        acc = np.zeros((side, side, 3), dtype=np.uint64)
        for t in plan.tasks:
            acc += np.load(plan.mean_path(t))
        mean_img = (acc / total).astype(np.float32).transpose(2, 0, 1).copy()
        write_bytes_atomic(out / "mean.npy", npy_bytes(mean_img))
    return _ListFiles(name=f"{plan.split}.txt", sha256=hashlib.sha256(data).hexdigest())


def _manifest(plan: Plan, results: list[TaskResult], errors: int, log: Path | None,
              node: NodeSection | None) -> Manifest:
    """Write the outputs that go with the manifest (list files or the sample index), then
    return the manifest itself."""
    opts = plan.opts
    sums = np.sum([np.asarray(r.sums, dtype=np.int64) for r in results], axis=0) if results \
        else np.zeros((3, 3), dtype=np.int64)
    mean, std = mean_std(sums)
    total = sum(r.samples for r in results)
    listed = _write_list(plan, results, total) if opts.format == "list" else None
    shards = [ShardEntry(r.name, r.samples, r.bytes, r.sha256) for r in results] \
        if opts.format == "shards" else []
    index = index_shards(opts.out, plan.split, shards, plan.state_dir, dali=True) \
        if opts.format == "shards" else None
    return Manifest(
        split=plan.split, format=opts.format, total_samples=total,
        classes=plan.classes.to_json(), mean=mean, std=std,
        options=manifest_options(plan),
        tool_version=__version__, shards=shards,
        list_file=listed.name if listed else None, list_sha256=listed.sha256 if listed else None,
        errors=errors, error_log=log.name if log else None,
        stats_images=sum(r.stats_images for r in results), node=node, index=index,
        source=source_of(plan),
        labelled=plan.labelled, transform_version=plan.transform_version,
    )


def finalise(plan: Plan, results: list[TaskResult], extra_errors: list[ErrorRecord],
             node: NodeSection | None = None) -> Finalised:
    """Write the error log (``extra_errors`` first, then each task's in task order) and, when
    the errors are within ``--max-errors``, the split's remaining files and its manifest,
    then remove the staging copy of a form without random access."""
    results = sorted(results, key=lambda r: r.index)
    errors = extra_errors + [e for r in results for e in r.errors]
    log = write_error_log(error_log_path(plan.opts.out, plan.split), errors)
    noted = [w for r in results for w in r.warnings]
    notes = write_error_log(warning_log_path(plan.opts.out, plan.split), noted)
    if len(errors) > plan.opts.max_errors:
        return Finalised(manifest=None, error_log=log, errors=len(errors), warning_log=notes,
                         warnings=len(noted))
    manifest = _manifest(plan, results, len(errors), log, node)
    fsync_dir(plan.opts.out)  # every shard's rename is on disk before the manifest names it
    written = write_manifest(plan.opts.out, manifest)
    remove_spool(plan.spool_dir)  # a form's staging copy is not needed any more
    return Finalised(manifest=written, error_log=log, errors=len(errors), warning_log=notes,
                     warnings=len(noted))
