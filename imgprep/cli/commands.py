"""The ``imgprep`` command line: parses options and calls library functions, nothing more.

The group, ``stage-to-node`` and ``make-sample`` are here; ``convert`` is in
``convert_command``, the commands that read a converted folder in ``folder_commands``.

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
from imgprep.cli.convert_command import convert
from imgprep.cli.folder_commands import index_cmd, info, preview, verify
from imgprep.cli.options import (
    EXIT_INTERRUPTED,
    SourceType,
    emit,
    fail,
    json_option,
    mode_option,
    node_path,
    nodes_options,
    quiet_option,
    split_option,
    world_of,
)
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


for _command in (convert, verify, info, preview, index_cmd):
    cli.add_command(_command)


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
    from imgprep.stage.options import StageOptions
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
    from dataclasses import asdict

    from imgprep.cli.report import stage_line

    emit(asdict(summary), as_json, quiet, lambda: stage_line(summary, fanout))


@cli.command("make-sample")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--form", default="ilsvrc", show_default=True, help="ilsvrc (image-net.org), "
              "kaggle, kaggle-zip, hf-parquet, hf-targz, wds, or in21k (ImageNet-21k's "
              "fall11_whole.tar and winter21_whole.tar.gz: the train images, skewed, half the "
              "classes outside ILSVRC2012): the same images in each.")
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
    from dataclasses import asdict

    from imgprep.cli.report import make_sample_line
    from imgprep.inputs.fakes import FAKES, SampleSpec, make_fake

    if form not in FAKES:
        raise click.BadParameter(f"not one of {', '.join(FAKES)}", param_hint="--form")
    try:
        s = make_fake(form, out, SampleSpec(classes=classes, per_class=per_class, val=val,
                                            seed=seed, bad=bad, test=test))
    except ImgprepError as e:
        fail(e)
    # the image-net.org form's summary is the one it always gave; the others name no archives
    left_out = ("form", "test_images", "inputs") if form == "ilsvrc" else ("train_tar", "val_tar")
    emit({k: v for k, v in asdict(s).items() if k not in left_out}, as_json, quiet,
         lambda: make_sample_line(s))


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="imgprep")


if __name__ == "__main__":
    main()
