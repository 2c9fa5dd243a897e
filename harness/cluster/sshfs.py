"""The file server: sshd in the server's namespace serving a folder over SFTP, and the nodes'
sshfs mounts of it.

- sshd runs with no configuration file (``-f /dev/null``), a host key and an authorized client
  key made for the run, and the ``internal-sftp`` subsystem; it listens on the server's address
  only.
- A mount is made through ``nsenter --net``: sshfs and its ssh live in the node's network
  namespace (so their traffic crosses the node's and the server's shaped links) while the mount
  itself sits in the machine's mount namespace, where every later command sees it. Mount points
  live under a scratch folder named with the run's prefix, so a later run can find and unmount
  what a killed one left. (Under Slurm, each node host makes its own mount, read-write, in
  its own mount namespace: ``sshfs_argv``, harness/cluster/hosts.py.)
- Bytes served are counted at the server: the kernel's ``rchar`` of the ``internal-sftp``
  processes (one per mount). They read the shards, plus about 0.1 % of SFTP requests; their
  ``wchar`` counts what the nodes wrote to the server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.cluster.netns import ClusterError, Topology, in_net, pids_in, run
from imgprep.procs import die_with_parent

SFTP_TITLE = b"internal-sftp"


@dataclass
class FileServer:
    """A running sshd exporting ``export`` from ``topo.server``."""

    topo: Topology
    export: Path
    keys: Path  # host key, client key and authorized_keys
    proc: subprocess.Popen[bytes]

    @property
    def client_key(self) -> Path:
        return self.keys / "client"


def _keygen(path: Path) -> None:
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)])


def start_server(topo: Topology, export: Path, keys: Path, log: Path) -> FileServer:
    """Start sshd in the server's namespace; returns once a client can connect."""
    keys.mkdir(parents=True, exist_ok=True)
    _keygen(keys / "host")
    _keygen(keys / "client")
    shutil.copyfile(keys / "client.pub", keys / "authorized_keys")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation folder
    opts = [f"ListenAddress={topo.server_ip}", "Port=22", f"HostKey={keys / 'host'}",
            "Subsystem=sftp internal-sftp", "PermitRootLogin=prohibit-password",
            f"AuthorizedKeysFile={keys / 'authorized_keys'}", "StrictModes=no",
            "PidFile=none", "UsePAM=no", "MaxStartups=100", "MaxSessions=100"]
    argv = in_net(topo.server) + ["/usr/sbin/sshd", "-D", "-e", "-f", "/dev/null"]
    for o in opts:
        argv += ["-o", o]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)
    server = FileServer(topo, export, keys, proc)
    probe = f"import socket; socket.create_connection(('{topo.server_ip}', 22), timeout=1)"
    for _ in range(50):
        if proc.poll() is not None:
            raise ClusterError(f"sshd exited ({proc.returncode}): {log.read_text()[-500:]}")
        ok = subprocess.run(in_net(topo.node(0)) + [sys.executable, "-c", probe],
                            capture_output=True, timeout=10).returncode == 0
        if ok:
            return server
        time.sleep(0.1)
    stop_server(server)
    raise ClusterError(f"sshd in {topo.server} did not accept connections; see {log}")


def stop_server(server: FileServer) -> None:
    if server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(timeout=5)


def sshfs_argv(server: FileServer, mountpoint: Path, read_only: bool = True) -> list[str]:
    """The sshfs command mounting the export at ``mountpoint`` (run it in a node's namespace)."""
    opts = (f"{'ro' if read_only else 'rw'},IdentityFile={server.client_key},"
            "StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,BatchMode=yes,ConnectTimeout=10")
    return ["sshfs", "-o", opts, f"root@{server.topo.server_ip}:{server.export}",
            str(mountpoint)]


def mount(server: FileServer, k: int, mountpoint: Path) -> None:
    """Mount the export read-only at ``mountpoint`` from node ``k``'s namespace."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    run(in_net(server.topo.node(k)) + sshfs_argv(server, mountpoint), timeout=30)


def unmount(mountpoint: Path) -> None:
    """Unmount, lazily if the file system is busy or its daemon is gone."""
    run(["fusermount3", "-u", str(mountpoint)], check=False, timeout=15)
    if str(mountpoint) in sshfs_mounts(str(mountpoint)):
        run(["umount", "-l", str(mountpoint)], check=False, timeout=15)


def sshfs_mounts(under: str) -> list[str]:
    """Mount points of sshfs file systems whose path starts with ``under``."""
    with open("/proc/self/mounts") as f:
        rows = [line.split() for line in f]
    return [r[1] for r in rows if len(r) > 2 and r[2] == "fuse.sshfs" and r[1].startswith(under)]


def mount_root(prefix: str) -> str:
    """Where a run with ``prefix`` makes its scratch folders (and so its mount points)."""
    return os.path.join(tempfile.gettempdir(), f"{prefix}cluster-")


def served_io(topo: Topology) -> tuple[int, int]:
    """Bytes the server's SFTP processes have read and written so far (kernel rchar and
    wchar, summed): what the nodes read from the server, and what they wrote to it."""
    read = written = 0
    for pid in pids_in(topo.server):
        with contextlib.suppress(OSError, StopIteration):  # it may exit while we look
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if SFTP_TITLE not in f.read():
                    continue
            with open(f"/proc/{pid}/io") as f:
                io = dict(line.split(":", 1) for line in f)
            read, written = read + int(io["rchar"]), written + int(io["wchar"])
    return read, written


def served_bytes(topo: Topology) -> int:
    """Bytes the server's SFTP processes have read so far (kernel rchar, summed)."""
    return served_io(topo)[0]
