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

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from imgprep import __version__
from imgprep.errors import ImgprepError

F = TypeVar("F", bound=Callable[..., Any])
EXIT_FAILED, EXIT_FATAL, EXIT_INTERRUPTED = 1, 3, 130


def quiet_option(f: F) -> F:
    return click.option("--quiet", "-q", is_flag=True,
                        help="No progress bar and no human-readable summary.")(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print a JSON summary on stdout.")(f)


def split_option(f: F) -> F:
    return click.option("--split", type=click.Choice(["train", "val"]), default=None,
                        help="Which split (default: inferred from the input or the folder).")(f)


def workers_option(f: F) -> F:
    return click.option("--workers", "-j", type=click.IntRange(1, 1024), default=None,
                        show_default="all cores / ranks per node",
                        help="Parallel worker processes (per rank).")(f)


def _progress(quiet: bool, desc: str, total: int | None = None) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="img", file=sys.stderr, disable=quiet,
                dynamic_ncols=True, smoothing=0.1)


def _emit(summary: dict[str, Any], as_json: bool, quiet: bool, human: Callable[[], str]) -> None:
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
    elif not quiet:
        click.echo(human())


def _fail(e: ImgprepError, at_once: bool = False, code: int | None = None) -> None:
    """Print the error on one line and exit with its code; ``at_once``: without running
    finalizers (threads may still wait on the network, which finalizers would abort on)."""
    click.echo(f"imgprep: {'error: ' if code is None else ''}{e}", err=True)
    code = e.exit_code if code is None else code
    if at_once:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="imgprep")
def cli() -> None:
    """Prepare ImageNet for data-parallel training: convert, verify, inspect.

    \b
    imgprep convert ILSVRC2012_img_train.tar -o /data/imagenet-shards
    imgprep convert ILSVRC2012_img_val.tar --labels LOC_val_solution.csv -o /data/imagenet-shards
    imgprep verify /data/imagenet-shards --split train
    """


def mode_option(f: F) -> F:
    return click.option("--mode", type=click.Choice(["replicate", "partition"]),
                        default="replicate", show_default=True,
                        help="replicate: every node holds every shard; partition: each node "
                             "holds only the shards its ranks read.")(f)


def nodes_options(f: F) -> F:
    """--num-nodes/--node-rank: name this process's node when no launcher does (plain loops)."""
    f = click.option("--node-rank", type=click.IntRange(0), default=None,
                     help="This node's index, with --num-nodes (overrides the launcher).")(f)
    return click.option("--num-nodes", type=click.IntRange(1), default=None,
                        help="Number of nodes, with --node-rank, when no launcher says it.")(f)


def _world(num_nodes: int | None, node_rank: int | None) -> Any:
    from imgprep.world import detect

    if (num_nodes is None) != (node_rank is None):
        raise click.UsageError("--num-nodes and --node-rank go together")
    if num_nodes is not None and node_rank is not None:
        if node_rank >= num_nodes:
            raise click.UsageError(f"--node-rank {node_rank} must be below --num-nodes {num_nodes}")
        return detect().with_nodes(num_nodes, node_rank)
    return detect()


