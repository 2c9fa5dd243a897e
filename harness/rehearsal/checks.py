"""What the rehearsal checks between and after its steps, each read from the files themselves:
the sample index ``imgprep index`` rebuilds from tar headers against the one convert wrote,
each staged node's files against the source's, byte for byte, and what the manifests of a
convert with a held-out val split record of it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from imgprep import node_shards, read_manifest
from imgprep.shards.manifest import index_name

CHUNK = 4 << 20
SPLITS = ("train", "val")
ASIDE = ".convert"  # suffix of the index convert wrote, moved aside while index rebuilds it


def same_bytes(a: Path, b: Path) -> bool:
    """Whether two files hold the same bytes (sizes first, then 4 MiB at a time)."""
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(CHUNK), fb.read(CHUNK)
            if x != y:
                return False
            if not x:
                return True


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def index_files(folder: Path) -> list[Path]:
    """Every file the index command writes: each split's sample index and the shards' DALI
    indexes (``<split>-NNNNNN.idx``)."""
    return sorted([folder / index_name(s) for s in SPLITS if (folder / index_name(s)).exists()]
                  + list(folder.glob("*.idx")))


def before_index(folder: Path) -> dict[str, Any]:
    """Before ``imgprep index``: the manifests' bytes, each index file's sha256, and each
    split's sample index moved aside (so it is built anew, not found in place)."""
    state = {"manifests": {s: (folder / f"{s}.json").read_bytes() for s in SPLITS},
             "sha256": {p.name: sha256(p) for p in index_files(folder)}}
    for s in SPLITS:
        (folder / index_name(s)).rename(folder / (index_name(s) + ASIDE))
    return state


def after_index(folder: Path, state: dict[str, Any]) -> dict[str, Any]:
    """After ``imgprep index``: each sample index against the one moved aside (byte for
    byte, then the aside copy is removed), the DALI indexes by sha256, the manifests
    unchanged."""
    differ = []
    for s in SPLITS:
        new, old = folder / index_name(s), folder / (index_name(s) + ASIDE)
        if not new.exists() or not same_bytes(new, old):
            differ.append(index_name(s))
        old.unlink()
    now = {p.name: sha256(p) for p in index_files(folder)}
    differ += sorted(n for n in state["sha256"].keys() | now.keys()
                     if state["sha256"].get(n) != now.get(n) and n not in differ)
    manifests = [s for s in SPLITS
                 if (folder / f"{s}.json").read_bytes() != state["manifests"][s]]
    return {"index_identical": not differ and not manifests, "files_compared": len(now),
            "differ": differ[:5], "manifests_changed": manifests}


def shard_names(folder: Path, split: str) -> list[str]:
    return [s.name for s in read_manifest(folder, split).shards]


def node_files(src: Path, dst: Path, names: list[str]) -> Iterator[tuple[Path, Path]]:
    """(source, copy) for the given shards and the files staged with them: each split's
    sample index and each shard's DALI index where the source has them."""
    for name in names:
        yield src / name, dst / name
        idx = name[:-len(".tar")] + ".idx"
        if (src / idx).exists():
            yield src / idx, dst / idx
    for s in SPLITS:
        if any(n.startswith(f"{s}-") for n in names) and (src / index_name(s)).exists():
            yield src / index_name(s), dst / index_name(s)


def expected_share(src: Path, split: str, nodes: int, node: int, mode: str) -> list[str]:
    m = read_manifest(src, split)
    share = node_shards([s.samples for s in m.shards], nodes, mode, 0)[node]
    return [m.shards[i].name for i in share]


def staged_nodes(src: Path, dsts: list[Path], mode: str,
                 splits: tuple[str, ...] = SPLITS) -> dict[str, Any]:
    """Each node folder against the source: its manifests list exactly its share of each of
    ``splits`` (all of it in replicate mode; ``node_shards`` in partition mode), and every
    file of that share is byte-identical to the source's. In partition mode the shares
    together must be the whole set, each shard on one node."""
    problems: list[str] = []
    files = nbytes = 0
    held: dict[str, list[str]] = {s: [] for s in splits}
    for k, dst in enumerate(dsts):
        names = []
        for s in splits:
            want = expected_share(src, s, len(dsts), k, mode)
            have = shard_names(dst, s) if (dst / f"{s}.json").exists() else []
            if have != want:
                problems.append(f"node {k} {s}: {len(have)} shards listed, its share is "
                                f"{len(want)}")
            held[s] += have
            names += want
        for a, b in node_files(src, dst, names):
            files += 1
            nbytes += a.stat().st_size
            if not b.exists() or not same_bytes(a, b):
                problems.append(f"node {k}: {b.name} differs from the source's")
    whole = {s: sorted(held[s]) == sorted(shard_names(src, s)) for s in splits}
    if mode == "partition" and not all(whole.values()):
        problems.append(f"the nodes' shares are not the whole set once: {whole}")
    return {"nodes": len(dsts), "mode": mode, "identical": not problems,
            "files_compared": files, "bytes_compared": nbytes, "problems": problems[:5]}


def holdout_manifests(folder: Path) -> dict[str, Any]:
    """After a convert with ``--holdout-per-class``: the train split's class table (its size,
    and whether val's is the same) and the held-out count each manifest records."""
    m = {s: read_manifest(folder, s) for s in SPLITS}
    held = {s: m[s].options.holdout for s in SPLITS}
    return {"classes": len(m["train"].classes),
            "same_classes": m["train"].classes == m["val"].classes,
            "holdout_images": {s: h.images if h else None for s, h in held.items()},
            "holdout_per_class": held["train"].per_class if held["train"] else None}
