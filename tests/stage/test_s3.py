"""``stage-to-node --src s3://BUCKET/PREFIX/``: a converted folder in an S3 store stages as
from a folder, in every mode (replicate, partition, fan-out: the store read once in all), with
ranged GETs in parallel parts; and every way it can fail is one line naming the ``s3://`` URL
and the next step, exit 3, with nothing under a final name.

The store is moto's S3 server, a real S3 protocol endpoint on 127.0.0.1 (a subprocess, so
that node processes reach it too), which counts the body bytes it sends for every GET; boto3
finds it through ``AWS_ENDPOINT_URL``, as it finds any S3-compatible store. A TCP proxy in
front of it stops forwarding after N bytes (a stalled connection); a denial (HTTP 403) is
moto's own IAM enforcement: a user whose policy does not allow ``s3:GetObject``.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from imgprep.cli.commands import cli
from imgprep.job.assign import node_shards
from imgprep.shards.manifest import Manifest, read_manifest
from imgprep.shards.verify import verify
from imgprep.stage.remote import check_url, source_of
from imgprep.stage.s3 import S3Source
from tests.support import clean_env, fanout_nodes, free_port, one_line_error

pytest.importorskip("boto3")
pytest.importorskip("moto")

TIMEOUT = 180  # a fan-out run: two processes on shared (often busy) cores, each importing torch
BUCKET = "imagenet-test"
PREFIX = "imagenet/"
URL = f"s3://{BUCKET}/{PREFIX}"
SPLITS = ("train", "val")

# moto's S3 app (as moto_server serves it), wrapped to count the body bytes and GETs of every
# path, read at /imgprep-counts (DELETE clears them); it prints its port once it listens.
SERVER = r"""
import json, sys, threading
from collections import Counter
from werkzeug.serving import make_server
from moto.moto_server.werkzeug_app import (DomainDispatcherApplication, MotoRequestHandler,
                                           create_backend_app)

moto = DomainDispatcherApplication(create_backend_app)
sent, gets, lock = Counter(), Counter(), threading.Lock()


def app(environ, start_response):
    path = environ.get("PATH_INFO", "")
    if path == "/imgprep-counts":
        with lock:
            body = json.dumps({"bytes": sent, "gets": gets}).encode()
            if environ["REQUEST_METHOD"] == "DELETE":
                sent.clear()
                gets.clear()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body]
    out = moto(environ, start_response)
    if environ["REQUEST_METHOD"] != "GET":
        return out

    def counted():
        n = 0
        try:
            for block in out:
                n += len(block)
                yield block
        finally:
            with lock:
                sent[path] += n
                gets[path] += 1
            getattr(out, "close", lambda: None)()

    return counted()


class Quiet(MotoRequestHandler):
    def log_request(self, *args, **kwargs):
        pass


server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=Quiet)
print(server.server_port, flush=True)
server.serve_forever()
"""


# ---------------------------------------------------------------------------- the store


class Store:
    """moto's S3 server in a subprocess, at ``url``."""

    def __init__(self, **env: object) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE,
                                     env=clean_env(**env), text=True)
        port = self._port()
        self.url = f"http://127.0.0.1:{port}"

    def _port(self) -> int:
        box: list[str] = []
        out = self.proc.stdout
        assert out is not None
        reader = threading.Thread(target=lambda: box.append(out.readline()), daemon=True)
        reader.start()
        reader.join(60)
        if not box or not box[0].strip():
            self.close()
            raise RuntimeError("moto's S3 server did not start")
        return int(box[0])

    def client(self, **creds: str) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id=creds.get("key", "testing"),
                            aws_secret_access_key=creds.get("secret", "testing"))

    def counts(self, clear: bool = False) -> dict[str, dict[str, int]]:
        """Body bytes sent and GETs answered per object (``bucket/key``) since the last clear."""
        request = urllib.request.Request(self.url + "/imgprep-counts",
                                         method="DELETE" if clear else "GET")
        with urllib.request.urlopen(request, timeout=30) as r:
            raw = json.loads(r.read())
        return {what: {path.lstrip("/"): n for path, n in table.items()}
                for what, table in raw.items()}

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


