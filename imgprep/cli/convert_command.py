"""``imgprep convert``: its options (choices and defaults from ``imgprep.convert.options``),
the call, and its summary, exit code and error lines."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from imgprep.cli.logs import warn
from imgprep.cli.options import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    emit,
    fail,
    json_option,
    node_path,
    nodes_options,
    progress_bar,
    quiet_option,
    split_option,
    workers_option,
    world_of,
)
from imgprep.convert.options import OUTPUT_FORMATS, RANK_MODES, ConvertOptions, default
from imgprep.errors import ImgprepError
from imgprep.job.world import World
from imgprep.sections import (
    FILTER_NAMES,
    QUALITY_RANGE,
    RAW_MODES,
    RESIZE_MODES,
    SIZE_RANGE,
    STORE_MODES,
    StoreOptions,
    TransformOptions,
)

if TYPE_CHECKING:
    from imgprep.convert.summary import ConvertSummary
    from imgprep.convert.tasks import Plan


def _of_convert(name: str) -> Any:
    return default(ConvertOptions, name)


def _of_transform(name: str) -> Any:
    return default(TransformOptions, name)


def _of_store(name: str) -> Any:
    return default(StoreOptions, name)


@click.command()
@click.argument("input", type=click.Path(exists=True, path_type=Path))
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Output folder (created if needed).")
@click.option("--format", "fmt", type=click.Choice(OUTPUT_FORMATS), default=_of_convert("format"),
              show_default=True,
              help="webdataset shards + manifest, or Chainer label list + images + mean.npy.")
@split_option
@click.option("--labels", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Validation ground truth (the devkit's, alone or as "
                   "ILSVRC2012_devkit_t12.tar.gz, map_clsloc.txt, Kaggle CSV, Caffe val.txt or "
                   "one wnid per line; repeat for several). Not needed for ILSVRC2012_val_* "
                   "names: the published labels ship with imgprep.")
@click.option("--label-offset", type=int, default=None,
              help="Subtract this from every label of a 'name label' ground truth: 1 for a "
                   "1-based file; 0 says the labels are 0-based (no 1-based check).")
@click.option("--trust-labels", is_flag=True,
              help="Convert with the labels of --labels, or those the input carries, even "
                   "where they differ from the published ILSVRC2012 validation labels or from "
                   "the wnid an image's name starts with (refused without it).")
@click.option("--classes", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Class list 'wnid name' per line (default: the 1000 ILSVRC2012 classes; "
                   "for ImageNet-21k the sorted wnids present).")
@click.option("--form", metavar="FORM", help="Read INPUT as this form (default: detected).")
@click.option("--dry-run", is_flag=True, help="Say what it would read, skip and write; no write.")
@click.option("--overwrite", is_flag=True,
              help="Replace a finished conversion of the split made from other input, options "
                   "or format (removed first, and said so); without it such a run is refused.")
@click.option("--size", type=click.IntRange(*SIZE_RANGE), default=_of_transform("size"),
              show_default=True, help="Output side (center-crop) or short side (short-side).")
@click.option("--resize", type=click.Choice(RESIZE_MODES), default=_of_transform("resize"),
              show_default=True, help="Largest center square, or keep the aspect ratio.")
@click.option("--filter", "filt", type=click.Choice(FILTER_NAMES),
              default=_of_transform("filter"), show_default=True,
              help="Antialiased resampling filter.")
@click.option("--quality", type=click.IntRange(*QUALITY_RANGE), default=_of_transform("quality"),
              show_default=True, help="JPEG quality of the output.")
@click.option("--max-pixels", type=click.IntRange(1), default=_of_transform("max_pixels"),
              show_default=True, help="Refuse images declaring more pixels (decompression bombs).")
@click.option("--exif-transpose/--no-exif-transpose", default=_of_transform("exif_transpose"),
              show_default=True,
              help="Apply EXIF orientation (torchvision, timm and Chainer ignore it).")
@click.option("--shard-size", type=click.IntRange(1), default=_of_convert("shard_size"),
              show_default=True, help="Samples per shard (at most; shards differ by at most one).")
@click.option("--shards", "num_shards", type=click.IntRange(1), default=None,
              help="Number of shards (overrides --shard-size).")
@click.option("--seed", type=int, default=_of_convert("seed"), show_default=True,
              help="Seed of the permutation that spreads samples over shards.")
@click.option("--holdout-per-class", type=click.IntRange(0),
              default=_of_convert("holdout_per_class"), show_default=True,
              help="Hold out min(N, n/2) images of each class of a train split as a val split "
                   "(ImageNet-21k has none), picked by a hash of wnid and key keyed by "
                   "--holdout-seed: the same images whatever the workers.")
@click.option("--holdout-seed", type=int, default=_of_convert("holdout_seed"),
              show_default=True, help="Key of the hash that picks the held-out images.")
@click.option("--store", "store_mode", type=click.Choice(STORE_MODES),
              default=_of_store("mode"), show_default=True,
              help="How each image is kept: the JPEG (.jpg), its full-scale decode as stored "
                   "pixels (yuv420: the JPEG's own planes, 1.5 bytes a pixel, .yuv420; rgb: 3 "
                   "bytes a pixel, .rgb24), or mixed image by image (--raw-fraction or "
                   "--raw-ratio). Stored pixels load 2-4x faster and take 4-8x the bytes.")
@click.option("--raw-format", type=click.Choice(RAW_MODES), default=_of_store("raw"),
              show_default=True, help="--store mixed: the stored pixels' kind.")
@click.option("--raw-fraction", type=click.FloatRange(0, 1), default=None,
              help="--store mixed: keep this share of the images as pixels (picked by a hash "
                   "of the key; FFCV's proportion).")
@click.option("--raw-ratio", type=click.FloatRange(0, min_open=True), default=None,
              help="--store mixed: keep as pixels the images whose JPEG is at least this "
                   "share of the pixels' bytes (where decoding costs most for the bytes).")
@click.option("--from-shards", is_flag=True,
              help="INPUT is a finished conversion (shards and manifests): rewrite its shards "
                   "into --out with their images kept as --store says, nothing else read.")
@click.option("--meta/--no-meta", default=_of_convert("meta"), show_default=True,
              help="Store <key>.json (wnid, original size and mode, source) in shards.")
@workers_option
@click.option("--max-errors", type=click.IntRange(0), default=_of_convert("max_errors"),
              show_default=True,
              help="Bad images tolerated before the run fails (exit 1, no manifest).")
@click.option("--max-image-bytes", type=click.IntRange(1),
              default=_of_convert("max_image_bytes"), show_default=True,
              help="Refuse, unread, an image whose recorded size (zip directory, tar header, "
                   "file size, parquet cell) is larger: a bad image, counted against "
                   "--max-errors. The largest ILSVRC2012 image is ~15 MB.")
@click.option("--mode", "rank_mode", type=click.Choice(RANK_MODES), default=_of_convert("mode"),
              show_default=True,
              help="Under a launcher: ranks share one --out (shared), or each node writes only "
                   "the shards its ranks will read into its node-local --out (partition).")
@click.option("--wait-timeout", type=click.FloatRange(1), default=_of_convert("wait_timeout"),
              show_default=True,
              help="Seconds rank 0 waits for the other ranks' shards before failing.")
@nodes_options
@quiet_option
@json_option
def convert(input: Path, out: Path, fmt: str, split: str | None, labels: tuple[Path, ...],
            label_offset: int | None, trust_labels: bool, classes: Path | None, form: str | None,
            dry_run: bool, overwrite: bool, size: int, resize: str, filt: str, quality: int,
            max_pixels: int, exif_transpose: bool, shard_size: int, num_shards: int | None,
            seed: int, holdout_per_class: int, holdout_seed: int, store_mode: str,
            raw_format: str, raw_fraction: float | None, raw_ratio: float | None,
            from_shards: bool, meta: bool,
            workers: int | None, max_errors: int, max_image_bytes: int, rank_mode: str,
            wait_timeout: float, num_nodes: int | None, node_rank: int | None, quiet: bool,
            as_json: bool) -> None:
    """Convert ImageNet as downloaded to 256 px RGB shards or a label list.

    INPUT is ILSVRC2012_img_train.tar (read in place), ILSVRC2012_img_val.tar, a folder of
    per-class tars or images, Kaggle's zip or its extracted folder, ImageNet-21k's
    winter21_whole.tar.gz or fall11_whole.tar (--holdout-per-class makes its val split); each
    split it holds (train/ and val/, validation/, ILSVRC2012_img_val.tar …) goes into its own
    manifest (--dry-run says which; a test split, which has no labels, only with --split
    test, unlabelled). A validation split named ILSVRC2012_val_* needs no --labels: the
    published labels ship with imgprep. Rerunning the same command after a crash or kill
    resumes and gives byte-identical output; another input or options for a finished split
    needs --overwrite.

    Launched by mpirun, srun or torchrun, each rank converts its share and rank 0 writes the
    manifest once all are done; '{node}' in --out becomes the node rank.
    """
    try:
        world = world_of(num_nodes, node_rank)
    except ImgprepError as e:
        fail(e)
    transform = TransformOptions(size=size, resize=resize, filter=filt, quality=quality,
                                 max_pixels=max_pixels, exif_transpose=exif_transpose)
    try:
        store = StoreOptions(mode=store_mode, raw=raw_format, fraction=raw_fraction,
                             min_ratio=raw_ratio)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if store.stored and fmt != "shards":
        raise click.UsageError(f"--store {store_mode} keeps pixels in shards; a label list "
                               "holds JPEG files: pass --format shards, or --store jpeg")
    if from_shards:
        return _from_shards(input, out, store, workers or world.cores_per_rank(), overwrite,
                            quiet, as_json)
    opts = ConvertOptions(
        input=input, out=node_path(out, world.node_rank), format=fmt, split=split,
        labels=labels, classes=classes, transform=transform, shard_size=shard_size,
        num_shards=num_shards, seed=seed, workers=workers or world.cores_per_rank(),
        max_errors=max_errors, max_image_bytes=max_image_bytes, meta=meta, mode=rank_mode,
        wait_timeout=wait_timeout, overwrite=overwrite, label_offset=label_offset,
        trust_labels=trust_labels, form=form,
        holdout_per_class=holdout_per_class, holdout_seed=holdout_seed, store=store,
    )
    if dry_run:
        return _dry_run(opts, as_json, quiet)
    _report(_run(opts, world, quiet), as_json, quiet, max_errors)


def _from_shards(src: Path, out: Path, store: StoreOptions, workers: int, overwrite: bool,
                 quiet: bool, as_json: bool) -> None:
    """``--from-shards``: the set's shards rewritten as ``store`` says; one line a split."""
    from imgprep.convert.fromshards import from_shards

    if not store.stored:
        raise click.UsageError("--from-shards rewrites a set's JPEGs as stored pixels: pass "
                               "--store yuv420, rgb or mixed")
    try:
        done = from_shards(src, out, store, workers=workers, overwrite=overwrite)
    except ImgprepError as e:
        fail(e)
    emit({"splits": [asdict(d) for d in done]}, as_json, quiet, lambda: "\n".join(
        f"{d.split}: {d.samples} samples, {d.stored} stored as pixels, "
        f"{d.bytes_before / 1e6:.1f} MB -> {d.bytes_after / 1e6:.1f} MB ({d.manifest})"
        if d.done else f"{d.split}: already rewritten ({d.manifest})" for d in done))


