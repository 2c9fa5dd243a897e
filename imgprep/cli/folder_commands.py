"""The commands that read a converted (or staged) folder: ``verify``, ``info``, ``preview``,
and ``index``, which rebuilds the sample index from the shards' tar headers."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from imgprep.cli.logs import warn
from imgprep.cli.options import (
    EXIT_FAILED,
    emit,
    fail,
    json_option,
    progress_bar,
    quiet_option,
    split_option,
    workers_option,
)
from imgprep.errors import ImgprepError


@click.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@split_option
@click.option("--decode/--no-decode", default=True, show_default=True,
              help="Decode every image (slow) or check checksums and structure only.")
@workers_option
@quiet_option
@json_option
def verify(path: Path, split: str | None, decode: bool, workers: int | None, quiet: bool,
           as_json: bool) -> None:
    """Re-check a converted folder against its manifest, or a label-list file.

    Exit 0 when everything matches, 1 when problems were found (each printed on stderr),
    a split left unfinished in the folder among them (--split picks the finished ones); 3
    when there is nothing finished to check. Shards (or parts of them) and chunks of a list
    are checked by --workers processes; the report is the same whatever their number.
    """
    from imgprep.convert.provenance import source_notes
    from imgprep.shards.verify import plan_verify, run_verify

    try:
        plan = plan_verify(path, split)
    except ImgprepError as e:
        fail(e)
    bar = progress_bar(quiet, "verify", plan.total)
    try:
        rep = run_verify(plan, decode, tick=bar.update, workers=workers)
    except ImgprepError as e:
        bar.close()
        fail(e)
    bar.close()
    for p in rep.problems:
        click.echo(f"imgprep: problem: {p}", err=True)
    notes = source_notes(t.manifest for t in plan.targets if t.manifest is not None)
    for n in notes:
        click.echo(f"imgprep: note: {n}", err=True)
    summary = {"target": rep.target, "ok": rep.ok, "checked": rep.checked,
               "samples": rep.samples, "problems": rep.problems, "unfinished": rep.unfinished,
               "notes": notes}
    unfinished = f"; unfinished: {', '.join(rep.unfinished)}" if rep.unfinished else ""
    emit(summary, as_json, quiet, lambda: (
        f"{rep.target}: {'OK' if rep.ok else 'PROBLEMS'}: {rep.checked} checked, "
        f"{rep.samples} samples, {len(rep.problems)} problems{unfinished}"))
    if not rep.ok:
        sys.exit(EXIT_FAILED)


@click.command()
@click.argument("path", required=False, type=click.Path(exists=True, path_type=Path))
@split_option
@click.option("--strict", is_flag=True,
              help="Exit 1 when the crop-aware decoder or the resampler is not built, or its "
                   "libjpeg-turbo runs without SIMD (a PIL that is not pillow-simd is only a "
                   "warning).")
@quiet_option
@json_option
def info(path: Path | None, split: str | None, strict: bool, quiet: bool,
         as_json: bool) -> None:
    """Versions, the crop-aware decoder's libjpeg-turbo (bundled or the system's, SIMD on or
    off), the resampler's kernel, what the loader decodes and resizes with, whether PIL is
    pillow-simd (AVX2, libjpeg-turbo), and a manifest summary.

    With --quiet or --json, a decoder or resampler that is not the fast build is said on
    stderr only when --strict makes it a failure.
    """
    from imgprep import jpegcrop
    from imgprep.cli.report import info_lines
    from imgprep.convert.image import describe_transform, transform_version
    from imgprep.convert.provenance import source_notes
    from imgprep.shards.info import (
        ManifestSummary,
        decoder_warning,
        loader_path,
        manifest_summaries,
        pil_info,
        pil_warning,
        resampler_warning,
        versions,
    )
    from imgprep.shards.manifest import read_manifest

    ver, pil, lib = versions(), pil_info(), jpegcrop.library()
    convert = describe_transform(transform_version())
    out: dict[str, Any] = {"versions": asdict(ver), "pil": asdict(pil), "loader": loader_path(),
                           "libjpeg": asdict(lib) if lib is not None else None,
                           "convert": {"transform_version": transform_version(),
                                       "transform": convert}}
    manifests: list[ManifestSummary] = []
    notes: list[str] = []
    if path is not None:
        try:
            manifests = manifest_summaries(path, split)
            notes = source_notes(read_manifest(Path(m.path)) for m in manifests)
        except ImgprepError as e:
            fail(e)
        out["manifests"] = [m.to_json() for m in manifests]
        out["notes"] = notes
    failing = "; ".join(w for w in (decoder_warning(lib), resampler_warning()) if w) or None
    warning = "; ".join(w for w in (failing, pil_warning(pil)) if w) or None
    out["warning"] = warning
    emit(out, as_json, quiet, lambda: "\n".join(
        info_lines(ver, pil, lib, manifests, convert, out["loader"])
        + [f"note: {n}" for n in notes]))
    if warning and not (quiet or as_json):
        warn(warning)
    if strict and failing:
        if quiet or as_json:
            click.echo(f"imgprep: error: {failing}", err=True)
        sys.exit(EXIT_FAILED)


@click.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="PNG file to write.")
@click.option("-n", "count", type=click.IntRange(1, 1024), default=32, show_default=True,
              help="How many random samples.")
@click.option("--seed", type=int, default=0, show_default=True, help="Which random samples.")
@split_option
@quiet_option
@json_option
def preview(path: Path, output: Path, count: int, seed: int, split: str | None, quiet: bool,
            as_json: bool) -> None:
    """Write a contact sheet of random converted samples with their class names."""
    from imgprep.shards.preview import make_sheet

    try:
        s = make_sheet(path, output, n=count, split=split, seed=seed)
    except ImgprepError as e:
        fail(e)
    emit(asdict(s), as_json, quiet, lambda: f"{output}: {s.samples} samples")


@click.command("index")
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@split_option
@click.option("--dali", is_flag=True,
              help="Also write each shard's DALI index (<shard>.idx, for DALI's "
                   "readers.webdataset) where the conversion has none.")
@workers_option
@quiet_option
@json_option
def index_cmd(folder: Path, split: str | None, dali: bool, workers: int | None, quiet: bool,
              as_json: bool) -> None:
    """Build the sample index of a converted (or staged) shard folder from tar headers.

    Rewrites each shard manifest atomically to name its index (<split>-index.bin); the
    loaders need it. The DALI indexes beside the shards (<split>-NNNNNN.idx) are rebuilt
    with it when the manifest names them, and written with --dali. convert writes both
    already: this is for older conversions or after an index was lost or damaged. The
    shards are read by --workers processes; the files are the same whatever their number.
    """
    from imgprep.shards.indexing import plan_index, run_index

    try:
        plan = plan_index(folder, split)
    except ImgprepError as e:
        fail(e)
    bar = progress_bar(quiet, "index", plan.samples)
    try:
        done = run_index(plan, dali, workers, tick=bar.update)
    except ImgprepError as e:
        bar.close()
        fail(e)
    bar.close()
    emit(asdict(done), as_json, quiet, lambda: "\n".join(
        f"{folder}/{d.index}: {d.samples} samples in {d.shards} shards, {d.bytes} bytes"
        + (f"; a DALI index ({d.dali}) beside each shard" if d.dali else "")
        for d in done.splits))
