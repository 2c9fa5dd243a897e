"""An S3 endpoint on the cluster's file server: moto's S3 server in the server's namespace.

``with S3Store(box, folder, port, timeout) as store:`` starts ``moto.server`` inside the
server's network namespace, bound to the server's address (so what it sends to the nodes
crosses the server's shaped link), ties it to this process (PR_SET_PDEATHSIG), uploads the
converted ``folder`` into a bucket with boto3 from inside the same namespace (over its
loopback, not the link), and on exit kills the server by its pid. Nothing is added to the
machine's own network namespace. ``store.sent()`` is the bytes sent so far on the server's
link (its ``eth0`` tx counter, headers included), read through the server process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.cluster import netns
from harness.cluster.box import Box
from harness.cluster.netns import ClusterError
from harness.cluster.procs import Started, child_env
from imgprep.procs import die_with_parent

BUCKET, PREFIX = "imgprep-cluster", "set/"
KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

# Run inside the server's namespace: wait for the endpoint, make the bucket, upload the folder.
UPLOAD = """
import sys, time
from pathlib import Path
import boto3
url, bucket, prefix, folder = sys.argv[1:5]
s3 = boto3.client("s3", endpoint_url=url)
deadline = time.monotonic() + 60
while True:
    try:
        s3.create_bucket(Bucket=bucket)
        break
    except Exception:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
for p in sorted(Path(folder).iterdir()):
    if p.is_file():
        s3.upload_file(str(p), bucket, prefix + p.name)
"""


class S3Store(Started):
    """moto's S3 server on the file server, holding ``folder`` at :attr:`url`."""

    def __init__(self, box: Box, folder: Path, port: int, timeout: float) -> None:
        self.box, self.folder, self.timeout = box, folder, timeout
        self.endpoint = f"http://{box.topo.server_ip}:{port}"
        self.url = f"s3://{BUCKET}/{PREFIX}"
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        """The AWS variables a node process needs to reach the store."""
        return {**KEYS, "AWS_ENDPOINT_URL": self.endpoint, "AWS_CONFIG_FILE": "/dev/null",
                "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
                "NO_PROXY": self.box.topo.server_ip, "no_proxy": self.box.topo.server_ip}

    def _start(self) -> None:
        net = netns.in_net(self.box.topo.server)
        with open(self.box.scratch / "moto.log", "wb") as log:  # the server holds its own copy
            self.proc = subprocess.Popen(
                net + [sys.executable, "-m", "moto.server", "-H", self.box.topo.server_ip,
                       "-p", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=child_env(), preexec_fn=die_with_parent)
        try:
            done = subprocess.run(net + [sys.executable, "-c", UPLOAD, self.endpoint, BUCKET,
                                         PREFIX, str(self.folder)],
                                  capture_output=True, text=True, timeout=self.timeout,
                                  env=child_env(self.env()), preexec_fn=die_with_parent)
        except subprocess.TimeoutExpired as e:
            raise ClusterError(f"uploading the set to the S3 store took over "
                               f"{self.timeout:.0f} s") from e
        if done.returncode != 0:
            raise ClusterError(f"uploading the set to the S3 store failed: "
                               f"{done.stderr.strip()[-800:]}")

    def sent(self) -> int:
        """Bytes sent so far on the server's link."""
        if self.proc is None or self.proc.poll() is not None:
            raise ClusterError("the S3 store is not running")
        return netns.link_bytes(self.proc.pid)[1]

    def close(self) -> None:
        """Kill the server by its pid (idempotent)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