def _dry_run(opts: ConvertOptions, as_json: bool, quiet: bool) -> None:
    """What the run would read, skip and write, as text or JSON; nothing is written."""
    from imgprep.cli.report import dry_run_lines
    from imgprep.convert.dryrun import dry_run

    try:
        report = dry_run(opts)
    except ImgprepError as e:
        fail(e)
    emit(report.to_json(), as_json, quiet, lambda: "\n".join(dry_run_lines(report)))


def _run(opts: ConvertOptions, world: World, quiet: bool) -> list[ConvertSummary]:
    """Run the conversion with a progress bar a split on rank 0 (after a warning when PIL is
    not the fast build); one summary a split, or the one-line exit of a failure."""
    from imgprep.convert.run import convert_splits
    from imgprep.shards.info import pil_info, pil_warning

    lead = world.rank == 0
    if not quiet and lead and (warning := pil_warning(pil_info(check_avx2=False))):
        warn(warning)
    bars: list[Any] = []

    def on_plan(plan: Plan, remaining: int) -> None:
        bars.append(progress_bar(quiet or not lead, f"convert {plan.split}", remaining))

    try:
        return convert_splits(opts, world, progress=lambda n: bars[-1].update(n),
                              on_plan=on_plan)
    except ImgprepError as e:
        fail(e)
    except KeyboardInterrupt:
        click.echo("imgprep: interrupted; rerun the same command to resume", err=True)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        for b in bars:
            b.close()


def _report(summaries: list[ConvertSummary], as_json: bool, quiet: bool,
            max_errors: int) -> None:
    """One summary (one split) as before; several as {"complete", "splits": [...]}."""
    from imgprep.cli.report import convert_lines

    out = asdict(summaries[0]) if len(summaries) == 1 else {
        "complete": all(s.complete for s in summaries),
        "splits": [asdict(s) for s in summaries]}
    emit(out, as_json, quiet,
         lambda: "\n".join(line for s in summaries for line in convert_lines(s, max_errors)))
    failed = [s for s in summaries if not s.complete]
    if failed:
        if quiet or as_json:
            for s in failed:
                click.echo(f"imgprep: error: {s.errors} images of {s.split} failed "
                           f"(> --max-errors {max_errors}); see {s.error_log}", err=True)
        sys.exit(EXIT_FAILED)
