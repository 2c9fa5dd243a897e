"""Child processes that never outlive their parent, and waiting on their pipes.

Convert's workers, the listing pool and the cluster benchmark's children all ask Linux to
SIGKILL them when their parent dies, so a ``kill -9`` of a command leaves no orphan holding
files, ports or CPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import selectors
import signal
from typing import IO, Any

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (call it in the child: a pool
    initializer, or ``preexec_fn`` before an exec). With ``parent`` (the parent's pid, read
    before the fork) a parent that died between the fork and this call is caught too: the
    child exits at once."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def readable(pipe: int | IO[Any], timeout: float) -> bool:
    """Whether ``pipe`` (a file or descriptor) has data (or EOF) within ``timeout`` s.

    poll/epoll, not ``select()``: a process with many files open hands out descriptors
    above 1023, which ``select()`` refuses."""
    with selectors.DefaultSelector() as sel:
        sel.register(pipe, selectors.EVENT_READ)
        return bool(sel.select(max(0.0, timeout)))
