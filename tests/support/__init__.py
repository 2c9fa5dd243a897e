"""What the tests build and check, in one place: paths, images and tars made on the fly, a
converted folder, child processes and their error lines. Fixtures live in ``conftest.py``."""

from __future__ import annotations

from tests.support.converted import convert_sample
from tests.support.images import (
    devkit_archive,
    encode,
    jpeg,
    nested_images,
    photo,
    published_label,
    published_val_txt,
    restart_out_of_order,
    tar_bytes,
    write_tar,
)
from tests.support.paths import REAL_DATA, REPO
from tests.support.procs import (
    LAUNCHER_PREFIXES,
    LAUNCHER_VARS,
    clean_env,
    fanout_nodes,
    feed_pipe,
    free_port,
    interruptible,
    is_launcher_var,
    mpirun,
    mpirun_cmd,
    one_line,
    one_line_error,
    one_line_problem,
    outcomes,
    rehearse,
    steps_by_name,
    tmp_leftovers,
    torchrun_env,
)

__all__ = [
    "LAUNCHER_PREFIXES", "LAUNCHER_VARS", "REAL_DATA", "REPO", "clean_env", "convert_sample",
    "devkit_archive", "encode", "fanout_nodes", "feed_pipe", "free_port", "interruptible",
    "is_launcher_var", "jpeg", "mpirun", "mpirun_cmd", "nested_images", "one_line",
    "one_line_error", "one_line_problem", "outcomes", "photo", "published_label",
    "published_val_txt", "rehearse", "restart_out_of_order", "steps_by_name", "tar_bytes",
    "tmp_leftovers",
    "torchrun_env", "write_tar",
]
