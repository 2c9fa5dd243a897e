"""A real Slurm cluster over the box's namespaces: munged, slurmctld, one slurmd per node.

- **Hosts** (harness/cluster/hosts.py). The server's namespace becomes host ``head``: the file
  server, the controller and the login host where ``sbatch`` and ``srun`` are typed. Node k's
  becomes host ``nodek``. One hosts file names them all on the box's 127.100.0.x links. Every
  host sees the same two paths with different things behind them, as on a cluster's /shared
  and /local: ``shared`` is the file server (the export itself on the head; an sshfs mount,
  read-write, through the node's and the server's shaped links on a node) and ``local`` is the
  node's own disk (a folder of its own, bound there). A node also has a /dev/shm of its own.
- **munged**: one, on the head, shared by every daemon and command (its socket is a path, which
  every namespace reaches), with its own key, socket, pid, log and seed files under the run's
  folder: never the machine's /etc/munge key or /run/munge socket. Slurm finds it through
  ``AuthInfo=socket=...``.
- **slurm.conf**, written for the run (:func:`slurm_conf`): no cgroups (``proctrack/linuxproc``,
  ``task/none``), root runs everything, every file under the run's folder (state; spool, pid,
  log and TmpFS per node through ``%n``), nodes of ``CPUS`` CPUs each (they share the machine)
  with explicit ``NodeAddr``/``NodeHostname``, ``ReturnToService=2``, ``MpiDefault=none``. The
  ports are Slurm's defaults: each daemon listens in a namespace made for this run, where no
  other program holds a port. Every Slurm command gets ``SLURM_CONF``.
- **Daemons**: ``slurmctld -D`` on the head, ``slurmd -D -N nodek`` on each node host, each
  with a timeout-bounded wait until every node reports idle.
- **Teardown** (every exit path: this is a context manager inside the box's, whose signal
  handling turns SIGINT/SIGTERM into an exception): the daemons by pid (slurmd, slurmctld,
  munged), then whatever still runs on the node hosts (job steps and their tasks, sshfs), then
  the holders. The box then deletes the namespaces, and with them any leftover.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.cluster.box import Box
from harness.cluster.hosts import Host, start_host, stop_host, write_hosts
from harness.cluster.netns import ClusterError, pids_in, run, stop_pids
from harness.cluster.procs import REPO, Started, die_with_parent
from harness.cluster.sshfs import sshfs_argv

HEAD = "head"
CPUS = 2  # per node; the nodes share the machine's cores
# The box's own quirks, set for every job as a site would in its environment modules: its
# addresses are in 127.0.0.0/8, which Open MPI's TCP transport skips as loopback unless told
# which interface to use; and it runs jobs as root, which mpirun refuses unless allowed.
BOX_ENV = {"OMPI_MCA_btl_tcp_if_include": "eth0", "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
DONE_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
               "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def node_name(k: int) -> str:
    return f"node{k}"


@dataclass(frozen=True)
class Layout:
    """Where a run's Slurm and munge files live (all under ``root``)."""

    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def hosts(self) -> Path:
        return self.root / "etc" / "hosts"

    @property
    def munge(self) -> Path:
        return self.root / "munge"

    @property
    def socket(self) -> Path:
        return self.munge / "munge.socket"

    @property
    def log(self) -> Path:
        return self.root / "log"

    def make(self, nodes: int) -> None:
        for d in ("etc", "state", "run", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        for k in range(nodes):
            (self.root / "spool" / node_name(k)).mkdir(parents=True, exist_ok=True)
            (self.root / "tmp" / node_name(k)).mkdir(parents=True, exist_ok=True)
        self.munge.mkdir(mode=0o755, exist_ok=True)
        _searchable(self.munge)
        key = self.munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        # every task's TMPDIR is its node's own folder, as on machines with a /tmp each (MPI's
        # session folders and Python's temporary files land there, not in the machine's /tmp)
        self.task_prolog.write_text(
            f'#!/bin/sh\necho "export TMPDIR={self.root / "tmp"}/$SLURMD_NODENAME"\n')
        self.task_prolog.chmod(0o755)

    @property
    def task_prolog(self) -> Path:
        return self.root / "etc" / "task-prolog.sh"


def _searchable(folder: Path) -> None:
    """munged wants every folder on its socket's path searchable by all (mkdtemp makes 0700
    ones): add o+x to those of ours, up to the temporary folder."""
    top = Path(tempfile.gettempdir()).resolve()
    for d in [folder.resolve(), *folder.resolve().parents]:
        if d == top or top not in d.parents:
            break
        d.chmod(d.stat().st_mode | 0o011)


def slurm_conf(layout: Layout, head_addr: str, nodes: Sequence[tuple[str, str]]) -> str:
    """A minimal slurm.conf for the box: ``nodes`` are (name, address)."""
    r = layout.root
    lines = [
        "ClusterName=box", f"SlurmctldHost={HEAD}({head_addr})",
        "SlurmctldPort=6817", "SlurmdPort=6818",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={layout.socket}",
        "SlurmUser=root", "SlurmdUser=root",
        f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool' / '%n'}",
        f"TmpFS={r / 'tmp' / '%n'}",  # per node: srun --mpi=pmix puts its client folders there
        f"TaskProlog={layout.task_prolog}",
        f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={r / 'run' / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={layout.log / 'slurmctld.log'}",
        f"SlurmdLogFile={layout.log / 'slurmd-%n.log'}",
        "SlurmctldDebug=info", "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none", "MailProg=/bin/true",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",  # CPUs per node below the machine's: fine
        "MpiDefault=none", "ReturnToService=2", "KillOnBadExit=1", "KillWait=5",
        "SlurmdTimeout=60", "InactiveLimit=0", "MinJobAge=600",
        *(f"NodeName={name} NodeAddr={addr} NodeHostname={name} CPUs={CPUS} State=UNKNOWN"
          for name, addr in nodes),
        "PartitionName=box Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


@dataclass
class Job:
    """A finished batch job, as scontrol reported it."""

    job_id: int
    state: str
    exit_code: str
    nodes: list[str]
    seconds: float  # from submission until Slurm reported it done
    output: str  # the batch script's stdout and stderr


class Slurm(Started):
    """A Slurm cluster on the box's server and on one node per disk, up on ``__enter__``,
    torn down on ``__exit__``. ``shared`` and ``local`` are the two paths every host sees
    (the file server; node k's own disk, backed by ``disks[k]``)."""

    def __init__(self, box: Box, root: Path, shared: Path, local: Path,
                 disks: Sequence[Path], lifetime: float, timeout: float = 60.0) -> None:
        if box.server is None:
            raise ClusterError("the box is not open")
        self.box, self.server = box, box.server
        self.layout = Layout(root)
        self.shared, self.local, self.disks = shared, local, list(disks)
        self.lifetime, self.timeout = lifetime, timeout
        self.head: Host | None = None
        self.nodes: list[Host] = []
        self.daemons: list[tuple[str, subprocess.Popen[bytes]]] = []

    @property
    def node_names(self) -> list[str]:
        return [node_name(k) for k in range(len(self.disks))]

    def _start(self) -> None:
        topo, lay = self.box.topo, self.layout
        lay.make(len(self.disks))
        names = [(HEAD, topo.server_ip)] + [(node_name(k), topo.node_ip(k))
                                             for k in range(len(self.disks))]
        write_hosts(lay.hosts, names)
        lay.conf.write_text(slurm_conf(lay, topo.server_ip, names[1:]))
        for path in (self.shared, self.local, *self.disks):
            path.mkdir(parents=True, exist_ok=True)
        self._start_head()
        for k in range(len(self.disks)):
            self._start_node(k)
        self._wait(self._all_idle, f"{len(self.disks)} idle nodes", "slurmctld")

    def _start_head(self) -> None:
        """The head host (the export at ``shared``), munged, then slurmctld."""
        lay = self.layout
        self.head = start_host(self.box.topo.server, HEAD, self.box.topo.server_ip, lay.hosts,
                               [["mount", "--bind", str(self.server.export), str(self.shared)]],
                               lay.log / "host-head.log", self.lifetime)
        m = lay.munge
        self._daemon(self.head, "munged", [
            "munged", "-F", f"--socket={lay.socket}", f"--key-file={m / 'munge.key'}",
            f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}",
            f"--seed-file={m / 'munged.seed'}"])
        self._wait(lambda: lay.socket.exists(), "munged's socket", "munged")
        self._daemon(self.head, "slurmctld", ["slurmctld", "-D", "-f", str(lay.conf)])

    def _start_node(self, k: int) -> None:
        """Node ``k``'s host (its disk at ``local``, the file server at ``shared``), slurmd."""
        name, topo = node_name(k), self.box.topo
        host = start_host(topo.node(k), name, topo.node_ip(k), self.layout.hosts, [
            ["mount", "--bind", str(self.disks[k]), str(self.local)],
            # a /dev/shm of its own: MPI's shared-memory segments are named by host and local
            # rank, not by job, so a crashed step's could meet the next one's
            ["mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/dev/shm"],
            sshfs_argv(self.server, self.shared, read_only=False)],
            self.layout.log / f"host-{name}.log", self.lifetime)
        self.nodes.append(host)
        self._daemon(host, f"slurmd-{name}", ["slurmd", "-D", "-N", name, "-f",
                                              str(self.layout.conf)])

    def _daemon(self, host: Host, name: str, argv: list[str]) -> None:
        with open(self.layout.log / f"{name}.out", "wb") as out:
            proc = subprocess.Popen(host.argv() + ["env", f"SLURM_CONF={self.layout.conf}",
                                                   *argv],
                                    stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        self.daemons.append((name, proc))

    def _wait(self, ready: Callable[[], bool], what: str, log: str) -> None:
        """Poll ``ready`` until true; a ClusterError naming ``what`` after the timeout, or
        at once if a daemon died (with its last words)."""
        deadline = time.monotonic() + self.timeout
        while not ready():
            dead = [(n, p) for n, p in self.daemons if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                name = dead[0][0] if dead else log
                raise ClusterError(f"Slurm in the box: no {what} within {self.timeout:.0f} s"
                                   f"{f' ({name} exited)' if dead else ''}: "
                                   f"{self.daemon_log(name)}")
            time.sleep(0.3)

    def daemon_log(self, name: str) -> str:
        """The last lines a daemon wrote (for error messages)."""
        try:
            text = (self.layout.log / f"{name}.out").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-4:]) or "(empty log)"

    def _all_idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
        states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
        return all(states.get(n) == "idle" for n in self.node_names)

    def command(self, argv: Sequence[str], cwd: Path = REPO) -> list[str]:
        """argv running ``argv`` on the head (the login host), with this run's SLURM_CONF."""
        if self.head is None:
            raise ClusterError("Slurm in the box is not up")
        return self.head.argv(cwd) + ["env", f"SLURM_CONF={self.layout.conf}", *argv]

    def run(self, argv: Sequence[str], timeout: float = 30.0, check: bool = True) -> str:
        return run(self.command(argv), timeout=timeout, check=check)

    def job_info(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, ExitCode, NodeList, ...)."""
        out = self.run(["scontrol", "show", "job", "-o", str(job_id)])
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def sbatch(self, script: Path, options: Sequence[str], env: dict[str, str],
               output: Path, timeout: float,
               on_line: Callable[[str], None] | None = None) -> Job:
        """Submit ``script`` from the head and wait (bounded) for it to end; ``on_line`` sees
        each line of the job's output as it appears. A job still running at the timeout is
        cancelled and reported."""
        t0 = time.monotonic()
        job_id = self._submit(script, options, env, output)
        seen, asked = 0, 0.0
        info: dict[str, str] = {}
        while time.monotonic() - t0 < timeout:
            seen = _feed(output, seen, on_line)  # the output every 0.2 s, Slurm every 1 s
            if time.monotonic() - asked >= 1.0:
                info, asked = self.job_info(job_id), time.monotonic()
                if info.get("JobState") in DONE_STATES:
                    break
            time.sleep(0.2)
        else:
            self.run(["scancel", str(job_id)], check=False)
            raise ClusterError(f"job {job_id} did not end within {timeout:.0f} s; cancelled. "
                               f"Its output: {_tail(output)}")
        _feed(output, seen, on_line)
        nodes = self.run(["scontrol", "show", "hostnames", info.get("NodeList", "")])
        return Job(job_id, info["JobState"], info.get("ExitCode", "?"), nodes.split(),
                   round(time.monotonic() - t0, 2), _tail(output, 100_000))

    def _submit(self, script: Path, options: Sequence[str], env: dict[str, str],
                output: Path) -> int:
        """``sbatch`` on the head with ``env`` (the job inherits it, as Slurm does); job id."""
        argv = self.command(["sbatch", "--parsable", f"--output={output}", *options,
                             str(script)])
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)
        except subprocess.TimeoutExpired as e:
            raise ClusterError(f"sbatch {script.name} did not answer within 30 s") from e
        if done.returncode != 0:
            raise ClusterError(f"sbatch {script.name} failed: {done.stderr.strip()[-500:]}")
        return int(done.stdout.strip().split(";")[0])

    def close(self) -> None:
        """Stop the daemons by pid, then what still runs on the nodes, then the hosts."""
        for _, proc in reversed(self.daemons):
            if proc.poll() is None:
                proc.terminate()
        for _, proc in reversed(self.daemons):
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
        for host in self.nodes:  # job steps, tasks and sshfs: nothing else lives there
            stop_pids(pids_in(host.ns))
        for host in [*self.nodes, *([self.head] if self.head else [])]:
            stop_host(host)
        self.daemons, self.nodes, self.head = [], [], None


def _feed(path: Path, seen: int, on_line: Callable[[str], None] | None) -> int:
    """Hand the complete lines of ``path`` past byte ``seen`` to ``on_line``; the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(seen)
            data = f.read()
    except FileNotFoundError:
        return seen
    end = data.rfind(b"\n") + 1
    if on_line is not None:
        for line in data[:end].decode(errors="replace").splitlines():
            on_line(line)
    return seen + end


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no output)"
