"""The ``imgprep`` command line: parses options and calls library functions, nothing more.

Exit codes (all commands):
  0  success
  1  finished, but something failed: more bad images than --max-errors (convert; the error log
     lists them and no manifest is written), or problems found (verify)
  2  usage error (bad option or argument)
  3  could not run: missing or unreadable input, unknown ground-truth format, unwritable
     output, bad manifest … (one line on stderr says which file and what to do)
  130 interrupted (Ctrl-C); rerun the same command to resume
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from imgprep import __version__
from imgprep.cli.options import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    SourceType,
    emit,
    fail,
    json_option,
    mode_option,
    node_path,
    nodes_options,
    progress_bar,
    quiet_option,
    split_option,
    workers_option,
    world_of,
)
from imgprep.cli.report import dry_run_lines, make_sample_line
from imgprep.errors import ImgprepError
from imgprep.stage.remote import STALL_S


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="imgprep")
def cli() -> None:
    """Prepare ImageNet for data-parallel training: convert, stage to nodes, verify, inspect.

    \b
    imgprep convert ILSVRC2012_img_train.tar -o /shared/imagenet
    imgprep convert ILSVRC2012_img_val.tar --labels LOC_val_solution.csv -o /shared/imagenet
    imgprep stage-to-node --src /shared/imagenet --dst /local/nvme/imagenet --fanout
    imgprep verify /shared/imagenet
    """


@cli.command()
@click.argument("input", type=click.Path(exists=True, path_type=Path))
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Output folder (created if needed).")
@click.option("--format", "fmt", type=click.Choice(["shards", "list"]), default="shards",
              show_default=True,
              help="webdataset shards + manifest, or Chainer label list + images + mean.npy.")
@split_option
@click.option("--labels", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Validation ground truth (devkit, map_clsloc.txt, Kaggle CSV, Caffe val.txt "
                   "or one wnid per line); repeat for the devkit pair.")
@click.option("--label-offset", type=int, default=None,
              help="Subtract this from every label of a 'name label' ground truth: 1 for a "
                   "1-based file; 0 says the labels are 0-based (no 1-based check).")
@click.option("--trust-labels", is_flag=True,
              help="Convert ILSVRC2012_val_* images with the labels of --labels even where "
                   "they differ from the published ILSVRC2012 validation labels (refused "
                   "without it).")
@click.option("--classes", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Class list 'wnid name' per line (default: the 1000 ILSVRC2012 classes).")
@click.option("--form", metavar="FORM", help="Read INPUT as this form (default: detected).")
@click.option("--dry-run", is_flag=True, help="Say what it would read, skip and write; no write.")
@click.option("--overwrite", is_flag=True,
              help="Replace a finished conversion of the split made from other input, options "
                   "or format (removed first, and said so); without it such a run is refused.")
@click.option("--size", type=click.IntRange(8, 4096), default=256, show_default=True,
              help="Output side (center-crop) or short side (short-side).")
@click.option("--resize", type=click.Choice(["center-crop", "short-side"]), default="center-crop",
              show_default=True, help="Largest center square, or keep the aspect ratio.")
@click.option("--filter", "filt", type=click.Choice(["lanczos", "bicubic", "bilinear", "hamming",
              "box"]), default="lanczos", show_default=True, help="Antialiased resampling filter.")
@click.option("--quality", type=click.IntRange(1, 100), default=90, show_default=True,
              help="JPEG quality of the output.")
@click.option("--max-pixels", type=click.IntRange(1), default=89_478_485, show_default=True,
              help="Refuse images declaring more pixels (decompression bombs).")
@click.option("--exif-transpose/--no-exif-transpose", default=False, show_default=True,
              help="Apply EXIF orientation (torchvision, timm and Chainer ignore it).")
@click.option("--shard-size", type=click.IntRange(1), default=1250, show_default=True,
              help="Samples per shard (at most; shards differ by at most one).")
@click.option("--shards", "num_shards", type=click.IntRange(1), default=None,
              help="Number of shards (overrides --shard-size).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the permutation that spreads samples over shards.")
@click.option("--meta/--no-meta", default=True, show_default=True,
              help="Store <key>.json (wnid, original size and mode, source) in shards.")
@workers_option
@click.option("--max-errors", type=click.IntRange(0), default=0, show_default=True,
              help="Bad images tolerated before the run fails (exit 1, no manifest).")
@click.option("--mode", "rank_mode", type=click.Choice(["shared", "partition"]), default="shared",
              show_default=True,
              help="Under a launcher: ranks share one --out (shared), or each node writes only "
                   "the shards its ranks will read into its node-local --out (partition).")
@click.option("--wait-timeout", type=click.FloatRange(1), default=3600.0, show_default=True,
              help="Seconds rank 0 waits for the other ranks' shards before failing.")
@nodes_options
@quiet_option
@json_option
def convert(input: Path, out: Path, fmt: str, split: str | None, labels: tuple[Path, ...],
            label_offset: int | None, trust_labels: bool, classes: Path | None, form: str | None,
            dry_run: bool, overwrite: bool, size: int, resize: str, filt: str, quality: int,
            max_pixels: int, exif_transpose: bool, shard_size: int, num_shards: int | None,
            seed: int, meta: bool, workers: int | None, max_errors: int, rank_mode: str,
            wait_timeout: float, num_nodes: int | None, node_rank: int | None, quiet: bool,
            as_json: bool) -> None:
    """Convert ImageNet as downloaded to 256 px RGB shards or a label list.

    INPUT is ILSVRC2012_img_train.tar (read in place), ILSVRC2012_img_val.tar, a folder of
    per-class tars or images, Kaggle's zip or its extracted folder; each split it holds (train/
    and val/, validation/, ILSVRC2012_img_val.tar …) goes into its own manifest (--dry-run
    says which). Rerunning the same command after a crash or kill resumes and gives
    byte-identical output; another input or options for a finished split needs --overwrite.

    Launched by mpirun, srun or torchrun, each rank converts its share and rank 0 writes the
    manifest once all are done; '{node}' in --out becomes the node rank.
    """
    from imgprep.convert.image import TransformOptions
    from imgprep.convert.run import ConvertOptions, convert_splits
    from imgprep.shards.info import pil_info, pil_warning

    try:
        world = world_of(num_nodes, node_rank)
    except ImgprepError as e:
        fail(e)
    lead = world.rank == 0
    if not quiet and lead and (warning := pil_warning(pil_info(check_avx2=False))):
        click.echo(f"imgprep: warning: {warning}", err=True)
    opts = ConvertOptions(
        input=input, out=node_path(out, world.node_rank), format=fmt, split=split,
        labels=labels, classes=classes,
        transform=TransformOptions(size, resize, filt, quality, max_pixels, exif_transpose),
        shard_size=shard_size, num_shards=num_shards, seed=seed,
        workers=workers or world.cores_per_rank(),
        max_errors=max_errors, meta=meta, mode=rank_mode, wait_timeout=wait_timeout,
        overwrite=overwrite, label_offset=label_offset, trust_labels=trust_labels, form=form,
    )
    if dry_run:
        return _dry_run(opts, as_json, quiet)
    bars: list[Any] = []

    def on_plan(plan: Any, remaining: int) -> None:
        bars.append(progress_bar(quiet or not lead, f"convert {plan.split}", remaining))

    try:
        summaries = convert_splits(
            opts, world, progress=lambda n: bars[-1].update(n), on_plan=on_plan,
            notify=lambda line: click.echo(f"imgprep: warning: {line}", err=True))
    except ImgprepError as e:
        fail(e)
    except KeyboardInterrupt:
        click.echo("imgprep: interrupted; rerun the same command to resume", err=True)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        for b in bars:
            b.close()

    _convert_report(summaries, as_json, quiet, max_errors)


def _dry_run(opts: Any, as_json: bool, quiet: bool) -> None:
    from imgprep.convert.dryrun import dry_run

    try:
        report = dry_run(opts).to_json()
    except ImgprepError as e:
        fail(e)
    emit(report, as_json, quiet, lambda: "\n".join(dry_run_lines(report)))


def _convert_report(summaries: list[dict[str, Any]], as_json: bool, quiet: bool,
                    max_errors: int) -> None:
    """One summary (one split) as before; several as {"complete", "splits": [...]}."""
    from imgprep.cli.report import convert_lines

    summary = summaries[0] if len(summaries) == 1 else {
        "complete": all(s["complete"] for s in summaries), "splits": summaries}
    emit(summary, as_json, quiet,
          lambda: "\n".join(line for s in summaries for line in convert_lines(s, max_errors)))
    failed = [s for s in summaries if not s["complete"]]
    if failed:
        if quiet or as_json:
            for s in failed:
                click.echo(f"imgprep: error: {s['errors']} images of {s['split']} failed "
                           f"(> --max-errors {max_errors}); see {s['error_log']}", err=True)
        sys.exit(EXIT_FAILED)


@cli.command("stage-to-node")
@click.option("--src", required=True, type=SourceType(),
              help="Converted folder on the shared file server (holds the manifest), or its "
                   "URL: s3://BUCKET/PREFIX/ (read with boto3: pip install imgprep[s3]; see "
                   "docs/object-stores.md), http(s)://HOST/PATH/ (the folder served over "
                   "HTTP), or pipe:COMMAND where {} stands for each file name. A URL needs "
                   "--split. See docs/staging.md, \"Sources\".")
@click.option("--dst", required=True, type=click.Path(path_type=Path),
              help="Node-local folder; '{node}' in it becomes the node rank.")
@mode_option
@split_option
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the partition (must match the loaders').")
@click.option("--jobs", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Parallel copy streams from the file server.")
@click.option("--verify", "verify_mode", type=click.Choice(["sha256", "size"]), default="sha256",
              show_default=True, help="Check each copy's sha256 against the manifest, or size.")
@click.option("--timeout", type=click.FloatRange(1), default=3600.0, show_default=True,
              help="Seconds a waiting rank waits for its node's copier (fan-out: for a peer).")
@click.option("--stall-timeout", "stall", type=click.FloatRange(1), default=STALL_S,
              show_default=True,
              help="Seconds without a byte moved after which a hung copy stops with an "
                   "error naming its shard (a URL fetch, a file-server read; with --fanout the "
                   "stuck node stops every node).")
@click.option("--fanout", is_flag=True,
              help="With replicate: each node reads only its share from the file server and "
                   "gets the rest from the other nodes (see docs/staging.md).")
@click.option("--rendezvous", metavar="HOST:PORT", default=None,
              help="Where the node copiers meet for --fanout (node 0 listens there); needed "
                   "when no launcher says (--num-nodes/--node-rank loops).")
@nodes_options
@quiet_option
@json_option
def stage_to_node(src: Path | str, dst: Path, mode: str, split: str | None, seed: int, jobs: int,
                  verify_mode: str, timeout: float, stall: float, fanout: bool,
                  rendezvous: str | None,
                  num_nodes: int | None, node_rank: int | None, quiet: bool,
                  as_json: bool) -> None:
    """Copy the shards this node needs from the file server to local disk, verified.

    Run it in every process of the job (mpirun, srun, torchrun or a plain loop with
    --num-nodes/--node-rank): local rank 0 copies (or the first to take the lock in --dst
    when no launcher tells), the others wait for it. Reruns skip what is already staged.
    """
    from imgprep.errors import StageError
    from imgprep.stage.run import StageOptions
    from imgprep.stage.run import stage_to_node as run

    if fanout and mode != "replicate":
        raise click.UsageError("--fanout goes with --mode replicate (every node gets every shard)")
    if fanout:  # torch's C++ warnings would add stack traces to the one error line
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        world = world_of(num_nodes, node_rank)
        opts = StageOptions(src=src, dst=node_path(dst, world.node_rank), mode=mode,
                            split=split, seed=seed, jobs=jobs, verify=verify_mode,
                            timeout=timeout, stall=stall, fanout=fanout,
                            rendezvous=rendezvous)
        bars: list[Any] = []

        def on_start(total_bytes: int) -> None:
            from tqdm import tqdm

            bars.append(tqdm(total=total_bytes, desc=f"stage node {world.node_rank}", unit="B",
                             unit_scale=True, unit_divisor=1024, file=sys.stderr,
                             disable=quiet, dynamic_ncols=True))

        try:
            summary = run(opts, world, progress=lambda n: bars[0].update(n), on_start=on_start)
        finally:
            for b in bars:
                b.close()
    except ImgprepError as e:
        fail(e, at_once=fanout)
    except KeyboardInterrupt:
        fail(StageError("interrupted; rerun the same command to resume"), at_once=fanout,
              code=EXIT_INTERRUPTED)
    from imgprep.cli.report import stage_line

    emit(summary, as_json, quiet, lambda: stage_line(summary, fanout))


@cli.command()
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
    summary = {"target": rep.target, "ok": rep.ok, "checked": rep.checked,
               "samples": rep.samples, "problems": rep.problems, "unfinished": rep.unfinished}
    unfinished = f"; unfinished: {', '.join(rep.unfinished)}" if rep.unfinished else ""
    emit(summary, as_json, quiet, lambda: (
        f"{rep.target}: {'OK' if rep.ok else 'PROBLEMS'}: {rep.checked} checked, "
        f"{rep.samples} samples, {len(rep.problems)} problems{unfinished}"))
    if not rep.ok:
        sys.exit(EXIT_FAILED)


@cli.command()
@click.argument("path", required=False, type=click.Path(exists=True, path_type=Path))
@split_option
@click.option("--strict", is_flag=True,
              help="Exit 1 when PIL is not an AVX2 pillow-simd with libjpeg-turbo.")
@quiet_option
@json_option
def info(path: Path | None, split: str | None, strict: bool, quiet: bool,
         as_json: bool) -> None:
    """Versions, whether PIL is pillow-simd (AVX2, libjpeg-turbo), and a manifest summary.

    With --quiet or --json, a PIL that is not the fast build is said on stderr only when
    --strict makes it a failure.
    """
    from imgprep.cli.report import info_lines
    from imgprep.shards.info import manifest_summaries, pil_info, pil_warning, versions

    out: dict[str, Any] = {"versions": versions(), "pil": pil_info()}
    if path is not None:
        try:
            out["manifests"] = manifest_summaries(path, split)
        except ImgprepError as e:
            fail(e)
    warning = pil_warning(out["pil"])
    out["warning"] = warning
    emit(out, as_json, quiet, lambda: "\n".join(info_lines(out)))
    if warning and not (quiet or as_json):
        click.echo(f"WARNING: {warning}", err=True)
    if strict and warning:
        if quiet or as_json:
            click.echo(f"imgprep: error: {warning}", err=True)
        sys.exit(EXIT_FAILED)


@cli.command()
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
    emit(s, as_json, quiet, lambda: f"{output}: {s['samples']} samples")


@cli.command("make-sample")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--form", default="ilsvrc", show_default=True, help="ilsvrc (image-net.org), "
              "kaggle, kaggle-zip, hf-parquet, hf-targz or wds: the same images in each.")
@click.option("--classes", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option("--per-class", type=click.IntRange(1), default=12, show_default=True)
@click.option("--val", type=click.IntRange(0), default=50, show_default=True,
              help="Validation images.")
@click.option("--test", type=click.IntRange(0), default=10, show_default=True,
              help="Test images (forms with a test split).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--bad/--no-bad", default=False, show_default=True,
              help="Add a truncated JPEG and a zero-byte file to the train set.")
@quiet_option
@json_option
def make_sample_cmd(out: Path, form: str, classes: int, per_class: int, val: int, test: int,
                    seed: int, bad: bool, quiet: bool, as_json: bool) -> None:
    """Write a small fake ImageNet with its quirks in a form it is downloaded in."""
    from imgprep.inputs.fakes import FAKES, SampleSpec, make_fake

    if form not in FAKES:
        raise click.BadParameter(f"not one of {', '.join(FAKES)}", param_hint="--form")
    try:
        s = make_fake(form, out, SampleSpec(classes=classes, per_class=per_class, val=val,
                                            seed=seed, bad=bad, test=test))
    except ImgprepError as e:
        fail(e)
    if form == "ilsvrc":  # the summary it always gave
        s = {k: v for k, v in s.items() if k not in ("form", "test_images", "inputs")}
    emit(s, as_json, quiet, lambda: make_sample_line(s, form))


@cli.command("index")
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@split_option
@click.option("--dali", is_flag=True,
              help="Also write each shard's DALI index (<shard>.idx, for DALI's "
                   "readers.webdataset) where the conversion has none.")
@quiet_option
@json_option
def index_cmd(folder: Path, split: str | None, dali: bool, quiet: bool, as_json: bool) -> None:
    """Build the sample index of a converted (or staged) shard folder from tar headers.

    Rewrites each shard manifest atomically to name its index (<split>-index.bin); the
    loaders need it. The DALI indexes beside the shards (<split>-NNNNNN.idx) are rebuilt
    with it when the manifest names them, and written with --dali. convert writes both
    already: this is for older conversions or after an index was lost or damaged.
    """
    from imgprep.shards.index import index_folder

    try:
        done = index_folder(folder, split, dali)
    except ImgprepError as e:
        fail(e)
    emit({"folder": str(folder), "splits": done}, as_json, quiet, lambda: "\n".join(
        f"{folder}/{d['index']}: {d['samples']} samples in {d['shards']} shards, "
        f"{d['bytes']} bytes" + (f"; a DALI index ({d['dali']}) beside each shard"
                                 if d["dali"] else "") for d in done))


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="imgprep")


if __name__ == "__main__":
    main()
