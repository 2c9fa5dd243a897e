"""What every ``imgprep`` command shares: its options (each defined once), the node a
process stands for, progress bars, summaries, the one-line error exit, and where the
library's warnings go (``--quiet`` sets it up: ``imgprep.cli.logs``)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from imgprep.cli.logs import configure_logging
from imgprep.errors import ImgprepError
from imgprep.job.assign import MODES
from imgprep.job.world import World
from imgprep.shards.manifest import SPLITS

F = TypeVar("F", bound=Callable[..., Any])
EXIT_FAILED, EXIT_FATAL, EXIT_INTERRUPTED = 1, 3, 130


def _quiet_logs(ctx: click.Context, param: click.Parameter, quiet: bool) -> bool:
    configure_logging(quiet)  # every command has --quiet: one place sets up the logger
    return quiet


def quiet_option(f: F) -> F:
    return click.option("--quiet", "-q", is_flag=True, callback=_quiet_logs,
                        help="No progress bar and no human-readable summary.")(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print a JSON summary on stdout.")(f)


def split_option(f: F) -> F:
    return click.option("--split", type=click.Choice(SPLITS), default=None,
                        help="Which split (default: inferred from the input or the folder).")(f)


def workers_option(f: F) -> F:
    return click.option("--workers", "-j", type=click.IntRange(1, 1024), default=None,
                        show_default="the CPUs this rank may use",
                        help="Parallel worker processes (per rank).")(f)


class SourceType(click.ParamType):
    """``--src`` of stage-to-node: an existing folder (a Path) or a source URL (a str,
    imgprep.stage.remote)."""

    name = "folder|URL"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Path | str:
        from imgprep.stage.remote import check_url, is_url

        if isinstance(value, str) and is_url(value):
            try:
                return check_url(value)
            except ValueError as e:
                self.fail(str(e), param, ctx)
        folder = click.Path(exists=True, file_okay=False, path_type=Path)
        path: Path = folder.convert(value, param, ctx)
        return path


def progress_bar(quiet: bool, desc: str, total: int | None = None) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="img", file=sys.stderr, disable=quiet,
                dynamic_ncols=True, smoothing=0.1)


def emit(summary: dict[str, Any], as_json: bool, quiet: bool, human: Callable[[], str]) -> None:
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
    elif not quiet:
        click.echo(human())


def fail(e: ImgprepError, at_once: bool = False, code: int | None = None) -> NoReturn:
    """Print the error on one line and exit with its code; ``at_once``: without running
    finalizers (threads may still wait on the network, which finalizers would abort on)."""
    click.echo(f"imgprep: {'error: ' if code is None else ''}{e}", err=True)
    code = e.exit_code if code is None else code
    if at_once:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def mode_option(f: F) -> F:
    return click.option("--mode", type=click.Choice(MODES),
                        default="replicate", show_default=True,
                        help="replicate: every node holds every shard; partition: each node "
                             "holds only the shards its ranks read.")(f)


def nodes_options(f: F) -> F:
    """--num-nodes/--node-rank: name this process's node when no launcher does (plain loops)."""
    f = click.option("--node-rank", type=click.IntRange(0), default=None,
                     help="This node's index, with --num-nodes (overrides the launcher).")(f)
    return click.option("--num-nodes", type=click.IntRange(1), default=None,
                        help="Number of nodes, with --node-rank, when no launcher says it.")(f)


def world_of(num_nodes: int | None, node_rank: int | None) -> World:
    from imgprep.job.world import detect

    if (num_nodes is None) != (node_rank is None):
        raise click.UsageError("--num-nodes and --node-rank go together")
    if num_nodes is not None and node_rank is not None:
        if node_rank >= num_nodes:
            raise click.UsageError(f"--node-rank {node_rank} must be below --num-nodes {num_nodes}")
        return detect().with_nodes(num_nodes, node_rank)
    return detect()


def node_path(path: Path, node_rank: int) -> Path:
    """``{node}`` in a path becomes the node rank (simulated nodes on one machine)."""
    return Path(str(path).replace("{node}", str(node_rank)))