def _node_path(path: Path, node_rank: int) -> Path:
    """``{node}`` in a path becomes the node rank (simulated nodes on one machine)."""
    return Path(str(path).replace("{node}", str(node_rank)))


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
@click.option("--classes", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Class list 'wnid name' per line (default: the 1000 ILSVRC2012 classes).")
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
            classes: Path | None, size: int, resize: str, filt: str, quality: int,
            max_pixels: int, exif_transpose: bool, shard_size: int, num_shards: int | None,
            seed: int, meta: bool, workers: int | None, max_errors: int, rank_mode: str,
            wait_timeout: float, num_nodes: int | None, node_rank: int | None, quiet: bool,
            as_json: bool) -> None:
    """Convert ILSVRC2012 images to 256 px RGB shards or a label list.

    INPUT is ILSVRC2012_img_train.tar (read in place), ILSVRC2012_img_val.tar, a folder of
    per-class tars, an extracted train/<wnid>/ tree, or a flat folder of images. Rerunning the
    same command after a crash or kill resumes and gives byte-identical output.

    Launched by mpirun, srun or torchrun, each rank converts its share and rank 0 writes the
    manifest once all are done; '{node}' in --out becomes the node rank.
    """
    from imgprep.convert import ConvertOptions
    from imgprep.convert import convert as run
    from imgprep.info import pil_info, pil_warning
    from imgprep.transform import TransformOptions

    try:
        world = _world(num_nodes, node_rank)
    except ImgprepError as e:
        _fail(e)
    lead = world.rank == 0
    if not quiet and lead and (warning := pil_warning(pil_info(check_avx2=False))):
        click.echo(f"imgprep: warning: {warning}", err=True)
    opts = ConvertOptions(
        input=input, out=_node_path(out, world.node_rank), format=fmt, split=split,
        labels=labels, classes=classes,
        transform=TransformOptions(size, resize, filt, quality, max_pixels, exif_transpose),
        shard_size=shard_size, num_shards=num_shards, seed=seed,
        workers=workers or max(1, (os.cpu_count() or 1) // world.local_world_size),
        max_errors=max_errors, meta=meta, mode=rank_mode, wait_timeout=wait_timeout,
    )
    bars: list[Any] = []

    def on_plan(plan: Any, remaining: int) -> None:
        bars.append(_progress(quiet or not lead, f"convert {plan.split}", remaining))

    try:
        summary = run(opts, world, progress=lambda n: bars[0].update(n), on_plan=on_plan)
    except ImgprepError as e:
        _fail(e)
    except KeyboardInterrupt:
        click.echo("imgprep: interrupted; rerun the same command to resume", err=True)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        for b in bars:
            b.close()

    def human() -> str:
        s = summary
        if s["role"] == "part":
            return (f"rank {s['rank']}: {s['tasks_mine']} of {s['tasks']} shards converted "
                    f"({s['samples']} samples) in {s['seconds']:.1f} s; rank 0 writes the manifest")
        lines = [
            f"{s['split']}: {s['samples']} samples in {s['tasks']} "
            f"{'shards' if fmt == 'shards' else 'chunks'} ({s['bytes'] / 1e6:.1f} MB) "
            f"from {s['images_listed']} images; {s['tasks_resumed']} resumed",
            f"{s['seconds']:.1f} s, {s['images_per_s']:.0f} images/s with {s['workers']} "
            "workers" + (f" on rank 0 of {s['world_size']}" if s["world_size"] > 1 else ""),
        ]
        if s["errors"]:
            lines.append(f"{s['errors']} images failed; see {s['error_log']}")
        lines.append(f"manifest: {s['manifest']}" if s["complete"] else
                     f"FAILED: {s['errors']} errors > --max-errors {max_errors}: no manifest "
                     "written; fix the inputs or raise --max-errors, then rerun to finish")
        return "\n".join(lines)

    _emit(summary, as_json, quiet, human)
    if not summary["complete"]:
        if quiet or as_json:
            click.echo(f"imgprep: error: {summary['errors']} images failed (> --max-errors "
                       f"{max_errors}); see {summary['error_log']}", err=True)
        sys.exit(EXIT_FAILED)


@cli.command("stage-to-node")
@click.option("--src", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Converted folder on the shared file server (holds the manifest).")
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
@click.option("--fanout", is_flag=True,
              help="With replicate: each node reads only its share from the file server and "
                   "gets the rest from the other nodes (see docs/staging.md).")
@click.option("--rendezvous", metavar="HOST:PORT", default=None,
              help="Where the node copiers meet for --fanout (node 0 listens there); needed "
                   "when no launcher says (--num-nodes/--node-rank loops).")
@nodes_options
@quiet_option
@json_option
def stage_to_node(src: Path, dst: Path, mode: str, split: str | None, seed: int, jobs: int,
                  verify_mode: str, timeout: float, fanout: bool, rendezvous: str | None,
                  num_nodes: int | None, node_rank: int | None, quiet: bool,
                  as_json: bool) -> None:
    """Copy the shards this node needs from the file server to local disk, verified.

    Run it in every process of the job (mpirun, srun, torchrun or a plain loop with
    --num-nodes/--node-rank): local rank 0 copies (or the first to take the lock in --dst
    when no launcher tells), the others wait for it. Reruns skip what is already staged.
    """
    from imgprep.errors import StageError
    from imgprep.stage import StageOptions
    from imgprep.stage import stage_to_node as run

    if fanout and mode != "replicate":
        raise click.UsageError("--fanout goes with --mode replicate (every node gets every shard)")
    if fanout:  # torch's C++ warnings would add stack traces to the one error line
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        world = _world(num_nodes, node_rank)
        opts = StageOptions(src=src, dst=_node_path(dst, world.node_rank), mode=mode,
                            split=split, seed=seed, jobs=jobs, verify=verify_mode,
                            timeout=timeout, fanout=fanout, rendezvous=rendezvous)
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
        _fail(e, at_once=fanout)
    except KeyboardInterrupt:
        _fail(StageError("interrupted; rerun the same command to resume"), at_once=fanout,
              code=EXIT_INTERRUPTED)
    _emit(summary, as_json, quiet, lambda: (
        f"node {summary['node_rank']}/{summary['num_nodes']} ({summary['role']}): "
        f"{summary['shards_copied']} shards copied, {summary['shards_skipped']} already there, "
        f"{summary['bytes_read'] / 1e6:.1f} MB read from the source"
        + (f", {summary['bytes_received'] / 1e6:.1f} MB from other nodes" if fanout else "")
        + f" in {summary['seconds']:.1f} s ({summary['mb_per_s']:.0f} MB/s); manifests: "
        f"{', '.join(summary['manifests'])}"))


@cli.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@split_option
@click.option("--decode/--no-decode", default=True, show_default=True,
              help="Decode every image (slow) or check checksums and structure only.")
@quiet_option
@json_option
def verify(path: Path, split: str | None, decode: bool, quiet: bool, as_json: bool) -> None:
    """Re-check a converted folder against its manifest, or a label-list file.

    Exit 0 when everything matches, 1 when problems were found (each printed on stderr).
    """
    from imgprep.verify import verify as run

    bar = _progress(quiet, "verify")
    try:
        rep = run(path, split, decode, tick=bar.update)
    except ImgprepError as e:
        bar.close()
        _fail(e)
    bar.close()
    for p in rep.problems:
        click.echo(f"imgprep: problem: {p}", err=True)
    summary = {"target": rep.target, "ok": rep.ok, "checked": rep.checked,
               "samples": rep.samples, "problems": rep.problems}
    _emit(summary, as_json, quiet, lambda: (
        f"{rep.target}: {'OK' if rep.ok else 'PROBLEMS'}: {rep.checked} checked, "
        f"{rep.samples} samples, {len(rep.problems)} problems"))
    if not rep.ok:
        sys.exit(EXIT_FAILED)


@cli.command()
@click.argument("path", required=False, type=click.Path(exists=True, path_type=Path))
@split_option
@click.option("--strict", is_flag=True,
              help="Exit 1 when PIL is not an AVX2 pillow-simd with libjpeg-turbo.")
@json_option
def info(path: Path | None, split: str | None, strict: bool, as_json: bool) -> None:
    """Versions, whether PIL is pillow-simd (AVX2, libjpeg-turbo), and a manifest summary."""
    from imgprep.info import pil_info, pil_warning, versions
    from imgprep.manifest import find_manifests, read_manifest

    out: dict[str, Any] = {"versions": versions(), "pil": pil_info()}
    if path is not None:
        try:
            paths = [path] if path.is_file() else (
                [path / f"{split}.json"] if split else find_manifests(path))
            if not paths:
                raise ImgprepError(f"no manifest in {path}: the conversion did not finish")
            out["manifests"] = []
            for p in paths:
                m = read_manifest(p)
                out["manifests"].append({
                    "path": str(p), "split": m.split, "format": m.format,
                    "samples": m.total_samples, "shards": len(m.shards), "bytes": m.total_bytes,
                    "classes": len(m.classes), "errors": m.errors, "mean": m.mean, "std": m.std,
                    "tool_version": m.tool_version, "options": m.options,
                })
        except ImgprepError as e:
            _fail(e)
    warning = pil_warning(out["pil"])
    out["warning"] = warning
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
        if strict and warning:
            sys.exit(EXIT_FAILED)
        return
    for k, v in out["versions"].items():
        click.echo(f"{k:12s} {v}")
    p = out["pil"]
    click.echo(f"{'PIL':12s} {p['pil_version']} ({'pillow-simd' if p['pillow_simd'] else 'stock'}"
               f", AVX2 build: {p.get('avx2_build')}, libjpeg-turbo: {p['libjpeg_turbo']} "
               f"{p['jpeg_version']})")
    for m in out.get("manifests", []):
        click.echo(f"{m['path']}: {m['split']} {m['format']}, {m['samples']} samples, "
                   f"{m['shards']} shards, {m['bytes'] / 1e6:.1f} MB, {m['classes']} classes, "
                   f"{m['errors']} errors; mean {m['mean']} std {m['std']}")
    if warning:
        click.echo(f"WARNING: {warning}", err=True)
        if strict:
            sys.exit(EXIT_FAILED)


@cli.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="PNG file to write.")
@click.option("-n", "count", type=click.IntRange(1, 1024), default=32, show_default=True,
              help="How many random samples.")
@click.option("--seed", type=int, default=0, show_default=True, help="Which random samples.")
@split_option
def preview(path: Path, output: Path, count: int, seed: int, split: str | None) -> None:
    """Write a contact sheet of random converted samples with their class names."""
    from imgprep.preview import make_sheet

    try:
        n = make_sheet(path, output, n=count, split=split, seed=seed)
    except ImgprepError as e:
        _fail(e)
    click.echo(f"{output}: {n} samples")


@cli.command("make-sample")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--classes", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option("--per-class", type=click.IntRange(1), default=12, show_default=True)
@click.option("--val", type=click.IntRange(0), default=50, show_default=True,
              help="Validation images.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--bad/--no-bad", default=False, show_default=True,
              help="Add a truncated JPEG and a zero-byte file to the train set.")
@json_option
def make_sample_cmd(out: Path, classes: int, per_class: int, val: int, seed: int, bad: bool,
                    as_json: bool) -> None:
    """Write a small fake ILSVRC2012 (nested train tar, val tar, ground truth) with its quirks."""
    from imgprep.sample import make_sample

    try:
        s = make_sample(out, classes, per_class, val, seed, bad)
    except ImgprepError as e:
        _fail(e)
    _emit(s, as_json, False, lambda: (
        f"{out}: {s['train_images']} train images in {len(s['classes'])} classes "
        f"({s['train_tar']}), {s['val_images']} val images ({s['val_tar']}) with devkit, "
        f"Caffe and Kaggle ground truth; quirks: {', '.join(s['quirks'])}"
        + (f"; bad: {', '.join(s['bad'])}" if s["bad"] else "")))


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="imgprep")


if __name__ == "__main__":
    main()
