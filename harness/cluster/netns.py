"""Network namespaces for the cluster in a box: a bridge, a file server and N nodes.

Rules kept here so that the machine's own network is never touched:

- Nothing is added to the root network namespace. Every namespace is named with the run's
  prefix; links, addresses and qdiscs are made inside them (``ip -n NS``, ``tc -n NS``); each
  veth pair is created inside the bridge's namespace with its peer placed straight into the
  member's namespace.
- Addresses are in 127.100.0.0/24 on the veth links, with ``route_localnet`` set in every
  namespace, so they cannot clash with a real network.
- Each member's link is shaped in both directions with a token bucket (tbf): its own egress
  and the bridge port's egress toward it. The server's link is slower than the nodes'.
- Every command runs with a timeout; :func:`remove` ends the processes still living in the
  namespaces (by pid, from ``ip netns pids``) and deletes the namespaces.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

from imgprep import ImgprepError

SUBNET = "127.100.0"
NETNS_DIR = "/var/run/netns"
BRIDGE = "br0"
PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,7}-$")


class ClusterError(ImgprepError, RuntimeError):
    """The cluster could not be built or a step in it failed; the message says which."""


@dataclass(frozen=True)
class Topology:
    """Names, addresses and link rates of one cluster in a box."""

    prefix: str  # every namespace name starts with it, e.g. "ipc-"
    nodes: int
    server_mbit: int  # the file server's link
    node_mbit: int  # each node's link (node to node and node to server)

    def __post_init__(self) -> None:
        if not PREFIX_RE.match(self.prefix):
            raise ValueError(f"prefix {self.prefix!r}: use a few lowercase letters/digits and "
                             "a trailing '-', such as 'ipc-'")
        if not 1 <= self.nodes <= 64 or self.server_mbit < 1 or self.node_mbit < 1:
            raise ValueError("nodes must be 1..64 and link rates positive")

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def server(self) -> str:
        return f"{self.prefix}srv"

    def node(self, k: int) -> str:
        return f"{self.prefix}n{k}"

    @property
    def server_ip(self) -> str:
        return f"{SUBNET}.1"

    def node_ip(self, k: int) -> str:
        return f"{SUBNET}.{10 + k}"

    def members(self) -> list[tuple[str, str, int]]:
        """(namespace, address, link Mbit/s) of the server and of every node."""
        return [(self.server, self.server_ip, self.server_mbit)] + [
            (self.node(k), self.node_ip(k), self.node_mbit) for k in range(self.nodes)]


def run(argv: Sequence[str], timeout: float = 30.0, check: bool = True) -> str:
    """Run a command with a timeout; its stdout, or a ClusterError naming it and its stderr."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise ClusterError(f"{' '.join(argv)} did not finish within {timeout:.0f} s") from e
    except OSError as e:
        raise ClusterError(f"cannot run {argv[0]}: {e.strerror}") from e
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed (exit {done.returncode}): "
                           f"{done.stderr.strip()[-500:]}")
    return done.stdout


def in_net(ns: str) -> list[str]:
    """The argv prefix that runs a command in ``ns``'s network namespace only (the mount
    namespace stays the machine's, so FUSE mounts made this way are seen by later commands)."""
    return ["nsenter", f"--net={NETNS_DIR}/{ns}"]


def namespaces(prefix: str) -> list[str]:
    """Network namespaces whose names start with ``prefix``."""
    names = [line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line]
    return sorted(n for n in names if n.startswith(prefix))


def _sysctl(ns: str, *settings: str) -> None:
    run(in_net(ns) + ["sysctl", "-qw", *settings])


def shape(ns: str, dev: str, mbit: int) -> None:
    """A token-bucket limit of ``mbit`` Mbit/s on ``dev``'s egress, inside ``ns``."""
    burst = max(64 * 1024, mbit * 1_000_000 // 8 // 100)  # 10 ms worth, at least 64 KiB
    run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{mbit}mbit",
         "burst", str(burst), "latency", "50ms"])


def build(topo: Topology) -> None:
    """Create the namespaces, the bridge, one shaped veth link per member, and addresses."""
    for ns in [topo.bridge] + [m[0] for m in topo.members()]:
        run(["ip", "netns", "add", ns])
    br = ["ip", "-n", topo.bridge, "link"]
    run(br + ["add", BRIDGE, "type", "bridge"])
    run(br + ["set", BRIDGE, "up"])
    for ns, addr, mbit in topo.members():
        port = "v-" + ns[len(topo.prefix):]
        run(br + ["add", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
        run(br + ["set", port, "master", BRIDGE])
        run(br + ["set", port, "up"])
        _sysctl(ns, "net.ipv4.conf.all.route_localnet=1", "net.ipv4.conf.eth0.route_localnet=1")
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
        shape(ns, "eth0", mbit)  # what the member sends
        shape(topo.bridge, port, mbit)  # what it receives


def pids_in(ns: str) -> list[int]:
    """Processes whose network namespace is ``ns``."""
    out = run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]


def link_bytes(pid: int, dev: str = "eth0") -> tuple[int, int]:
    """Bytes received and sent so far on ``dev`` of the namespace process ``pid`` lives in."""
    with open(f"/proc/{pid}/net/dev") as f:
        row = next(x for x in f if x.strip().startswith(f"{dev}:"))
    cols = row.split(":", 1)[1].split()
    return int(cols[0]), int(cols[8])


def stop_pids(pids: Sequence[int], grace: float = 3.0) -> None:
    """SIGTERM these processes, then SIGKILL whichever still lives after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                live.append(pid)
        deadline = time.monotonic() + grace
        while live and time.monotonic() < deadline:
            live = [p for p in live if os.path.exists(f"/proc/{p}") and not _zombie(p)]
            time.sleep(0.05)
        if not live:
            return
        pids = live


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def remove(prefix: str) -> None:
    """End every process in the prefix's namespaces, then delete the namespaces."""
    names = namespaces(prefix)
    stop_pids([p for ns in names for p in pids_in(ns)])
    for ns in names:
        run(["ip", "netns", "del", ns], check=False)