def upload(client: Any, folder: Path, prefix: str, bucket: str = BUCKET) -> None:
    """What ``aws s3 sync folder s3://bucket/prefix`` does to a fresh prefix."""
    for p in sorted(folder.iterdir()):
        if p.is_file():
            client.upload_file(str(p), bucket, prefix + p.name)


@pytest.fixture(scope="module")
def store(src: Path) -> Iterator[Store]:
    """The S3 server, with ``src`` (the stage tests' converted folder: train and val, each
    with its sample index) uploaded to ``URL``."""
    s = Store()
    try:
        client = s.client()
        client.create_bucket(Bucket=BUCKET)
        upload(client, src, PREFIX)
        yield s
    finally:
        s.close()


def aws_env(endpoint: str, home: Path, **extra: object) -> dict[str, str]:
    """The AWS variables of a test run: the store at ``endpoint``, moto's test keys, and no
    configuration of the user's (empty files), no instance role, no proxy."""
    for name in ("config", "credentials"):
        (home / name).touch()
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": str(home / "config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
           "AWS_EC2_METADATA_DISABLED": "true", "NO_PROXY": "127.0.0.1,localhost",
           "no_proxy": "127.0.0.1,localhost"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


AWS_UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION",
             "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
             "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN")


@pytest.fixture
def aws(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This process's AWS variables point at the store (launcher variables removed); returns
    them, for child processes."""
    for name in list(os.environ):
        if name in AWS_UNSET or name not in clean_env():
            monkeypatch.delenv(name)
    (home := tmp_path / "aws").mkdir()
    env = aws_env(store.url, home)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


# ---------------------------------------------------------------------------- helpers


def stage(src: str, dst: Path, *extra: object) -> Any:
    """stage-to-node in this process; the click Result."""
    return CliRunner().invoke(cli, ["stage-to-node", "--src", src, "--dst", str(dst), "--json",
                                    "-q", *(str(a) for a in extra)])


def staged(src: str, dst: Path, *extra: object) -> dict[str, Any]:
    result = stage(src, dst, *extra)
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def files_of(m: Manifest) -> list[str]:
    """The shards a manifest lists, and its sample index."""
    return [e.name for e in m.shards] + ([m.index.name] if m.index else [])


def set_bytes(src: Path, splits: tuple[str, ...] = SPLITS) -> int:
    """The set's size: every shard and sample index of ``splits``."""
    return sum(m.total_bytes + (m.index.bytes if m.index else 0)
               for m in (read_manifest(src, sp) for sp in splits))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_same_files(src: Path, dst: Path, split: str, names: list[str] | None = None) -> None:
    """``dst`` holds ``names`` (default: every file of the split) byte-identical to ``src``,
    and nothing else of the split, no temporary file either."""
    names = files_of(read_manifest(src, split)) if names is None else names
    for name in names:
        assert sha(dst / name) == sha(src / name), name
    assert sorted(p.name for p in dst.iterdir() if p.name.startswith(f"{split}-")
                  and p.suffix in (".tar", ".bin")) == sorted(names)
    assert not list(dst.rglob(".tmp-*"))


def assert_nothing_final(dst: Path) -> None:
    """A failed run left no shard, index, manifest or temporary file in ``dst``."""
    if dst.exists():
        assert not [p.name for p in dst.iterdir() if p.is_file()], list(dst.iterdir())
        assert not list(dst.rglob(".tmp-*"))


def shard_reads(store: Store, prefix: str = PREFIX) -> dict[str, int]:
    """Body bytes the store sent per file of ``prefix`` (manifests left out)."""
    head = f"{BUCKET}/{prefix}"
    return {path[len(head):]: n for path, n in store.counts()["bytes"].items()
            if path.startswith(head) and not path.endswith(".json")}


# ---------------------------------------------------------------------------- URLs, set-up


def test_s3_urls_are_checked_and_spelled_one_way() -> None:
    assert check_url("s3://bucket/imagenet") == "s3://bucket/imagenet/"
    assert check_url("s3://bucket") == "s3://bucket/"
    assert check_url("s3://my.bucket-1/a/b/") == "s3://my.bucket-1/a/b/"
    for bad in ("s3://", "s3://b/x", "s3://bucket/x?versionId=1", "s3://bu cket/x/"):
        with pytest.raises(ValueError):
            check_url(bad)


def test_an_s3_source_is_found_by_its_scheme_and_boto3_reads_the_endpoint_variables(
        aws: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    origin = source_of("s3://bucket/in", 5.0)
    assert isinstance(origin, S3Source) and origin.folder is None
    assert origin.where("train-000000.tar") == "s3://bucket/in/train-000000.tar"
    assert origin.client().meta.endpoint_url == aws["AWS_ENDPOINT_URL"]
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # the S3 one wins
    assert S3Source("s3://bucket/in/").client().meta.endpoint_url == "http://127.0.0.1:9"


def test_without_boto3_an_s3_source_names_the_extra_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 raises ImportError
    result = stage(URL, tmp_path / "dst", "--split", "val")
    one_line_error(result, 3, URL, "pip install imgprep[s3]")
    assert_nothing_final(tmp_path / "dst")


# ---------------------------------------------------------------------------- staging


def test_replicate_from_s3_gives_the_same_bytes_in_parallel_parts_and_a_rerun_moves_nothing(
        src: Path, store: Store, aws: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    part = 16 << 10  # small parts, so that every shard is several ranged GETs
    monkeypatch.setattr("imgprep.stage.s3.PART", part)
    dst = tmp_path / "dst"
    store.counts(clear=True)
    for split in SPLITS:
        m = read_manifest(src, split)
        s = staged(URL, dst, "--split", split)
        assert (s["role"], s["shards_copied"], s["shards_skipped"]) == \
            ("copier", len(m.shards), 0)
        assert s["bytes_read"] == set_bytes(src, (split,))
        assert_same_files(src, dst, split)
        local = read_manifest(dst, split)
        assert local.node is not None and local.shards == m.shards and local.index == m.index
    rep = verify(dst, decode=False)
    assert rep.ok, rep.problems
    counts = store.counts()
    for split in SPLITS:
        m = read_manifest(src, split)
        for e in m.shards:
            path = f"{BUCKET}/{PREFIX}{e.name}"
            assert counts["bytes"][path] == e.bytes  # every byte once
            assert counts["gets"][path] == -(-e.bytes // part) > 1  # in parallel parts
    store.counts(clear=True)
    for split in SPLITS:
        again = staged(URL, dst, "--split", split)
        assert (again["bytes_read"], again["shards_copied"]) == (0, 0)
    assert shard_reads(store) == {}  # only the manifests were read


def test_partition_over_two_nodes_reads_each_shard_once(
        src: Path, store: Store, aws: dict[str, str], tmp_path: Path) -> None:
    m = read_manifest(src, "train")
    shares = node_shards([e.samples for e in m.shards], 2, "partition", 0)
    store.counts(clear=True)
    for k in range(2):
        dst = tmp_path / f"n{k}"
        s = staged(URL, dst, "--split", "train", "--mode", "partition", "--num-nodes", 2,
                   "--node-rank", k)
        names = [m.shards[i].name for i in shares[k]]
        assert s["shards_copied"] == len(names)
        assert_same_files(src, dst, "train", names + files_of(m)[len(m.shards):])
        local = read_manifest(dst, "train")
        assert local.node is not None and (local.node.node_rank, local.node.mode) == \
            (k, "partition")
    reads = shard_reads(store)
    assert {n: b for n, b in reads.items() if n.endswith(".tar")} == \
        {e.name: e.bytes for e in m.shards}  # each shard once, by its node


def fanout(dst: Path, env: dict[str, str], nodes: int = 2,
           split: str = "train") -> list[dict[str, Any]]:
    """Fan-out from ``URL`` over ``nodes`` node processes meeting on 127.0.0.1; their
    summaries."""
    return fanout_nodes(URL, dst, nodes, clean_env(TORCH_CPP_LOG_LEVEL="ERROR", **env), TIMEOUT,
                        "--split", split)


@pytest.mark.slow
def test_two_node_fanout_reads_the_store_once_in_all_and_a_rerun_moves_nothing(
        src: Path, store: Store, aws: dict[str, str], tmp_path: Path) -> None:
    """Two nodes, each reading its share from the store and sending it to the other (chains
    that forward over more nodes: tests/stage/test_fanout.py)."""
    m = read_manifest(src, "train")
    size = set_bytes(src, ("train",))
    store.counts(clear=True)
    results = fanout(tmp_path, aws)
    assert [s["fanout"] for s in results] == [True] * 2
    assert sum(s["bytes_read"] for s in results) == size  # the summaries say: once in all
    assert all(s["bytes_received"] > 0 for s in results)
    for k in range(2):
        assert_same_files(src, tmp_path / f"n{k}", "train")
    reads = shard_reads(store)  # and so does the store: every object's bytes sent once
    assert reads == {name: (tmp_path / "n0" / name).stat().st_size for name in files_of(m)}
    assert sum(reads.values()) / size == 1.0
    store.counts(clear=True)
    again = fanout(tmp_path, aws)
    assert [(s["bytes_read"], s["bytes_received"], s["shards_copied"]) for s in again] == \
        [(0, 0, 0)] * 2
    assert shard_reads(store) == {}


# ---------------------------------------------------------------------------- failures


def test_no_credentials_is_one_line_naming_the_url_and_where_to_set_them(
        aws: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # the files are empty
        monkeypatch.delenv(name)
    result = stage(URL, tmp_path / "dst", "--split", "train")
    one_line_error(result, 3, f"{URL}train.json", "no AWS credentials", "AWS_ACCESS_KEY_ID",
                   "AWS_PROFILE", "rerun")
    assert_nothing_final(tmp_path / "dst")


def test_a_wrong_bucket_or_prefix_is_one_line_naming_the_url(
        aws: dict[str, str], tmp_path: Path) -> None:
    wrong_bucket, wrong_prefix = f"s3://no-such-bucket/{PREFIX}", f"s3://{BUCKET}/wrong/"
    for url, words in ((wrong_bucket, ("NoSuchBucket", "check the bucket in --src")),
                       (wrong_prefix, ("NoSuchKey", f"aws s3 sync OUT {wrong_prefix}"))):
        result = stage(url, tmp_path / "dst", "--split", "train")
        one_line_error(result, 3, f"{url}train.json", *words, "rerun")
        assert_nothing_final(tmp_path / "dst")


def test_an_unreachable_store_is_one_line_naming_the_url_and_the_endpoint(
        aws: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", nowhere)
    result = stage(URL, tmp_path / "dst", "--split", "train")
    one_line_error(result, 3, f"{URL}train.json", f"cannot connect to {nowhere}",
                   "AWS_ENDPOINT_URL", "rerun")
    assert_nothing_final(tmp_path / "dst")


def test_access_denied_is_one_line_naming_the_url(src: Path, store: Store, aws: dict[str, str],
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """moto's IAM enforcement (``/moto-api/reset-auth``): a user allowed only to list the
    bucket gets HTTP 403 AccessDenied for the manifest; unknown keys are refused; a user
    allowed s3:GetObject stages. Enforcement is switched off again at the end, for the other
    tests of the store."""
    users = {name: iam_user(store, name, action)
             for name, action in (("lister", "s3:ListBucket"), ("reader", "s3:GetObject"))}
    enforce_auth(store, True)  # from now on, every request
    try:
        for user, words in (("lister", ("access denied (AccessDenied, HTTP 403)",
                                        f"grant them s3:GetObject on {URL}")),
                            (None, ("refused the credentials (InvalidAccessKeyId)",
                                    "AWS_ACCESS_KEY_ID"))):
            key, secret = users[user] if user else ("AKIAUNKNOWN000000000", "nothing")
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
            result = stage(URL, tmp_path / "dst", "--split", "val")
            one_line_error(result, 3, f"{URL}val.json", *words, "rerun")
            assert_nothing_final(tmp_path / "dst")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", users["reader"][0])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", users["reader"][1])
        staged(URL, tmp_path / "dst", "--split", "val")
        assert_same_files(src, tmp_path / "dst", "val")
    finally:
        enforce_auth(store, False)


def enforce_auth(store: Store, on: bool) -> None:
    """Switch moto's IAM enforcement on (every request from now on) or off again."""
    urllib.request.urlopen(urllib.request.Request(
        store.url + "/moto-api/reset-auth", data=b"0" if on else b"inf", method="POST",
        headers={"Content-Type": "text/plain"}), timeout=30)


def iam_user(store: Store, name: str, action: str) -> tuple[str, str]:
    """A moto IAM user allowed ``action`` on the bucket and its objects; its access key."""
    import boto3

    iam = boto3.client("iam", endpoint_url=store.url, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="only", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": action,
            "Resource": [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"]}]}))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


def test_a_missing_object_stops_the_copy_naming_it_and_the_rerun_moves_only_what_is_missing(
        src: Path, store: Store, aws: dict[str, str], tmp_path: Path) -> None:
    client, prefix = store.client(), "damaged/"
    url = f"s3://{BUCKET}/{prefix}"
    upload(client, src, prefix)
    val = read_manifest(src, "val")
    gone = val.shards[1].name
    client.delete_object(Bucket=BUCKET, Key=prefix + gone)
    dst = tmp_path / "dst"
    result = stage(url, dst, "--split", "val", "--jobs", 1)
    one_line_error(result, 3, url + gone, f"listed in {url}val.json", "NoSuchKey",
                   f"aws s3 sync OUT {url}", "rerun")
    assert not (dst / gone).exists() and not list(dst.rglob(".tmp-*"))
    assert not (dst / "val.json").exists()
    assert [p.name for p in dst.glob("*.tar")] == [val.shards[0].name]
    assert sha(dst / val.shards[0].name) == val.shards[0].sha256
    client.upload_file(str(src / gone), BUCKET, prefix + gone)  # what aws s3 sync would do
    store.counts(clear=True)
    s = staged(url, dst, "--split", "val")
    assert (s["shards_copied"], s["shards_skipped"]) == (len(val.shards) - 1, 1)
    assert set(shard_reads(store, prefix)) == set(files_of(val)) - {val.shards[0].name}
    assert_same_files(src, dst, "val")


class StallingProxy:
    """A TCP proxy on 127.0.0.1 to ``port`` that forwards the first ``after`` bytes the store
    sends (all connections together), then holds every connection open and silent until
    closed: a stalled link."""

    def __init__(self, port: int, after: int) -> None:
        self.upstream, self.budget = port, after
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.lock, self.release = threading.Lock(), threading.Event()
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.release.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream))
            self.socks += [client, up]
            threading.Thread(target=self._pump, args=(client, up, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, metered: bool) -> None:
        try:
            while data := src.recv(65536):
                if metered:
                    with self.lock:
                        allowed = min(len(data), self.budget)
                        self.budget -= allowed
                    dst.sendall(data[:allowed])
                    if allowed < len(data):
                        self.release.wait()
                        return
                else:
                    dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.release.set()
        self.listener.close()
        for s in self.socks:
            s.close()


def test_a_stalled_connection_is_abandoned_after_the_stall_timeout(
        src: Path, store: Store, aws: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    val = read_manifest(src, "val")
    manifest = (src / "val.json").stat().st_size
    first = f"{URL}{val.shards[0].name}"
    cases = ((100, "manifest", (f"cannot fetch the manifest {URL}val.json",)),  # in its header
             (manifest + 4000, "shard", (first,)))  # its manifest, then half a shard
    for after, what, words in cases:
        proxy = StallingProxy(int(store.url.rsplit(":", 1)[1]), after)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        dst = tmp_path / what
        t0 = time.monotonic()
        try:
            result = stage(URL, dst, "--split", "val", "--jobs", 1, "--stall-timeout", 3)
        finally:
            waited = time.monotonic() - t0
            proxy.close()
        assert waited < 20, waited  # the stall (3 s), not botocore's retries or a hang
        line = one_line_error(result, 3, *words, "3 s", "--stall-timeout", "rerun")
        assert "no data for 3 s" in line or "no byte moved for 3 s" in line, line
        assert not list(dst.glob("*.tar")) and not list(dst.rglob(".tmp-*"))
        assert not (dst / "val.json").exists()
    monkeypatch.setenv("AWS_ENDPOINT_URL", store.url)
    staged(URL, tmp_path / "shard", "--split", "val")  # the rerun completes
    assert_same_files(src, tmp_path / "shard", "val")
