"""FFCV 1.0.2 beside the shard loader in ``bench.loader``, run in FFCV's own environment.

FFCV builds against opencv and numba and pulls packages that would replace pillow-simd, so it
lives in a virtualenv of its own (docs/benchmarks.md#ffcv-peer says how to make one) and never
imports into the project's environment. This module has two sides:

- the benchmark's side (``start``, ``FfcvPeer``), in the project's environment: it starts
  ``<FFCV python> -m bench.ffcv_peer`` from the repository root (the FFCV side imports
  nothing of the project but this module and ``bench.common``, both standard library only at
  the top), copies the shard set's samples into a source file (``write_source``: per sample
  its label and its converted JPEG bytes as they lie in the shards, in the set's order), and
  asks for a .beton and for epochs;
- the FFCV side (``serve``): it writes the .beton from the source file, an ``RGBImageField``
  in jpg mode holding each JPEG's bytes as given (``_StoredJpegField``: no decode, no
  re-encode; FFCV keeps such a subclass as a custom field, read back as ``RGBImageField``),
  or in raw mode for a record of RGB pixels (FFCV's own storage modes: its ``proportion``
  and ``raw`` write modes, the images picked by the benchmark so that imgprep's stores and
  FFCV's keep the same images as pixels: ``bench.loader_stores``)
  and the label as an ``IntField``, reads every sample back through FFCV's ``Reader`` and
  returns a digest of what it stored; then it builds one ``Loader`` per worker count (kept
  across epochs: FFCV compiles its pipeline on the first) and times whole epochs.

Protocol: one JSON object a line each way, a reply for each request. The FFCV side speaks
first: ``{"ok": true, "versions": {...}}`` once FFCV imported, else ``{"ok": false, "import":
true, "error": ...}`` and it exits. Then::

    {"cmd": "write", "source": PATH, "beton": PATH}
        -> {"ok": true, "samples": N, "digest": SHA256 of the stored samples, "seconds": S}
    {"cmd": "open", "name": NAME, "beton": PATH, "batch_size": B, "workers": W, "seed": S}
        -> {"ok": true}
    {"cmd": "epoch", "name": NAME}
        -> {"ok": true, "pass": {"rate", "images", "first_batch_s", "seconds",
                                 "rate_after_first_batch", "process_cores"}}
    {"cmd": "quit"} (or the end of the input: the benchmark is gone) -> exits

A request that fails gets ``{"ok": false, "error": TEXT}``. Replies go to the stdout the side
was started with; anything FFCV, numba or tqdm print goes to stderr, a log file the benchmark
quotes when a request fails. Every wait for a reply has a timeout, and the FFCV side is killed
with the benchmark (``die_with_parent``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import IO, Any

from bench.common import REPO, timed_epoch
from imgprep.procs import readable

ENV = "IMGPREP_FFCV_PYTHON"  # the FFCV python when --ffcv-python is not given
HOWTO = (f"to add them, install FFCV 1.0.2 in a virtualenv of its own (docs/benchmarks.md"
         f"#ffcv-peer) and pass --ffcv-python VENV/bin/python or set {ENV}")
SIZE = 224  # RandomResizedCropRGBImageDecoder((SIZE, SIZE)), as the loader's train transform
REPLY_TIMEOUT_S = 600.0  # the first epoch compiles FFCV's pipeline; 10,000 samples take ~10 s
RECORD = struct.Struct("<qI")  # a source record: label, length of the JPEG bytes that follow


Rows = dict[str, Callable[[], dict[str, float]]]  # a row's name -> one timed epoch of it


class PeerError(RuntimeError):
    """The FFCV side failed a request, went silent or died (the message says which)."""


# ---------------------------------------------------------------------------- source file


RAW_MAGIC = b"IPXL"  # a source record holding RGB pixels: imgprep's rgb24 record
RAW_HEAD = struct.Struct("<4sBBHII")  # imgprep.rawformat's header (magic ... height)


def stored(data: bytes | memoryview) -> bytes | memoryview:
    """What FFCV stores of a source record's bytes: a JPEG as it is, an RGB record's pixels
    (FFCV's raw mode) without its header."""
    return data[RAW_HEAD.size:] if bytes(data[:4]) == RAW_MAGIC else data


def fold(digest: Any, label: int, jpeg: bytes | memoryview) -> None:
    """Add one sample to a running sha256 (what FFCV stores of it: ``stored``): what both
    sides digest, in sample order."""
    kept = stored(jpeg)
    digest.update(RECORD.pack(label, len(kept)))
    digest.update(kept)


def write_source(path: Path, samples: Iterable[tuple[int, bytes]]) -> tuple[int, str]:
    """``samples`` (label, JPEG bytes) as records in ``path``; returns (count, digest)."""
    digest, n = hashlib.sha256(), 0
    with open(path, "wb") as f:
        for label, jpeg in samples:
            f.write(RECORD.pack(label, len(jpeg)))
            f.write(jpeg)
            fold(digest, label, jpeg)
            n += 1
    return n, digest.hexdigest()


def read_source(data: bytes | mmap.mmap) -> list[tuple[int, int, int]]:
    """(label, offset, length) of every record in a source file's bytes."""
    out: list[tuple[int, int, int]] = []
    pos = 0
    while pos < len(data):
        if pos + RECORD.size > len(data):
            raise ValueError(f"source file: truncated record header at byte {pos}")
        label, n = RECORD.unpack_from(data, pos)
        pos += RECORD.size
        if pos + n > len(data):
            raise ValueError(f"source file: record at byte {pos - RECORD.size} says {n} bytes "
                             f"but {len(data) - pos} remain")
        out.append((label, pos, n))
        pos += n
    return out


def shard_samples(folder: Path, split: str, raw: Callable[[str], bool] | None = None
                  ) -> Iterator[tuple[int, bytes]]:
    """(label, converted JPEG bytes) of every sample of a shard set, in the set's order; for
    the samples whose key ``raw`` picks, their full-scale RGB decode instead (an rgb24
    record, ``imgprep.rawpixels``: FFCV's raw mode stores those pixels)."""
    from imgprep import rawpixels, read_manifest
    from imgprep.rawformat import BY_NAME
    from imgprep.shards.tario import iter_samples

    for s in read_manifest(folder, split).shards:
        for key, fields in iter_samples(folder / s.name):
            jpeg = fields["jpg"]
            if raw is not None and raw(key):
                jpeg = rawpixels.record(jpeg, BY_NAME["rgb"])[0]
            yield int(fields["cls"]), jpeg


# ---------------------------------------------------------------------------- protocol


def parse_reply(line: bytes | str) -> dict[str, Any]:
    """One reply line as a dict with a boolean ``ok``; ValueError for anything else."""
    try:
        reply = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not a JSON reply: {line[:200]!r} ({e})") from None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise ValueError(f"not a reply (a JSON object with a boolean 'ok'): {line[:200]!r}")
    return reply


def skip_line(python: str | None, why: str | None = None) -> str:
    """The one line that says the FFCV rows are left out, why, and how to add them."""
    if python is None:
        why = f"no --ffcv-python given and {ENV} is not set"
    return f"FFCV rows skipped: {why}; {HOWTO}"


class FfcvPeer:
    """The benchmark's end of the FFCV side: a child process, a request a line."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc, self.log = proc, log
        self.versions: dict[str, str] = {}
        self._buf = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _stderr_tail(self) -> str:
        with contextlib.suppress(OSError):
            lines = self.log.read_text(errors="replace").strip().splitlines()
            return " | ".join(lines[-5:])
        return ""

    def reply(self, timeout: float = REPLY_TIMEOUT_S) -> dict[str, Any]:
        """The next reply line; PeerError when the side dies or stays silent ``timeout`` s."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not readable(fd, left):
                raise PeerError(f"the FFCV side (pid {self.pid}) said nothing for {timeout:.0f} "
                                f"s; its log {self.log}: {self._stderr_tail()}")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise PeerError(f"the FFCV side (pid {self.pid}) exited "
                                f"(code {self.proc.wait()}); its log {self.log}: "
                                f"{self._stderr_tail()}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return parse_reply(line)

    def request(self, cmd: str, **args: Any) -> dict[str, Any]:
        """Send one request and return its reply; PeerError when it failed."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise PeerError(f"the FFCV side (pid {self.pid}) is gone; its log {self.log}: "
                            f"{self._stderr_tail()}") from None
        reply = self.reply()
        if not reply["ok"]:
            raise PeerError(f"FFCV side, {cmd}: {reply.get('error')}; its log {self.log}")
        return reply

    def epoch(self, name: str) -> dict[str, float]:
        """One timed epoch of the loader ``name`` (see ``open_loaders``)."""
        return dict(self.request("epoch", name=name)["pass"])

    def write_beton(self, folder: Path, split: str, scratch: Path,
                    raw: Callable[[str], bool] | None = None, name: str | None = None
                    ) -> dict[str, Any]:
        """The shard set's samples written into ``scratch/<name or split>.beton``; PeerError
        unless the .beton holds every sample's label and JPEG bytes as the shards do (the
        samples ``raw`` picks by key: their RGB pixels, in FFCV's raw mode)."""
        source, beton = scratch / "ffcv-source.bin", scratch / f"{name or split}.beton"
        n, digest = write_source(source, shard_samples(folder, split, raw))
        try:
            reply = self.request("write", source=str(source), beton=str(beton))
        finally:
            source.unlink()
        if reply["samples"] != n or reply["digest"] != digest:
            raise PeerError(f"{beton} holds {reply['samples']} samples digesting to "
                            f"{reply['digest']}, the shards of {folder} {n} to {digest}")
        return {"beton": str(beton), "samples": n, "digest": digest,
                "beton_mb": round(beton.stat().st_size / 1e6, 1), "write_s": reply["seconds"]}

    def open_loaders(self, beton: str, batch: int, workers: Sequence[int],
                     seed: int = 0, prefix: str = "ffcv") -> Rows:
        """One FFCV loader per worker count, ``<prefix>_<w>w``: what times one epoch of
        each."""
        rows: Rows = {}
        for w in workers:
            name = f"{prefix}_{w}w"
            self.request("open", name=name, beton=beton, batch_size=batch, workers=w,
                         seed=seed)
            rows[name] = partial(self.epoch, name)
        return rows

    def close(self) -> None:
        """Ask the side to quit; kill it if it has not within 10 s."""
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(b'{"cmd": "quit"}\n')
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start(python: str | None, scratch: Path) -> tuple[FfcvPeer | None, str]:
    """The FFCV side started with ``python``, and a line: FFCV's versions, or why the FFCV
    rows are skipped (no python given, it cannot run, it cannot import FFCV)."""
    if python is None:
        return None, skip_line(None)
    from imgprep.procs import die_with_parent

    log = scratch / "ffcv-side.log"
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(REPO)}
    try:
        with open(log, "wb") as err:
            proc = subprocess.Popen([python, "-m", "bench.ffcv_peer"], cwd=REPO, env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                    preexec_fn=partial(die_with_parent, os.getpid()))
    except OSError as e:
        return None, skip_line(python, f"cannot run {python} ({e.strerror})")
    peer = FfcvPeer(proc, log)
    try:
        hello = peer.reply(timeout=120)
    except (PeerError, ValueError) as e:
        peer.close()
        return None, skip_line(python, f"{python} did not start the FFCV side ({e})")
    if not hello["ok"]:
        peer.close()
        return None, skip_line(python, f"{python} could not import ffcv ({hello.get('error')})")
    peer.versions = hello["versions"]
    return peer, "FFCV " + ", ".join(f"{k} {v}" for k, v in peer.versions.items())


def setup(python: str | None, folder: Path, split: str, scratch: Path, batch: int,
          workers: Sequence[int]) -> tuple[FfcvPeer | None, Rows, dict[str, Any]]:
    """The benchmark's FFCV rows: the side started, the shard set's .beton written and
    checked, a loader per worker count, and what to report about them; or no rows, and the
    line that says why (``skipped``)."""
    peer, note = start(python, scratch)
    if peer is None:
        return None, {}, {"skipped": note}
    try:
        info = {"versions": peer.versions, **peer.write_beton(folder, split, scratch)}
        return peer, peer.open_loaders(info["beton"], batch, workers), info
    except BaseException:
        peer.close()
        raise


def table_line(info: dict[str, Any]) -> str:
    """What the benchmark's table says of the FFCV rows: why there are none, or what they
    ran and what ``vs_ffcv_Nw`` divides."""
    if "skipped" in info:
        return str(info["skipped"])
    v = info["versions"]
    return (f"(FFCV {v['ffcv']}, numba {v['numba']}, in a process of its own: a .beton of the "
            f"same {info['samples']} JPEGs, {info['beton_mb']} MB; vs_ffcv_Nw = "
            f"{info['compared']}_Nw / ffcv_Nw)")


# ---------------------------------------------------------------------------- the FFCV side


def _write(source: str, beton: str) -> dict[str, Any]:
    """The .beton written from a source file, then every sample read back and digested."""
    import io

    import numpy as np
    from ffcv.fields import IntField, RGBImageField
    from ffcv.reader import Reader
    from ffcv.writer import DatasetWriter
    from PIL import Image

    class _StoredJpegField(RGBImageField):
        """An RGBImageField in jpg mode that stores the given JPEG bytes as they are."""

        def encode(self, destination: Any, jpeg: bytes, malloc: Any) -> None:
            if jpeg[:4] == RAW_MAGIC:  # RGB pixels: IMAGE_MODES["raw"], stored as given
                _, _, _, _, w, h = RAW_HEAD.unpack_from(jpeg)
                destination["mode"] = 1
                data = stored(jpeg)
            else:
                destination["mode"] = 0  # ffcv.fields.rgb_image.IMAGE_MODES["jpg"]
                w, h = Image.open(io.BytesIO(jpeg)).size  # the header only
                data = jpeg
            destination["width"], destination["height"] = w, h
            destination["data_ptr"], storage = malloc(len(data))
            storage[:] = np.frombuffer(data, dtype=np.uint8)

    t0 = time.perf_counter()
    with open(source, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        records = read_source(data)

        class Samples:
            def __len__(self) -> int:
                return len(records)

            def __getitem__(self, i: int) -> tuple[bytes, int]:
                label, at, n = records[i]
                return data[at:at + n], label

        DatasetWriter(beton, {"image": _StoredJpegField(write_mode="jpg"), "label": IntField()},
                      num_workers=min(2, os.cpu_count() or 1)).from_indexed_dataset(Samples())
    reader = Reader(beton, custom_handlers={"image": RGBImageField})
    size = dict(zip(reader.alloc_table["ptr"].tolist(), reader.alloc_table["size"].tolist(),
                    strict=True))
    digest = hashlib.sha256()
    with open(beton, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as kept:
        for image, label in zip(reader.metadata["f0"], reader.metadata["f1"], strict=True):
            ptr, mode = int(image["data_ptr"]), int(image["mode"])
            if mode not in (0, 1):
                raise ValueError(f"{beton}: a sample was stored in mode {mode}, not jpg or raw")
            fold(digest, int(label), kept[ptr:ptr + size[ptr]])
    return {"samples": int(reader.num_samples), "digest": digest.hexdigest(),
            "seconds": round(time.perf_counter() - t0, 3)}


def _open(beton: str, batch_size: int, workers: int, seed: int) -> Any:
    """FFCV's loader: random-resized-crop, flip, uint8 NHWC tensors; random order, full
    batches only."""
    from ffcv.fields import RGBImageField
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, ToTensor

    return Loader(beton, batch_size=batch_size, num_workers=workers, order=OrderOption.RANDOM,
                  seed=seed, drop_last=True, custom_fields={"image": RGBImageField},
                  pipelines={"image": [RandomResizedCropRGBImageDecoder((SIZE, SIZE)),
                                       RandomHorizontalFlip(), ToTensor()],
                             "label": [IntDecoder(), ToTensor()]})


def _nhwc_problem(images: Any) -> str | None:
    import torch

    if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (SIZE, SIZE, 3):
        return f"FFCV gave a {images.dtype} batch of shape {tuple(images.shape)}"
    return None


def _epoch(loader: Any) -> dict[str, float]:
    """One epoch end to end, as the benchmark times its own, and the cores this process
    (FFCV's threads included) kept busy."""
    t0, cpu0 = time.perf_counter(), sum(os.times()[:2])
    out = timed_epoch(loader, _nhwc_problem)
    out["process_cores"] = (sum(os.times()[:2]) - cpu0) / (time.perf_counter() - t0)
    return out


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    import ffcv  # noqa: F401  (imports cv2, numba and torch: the import that may fail)

    return {p: version(p) for p in ("ffcv", "numba", "numpy", "torch")}


def serve(requests: IO[str], replies: IO[str]) -> None:
    """Answer requests until ``quit`` or the end of ``requests``."""
    def say(obj: dict[str, Any]) -> None:
        replies.write(json.dumps(obj) + "\n")
        replies.flush()

    try:
        say({"ok": True, "versions": _versions()})
    except Exception as e:  # any failure to import is reported, then the side stops
        say({"ok": False, "import": True, "error": f"{type(e).__name__}: {e}"})
        return
    loaders: dict[str, Any] = {}
    for line in requests:
        try:
            req = json.loads(line)
            if req["cmd"] == "quit":
                return
            if req["cmd"] == "write":
                say({"ok": True, **_write(req["source"], req["beton"])})
            elif req["cmd"] == "open":
                loaders[req["name"]] = _open(req["beton"], req["batch_size"], req["workers"],
                                             req["seed"])
                say({"ok": True})
            elif req["cmd"] == "epoch":
                say({"ok": True, "pass": _epoch(loaders[req["name"]])})
            else:
                say({"ok": False, "error": f"unknown command {req['cmd']!r}"})
        except Exception as e:  # the benchmark stops, quoting it and the log
            say({"ok": False, "error": f"{type(e).__name__}: {e}"})


def main() -> None:
    """The FFCV side: replies on the stdout it was given, everything else on stderr."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
