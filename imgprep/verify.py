"""``imgprep verify``: re-check a conversion against its manifest, or any Chainer label list.

Shards: size and sha256 against the manifest, sample count, every sample has ``.jpg`` and
``.cls``, labels in range, every JPEG decodes to RGB at the converted size. Label lists: two
tokens a line, path inside the root, label in range, file present and decodable.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from imgprep.errors import ShardError, UnsafeArchiveError
from imgprep.manifest import Manifest, find_manifests, read_manifest, sha256_file
from imgprep.shardio import iter_samples

Tick = Callable[[int], None]


@dataclass
class VerifyReport:
    """What was checked and every problem found (empty ``problems`` means all is well)."""

    target: str
    checked: int = 0
    samples: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _check_image(data: bytes, size: int, resize: str) -> str | None:
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            w, h, mode, fmt = img.width, img.height, img.mode, img.format
    except (OSError, SyntaxError, ValueError) as e:
        return f"does not decode ({e})"
    if fmt != "JPEG" or mode != "RGB":
        return f"is {fmt} {mode}, expected an RGB JPEG"
    if (resize == "center-crop" and (w, h) != (size, size)) or \
            (resize == "short-side" and min(w, h) != size):
        return f"is {w}x{h}, expected {resize} {size}"
    return None


def verify_shards(folder: Path, m: Manifest, decode: bool, tick: Tick) -> VerifyReport:
    rep = VerifyReport(str(folder / f"{m.split}.json"))
    t = m.options.get("transform", {})
    size, resize = int(t.get("size", 256)), str(t.get("resize", "center-crop"))
    n_classes = len(m.classes)
    seen: set[str] = set()
    for s in m.shards:
        rep.checked += 1
        path = folder / s.name
        if not path.is_file():
            rep.problems.append(f"{s.name}: missing; restore it or reconvert")
            continue
        nbytes = path.stat().st_size
        if nbytes != s.bytes:
            rep.problems.append(f"{s.name}: {nbytes} bytes, manifest says {s.bytes}")
            continue
        if sha256_file(path) != s.sha256:
            rep.problems.append(f"{s.name}: sha256 differs from the manifest (corrupt copy)")
            continue
        count = 0
        try:
            for key, fields in iter_samples(path):
                count += 1
                where = f"{s.name}:{key}"
                if key in seen:
                    rep.problems.append(f"{where}: key appears in more than one place")
                seen.add(key)
                if "jpg" not in fields or "cls" not in fields:
                    rep.problems.append(f"{where}: has {sorted(fields)}, needs jpg and cls")
                    continue
                try:
                    label = int(fields["cls"])
                except ValueError:
                    label = -1
                if not 0 <= label < n_classes:
                    rep.problems.append(
                        f"{where}: label {fields['cls']!r} outside 0..{n_classes - 1}")
                if decode and (why := _check_image(fields["jpg"], size, resize)):
                    rep.problems.append(f"{where}.jpg {why}")
                tick(1)
        except (ShardError, UnsafeArchiveError) as e:
            rep.problems.append(f"{s.name}: unreadable ({e})")
        if count != s.samples:
            rep.problems.append(f"{s.name}: {count} samples, manifest says {s.samples}")
        rep.samples += count
    if rep.samples != m.total_samples and not rep.problems:
        rep.problems.append(f"{rep.samples} samples in all, manifest says {m.total_samples}")
    return rep


def verify_list(list_file: Path, root: Path, n_classes: int, decode: bool, tick: Tick,
                size: int = 256, resize: str = "center-crop",
                expected_sha256: str | None = None) -> VerifyReport:
    """Check a Chainer/Caffe ``path label`` file as LabeledImageDataset would read it."""
    rep = VerifyReport(str(list_file))
    try:
        data = list_file.read_bytes()
    except OSError as e:
        rep.problems.append(f"{list_file}: cannot read ({e.strerror})")
        return rep
    if expected_sha256 and hashlib.sha256(data).hexdigest() != expected_sha256:
        rep.problems.append(f"{list_file.name}: sha256 differs from the manifest")
    root_r = root.resolve()
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        rep.checked += 1
        where = f"{list_file.name}:{n}"
        tokens = line.split()
        if len(tokens) != 2:
            rep.problems.append(f"{where}: {len(tokens)} tokens, expected 'path label'")
            continue
        rel, lab = tokens
        if not lab.lstrip("-").isdigit() or not 0 <= int(lab) < n_classes:
            rep.problems.append(f"{where}: label {lab!r} outside 0..{n_classes - 1}")
        path = (root / rel).resolve()
        if root_r not in path.parents:
            rep.problems.append(f"{where}: {rel} points outside {root}")
            continue
        try:
            img = path.read_bytes()
        except OSError as e:
            rep.problems.append(f"{where}: {rel} cannot be read ({e.strerror})")
            continue
        if decode and (why := _check_image(img, size, resize)):
            rep.problems.append(f"{where}: {rel} {why}")
        rep.samples += 1
        tick(1)
    return rep


def verify(path: Path, split: str | None = None, decode: bool = True,
           tick: Tick = lambda n: None) -> VerifyReport:
    """Verify a converted folder (every split's manifest, or ``split``'s) or a label-list file."""
    if path.is_file() and path.suffix == ".txt":
        return verify_list(path, path.parent, 1000, decode, tick)
    if path.is_dir() and split is None and len(found := find_manifests(path)) > 1:
        reports = [_verify_manifest(p, decode, tick) for p in found]
        return VerifyReport(", ".join(r.target for r in reports),
                            sum(r.checked for r in reports), sum(r.samples for r in reports),
                            [p for r in reports for p in r.problems])
    return _verify_manifest(path if split is None else path / f"{split}.json", decode, tick)


def _verify_manifest(path: Path, decode: bool, tick: Tick) -> VerifyReport:
    m = read_manifest(path)
    folder = path if path.is_dir() else path.parent
    if m.format == "shards":
        return verify_shards(folder, m, decode, tick)
    t = m.options.get("transform", {})
    rep = verify_list(folder / (m.list_file or f"{m.split}.txt"), folder, len(m.classes), decode,
                      tick, int(t.get("size", 256)), str(t.get("resize", "center-crop")),
                      m.list_sha256)
    if rep.samples != m.total_samples:
        rep.problems.append(f"{rep.samples} readable entries, manifest says {m.total_samples}")
    return rep
