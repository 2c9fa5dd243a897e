"""The FFCV peer of the loader benchmark: its source file, its reply lines, the one line that
says its rows are skipped, and a child that fails or dies. None of these needs FFCV; the last
test, marked slow, writes a real .beton with the FFCV python named by IMGPREP_FFCV_PYTHON and
skips without it."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import ffcv_peer
from bench.ffcv_peer import FfcvPeer, PeerError
from bench.loader import parse_args
from tests.support.shards import tar_samples

SAMPLES = [(3, b"\xff\xd8first\xff\xd9"), (0, b""), (999, bytes(range(256)) * 3)]


def digest_of(samples: list[tuple[int, bytes]]) -> str:
    h = hashlib.sha256()
    for label, jpeg in samples:
        ffcv_peer.fold(h, label, jpeg)
    return h.hexdigest()


def test_source_file_holds_every_label_and_byte_in_order(tmp_path: Path) -> None:
    n, digest = ffcv_peer.write_source(tmp_path / "src.bin", SAMPLES)
    data = (tmp_path / "src.bin").read_bytes()
    back = [(label, data[at:at + size]) for label, at, size in ffcv_peer.read_source(data)]
    assert (n, back, digest) == (3, SAMPLES, digest_of(SAMPLES))


def test_a_truncated_source_file_is_refused_naming_the_byte(tmp_path: Path) -> None:
    ffcv_peer.write_source(tmp_path / "src.bin", SAMPLES)
    data = (tmp_path / "src.bin").read_bytes()
    with pytest.raises(ValueError, match="record at byte"):
        ffcv_peer.read_source(data[:-1])
    with pytest.raises(ValueError, match="truncated record header"):
        ffcv_peer.read_source(data[:3])


def test_a_reply_is_a_json_object_with_a_boolean_ok() -> None:
    assert ffcv_peer.parse_reply('{"ok": true, "samples": 3}') == {"ok": True, "samples": 3}
    for bad in ("numba says hello", "[1, 2]", '{"ok": "yes"}', '{"samples": 3}'):
        with pytest.raises(ValueError, match="not a"):
            ffcv_peer.parse_reply(bad)


def test_without_an_ffcv_python_the_rows_are_skipped_saying_how_to_add_them(
        tmp_path: Path) -> None:
    peer, rows, info = ffcv_peer.setup(None, tmp_path / "absent", "train", tmp_path, 8, (1, 2))
    assert (peer, rows) == (None, {})
    line = info["skipped"]
    assert "\n" not in line and line.startswith("FFCV rows skipped: no --ffcv-python")
    for hint in ("IMGPREP_FFCV_PYTHON", "docs/benchmarks.md#ffcv-peer", "--ffcv-python VENV"):
        assert hint in line
    assert ffcv_peer.table_line(info) == line


def test_a_python_without_ffcv_is_skipped_in_one_line(tmp_path: Path) -> None:
    peer, line = ffcv_peer.start(sys.executable, tmp_path)
    assert peer is None
    assert "\n" not in line and "could not import ffcv" in line
    assert "No module named 'ffcv'" in line


def test_a_python_that_cannot_run_is_skipped_in_one_line(tmp_path: Path) -> None:
    peer, line = ffcv_peer.start(str(tmp_path / "no-python"), tmp_path)
    assert peer is None and "cannot run" in line and "\n" not in line


def test_the_ffcv_side_says_first_whether_ffcv_imported() -> None:
    out = io.StringIO()
    ffcv_peer.serve(io.StringIO('{"cmd": "epoch", "name": "ffcv_1w"}\n'), out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1  # it stops after saying FFCV is missing
    reply = ffcv_peer.parse_reply(lines[0])
    assert reply["ok"] is False and reply["import"] is True


def fake_side(tmp_path: Path, script: str) -> FfcvPeer:
    """A child that speaks the protocol as ``script`` says (the FFCV side stand-in)."""
    log = tmp_path / "side.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err)
    return FfcvPeer(proc, log)


def test_a_failed_request_raises_with_the_sides_error(tmp_path: Path) -> None:
    peer = fake_side(tmp_path, "import sys\nfor line in sys.stdin:\n"
                     "    print('{\"ok\": false, \"error\": \"beton gone\"}', flush=True)\n")
    try:
        with pytest.raises(PeerError, match="epoch: beton gone"):
            peer.request("epoch", name="ffcv_1w")
    finally:
        peer.close()
    assert peer.proc.returncode == 0


def test_a_side_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    peer = fake_side(tmp_path, "import sys\nsys.stdin.readline()\n"
                     "print('numba: out of memory', file=sys.stderr)\nsys.exit(3)\n")
    try:
        with pytest.raises(PeerError, match=r"exited \(code 3\).*numba: out of memory"):
            peer.request("epoch", name="ffcv_1w")
    finally:
        peer.close()


def test_a_silent_side_times_out(tmp_path: Path) -> None:
    peer = fake_side(tmp_path, "import sys\nsys.stdin.read()\n")  # silent until told to quit
    try:
        with pytest.raises(PeerError, match="said nothing for 1 s"):
            peer.reply(timeout=1)
    finally:
        peer.close()


def test_replies_are_read_past_descriptor_1023(tmp_path: Path) -> None:
    """A process with many files open (a parallel test run) gives the side's pipe a
    descriptor number that select() cannot watch."""
    with open(os.devnull, "rb") as null:
        if os.sysconf("SC_OPEN_MAX") < 1100:
            pytest.skip("this process may open fewer than 1,100 files")
        held = [os.dup(null.fileno()) for _ in range(max(0, 1100 - null.fileno()))]
    try:
        peer = fake_side(tmp_path, "print('{\"ok\": true, \"n\": 1}', flush=True)\n"
                                   "import sys\nsys.stdin.read()\n")
        try:
            assert peer.proc.stdout is not None and peer.proc.stdout.fileno() > 1023
            assert peer.reply(timeout=20) == {"ok": True, "n": 1}
            with pytest.raises(PeerError, match="said nothing for 1 s"):
                peer.reply(timeout=1)
        finally:
            peer.close()
    finally:
        for fd in held:
            os.close(fd)


def test_the_ffcv_python_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ffcv_peer.ENV, raising=False)
    assert parse_args([]).ffcv_python is None
    monkeypatch.setenv(ffcv_peer.ENV, "/opt/ffcv/bin/python")
    assert parse_args([]).ffcv_python == "/opt/ffcv/bin/python"
    assert parse_args(["--ffcv-python", "/x/python"]).ffcv_python == "/x/python"


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get(ffcv_peer.ENV),
                    reason=f"{ffcv_peer.ENV} is not set (the python of a virtualenv with FFCV "
                           "1.0.2, docs/benchmarks.md#ffcv-peer)")
def test_the_beton_holds_the_shards_jpeg_bytes_and_serves_epochs(
        converted: dict[str, Path], tmp_path: Path) -> None:
    python = os.environ[ffcv_peer.ENV]
    shards = tar_samples(converted["shards"])
    expected = digest_of([(int(fields["cls"]), fields["jpg"]) for _, _, fields in shards])
    peer, rows, info = ffcv_peer.setup(python, converted["shards"], "train", tmp_path, 8, (1,))
    assert peer is not None, info
    try:
        assert (info["samples"], info["digest"]) == (len(shards), expected)
        assert list(rows) == ["ffcv_1w"]
        for _ in range(2):
            epoch = rows["ffcv_1w"]()
            assert epoch["images"] == len(shards) // 8 * 8
            assert epoch["rate"] > 0 and epoch["process_cores"] > 0
    finally:
        peer.close()
    assert json.loads(json.dumps(info))["versions"]["ffcv"] == "1.0.2"
