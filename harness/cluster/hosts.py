"""Hosts in the box: a member's network namespace with a host name, /etc/hosts and mounts of
its own, as a real machine has.

A host is one holder process: ``nsenter --net`` into the member's network namespace, then
``unshare --uts --mount --propagation private`` and a short shell script that sets the host
name, binds the box's hosts file over /etc/hosts, makes the host's mounts (the file server at
one path, the node's own disk at another), prints ``ready`` and execs ``sleep`` for at most the
run's lifetime. Everything the host runs (daemons and, through them, jobs) starts with
``nsenter -t HOLDER --net --uts --mount``: it resolves names as that host, sees its mounts and
lives in its network namespace, where the box's teardown (``netns.remove``) ends it by pid.

Nothing reaches the machine: mounts are private to the host's mount namespace and vanish with
its last process, the host name is its UTS namespace's, and the holder dies with its parent
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.cluster.netns import ClusterError, in_net
from harness.cluster.procs import die_with_parent
from imgprep.procs import readable


@dataclass
class Host:
    """A running host: its name and address, the namespace it lives in, its holder."""

    name: str
    addr: str
    ns: str
    holder: subprocess.Popen[str]
    log: Path

    def argv(self, cwd: Path | str = "/") -> list[str]:
        """argv prefix running a command on this host, in ``cwd``."""
        return ["nsenter", "-t", str(self.holder.pid), "--net", "--uts", "--mount",
                f"--wd={cwd}"]


def write_hosts(path: Path, hosts: Sequence[tuple[str, str]]) -> Path:
    """The box's /etc/hosts: localhost and every (name, address)."""
    lines = ["127.0.0.1 localhost", *(f"{addr} {name}" for name, addr in hosts)]
    path.write_text("\n".join(lines) + "\n")
    return path


def start_host(ns: str, name: str, addr: str, hosts: Path, setup: Sequence[Sequence[str]],
               log: Path, lifetime: float, timeout: float = 30.0) -> Host:
    """Start the holder of host ``name`` in namespace ``ns``; ``setup`` are the commands that
    make its mounts. Returns once they all succeeded (or raises with the holder's log)."""
    script = "\n".join([
        "set -e", f"hostname {shlex.quote(name)}", f"mount --bind {shlex.quote(str(hosts))} "
        "/etc/hosts", *(shlex.join(argv) for argv in setup), "echo ready",
        f"exec sleep {int(lifetime)}"])
    argv = in_net(ns) + ["unshare", "--uts", "--mount", "--propagation", "private", "--",
                         "sh", "-c", script]
    with open(log, "w") as err:
        holder = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True,
                                  stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    host = Host(name, addr, ns, holder, log)
    deadline = time.monotonic() + timeout
    line = ""
    while holder.stdout is not None and (left := deadline - time.monotonic()) > 0:
        if readable(holder.stdout, left):
            line = holder.stdout.readline()
            break
    if line.strip() != "ready":
        stop_host(host)
        raise ClusterError(f"host {name} in {ns} did not come up within {timeout:.0f} s: "
                           f"{log.read_text().strip()[-500:] or '(nothing on stderr)'}")
    return host


def stop_host(host: Host) -> None:
    """End the holder (what else runs on the host is ended by pid by its owner)."""
    if host.holder.poll() is None:
        host.holder.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        host.holder.wait(timeout=5)
    if host.holder.stdout is not None:
        host.holder.stdout.close()
