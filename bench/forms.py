"""``python -m bench.convert --form F``: convert the same images from input form F and from the
plain tar in the same rounds, and time F's container cost alone beside it.

Forms: ``kaggle`` (Kaggle's extracted tree: files read in place), ``kaggle-zip`` (Kaggle's zip
with stored members: read in place by offset), ``kaggle-zip-deflated`` (the same zip with
deflated members: each inflated in the worker), ``hf-parquet`` (the Hub's parquet copy: row
groups of 100 images, spooled before converting), ``hf-targz`` (the Hub's tar.gz archives: one
gzip stream each, spooled), ``wds`` (a timm shard set: read in place by offset). Each is built
from the benchmark's images with the fakes' layout writers (``imgprep.inputs.fakes``) in 4
files, with names whose keys equal the plain tar's, so both conversions give the same samples.
Each round converts the plain tar and every form with ``--workers 1`` then ``--workers 2``; a
form's ratio is the median over rounds of its rate over the plain tar's rate in that round. The
container's own cost, timed alone each round: the deflated zip, inflating every member
(``zipfile``, CRC checked); parquet, reading ``image.bytes`` row group by row group, and the
spool (that read plus writing the staging files); tar.gz, gzip decompression of the archives,
and the spool. Imported by ``bench.convert``; not part of the installed
packages.
"""

from __future__ import annotations

import gzip
import shutil
import statistics
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from imgprep import ConvertOptions, convert_splits, imagenet_classes
from imgprep.inputs.keys import member_key
from imgprep.inputs.spool import SpoolJob, spool_all, spool_path

FORMS = ("kaggle", "kaggle-zip", "kaggle-zip-deflated", "hf-parquet", "hf-targz", "wds")
KAGGLE_TRAIN = "ILSVRC/Data/CLS-LOC/train"
FILES = 4  # parquet files, tar.gz archives or shards the images are spread over
ROWS_PER_GROUP = 100  # about the Hub's parquet row groups
CHUNK = 1 << 20


def _named(paths: Sequence[Path]) -> list[tuple[str, str, int, bytes]]:
    """(key, wnid, label, bytes) of the images, keyed as the plain tar keys them."""
    table = imagenet_classes()
    out = []
    for p in paths:
        key = member_key(p.name)
        wnid = key.partition("_")[0]
        label = table.index(wnid)
        if label is None:
            raise SystemExit(f"bench_convert: {p.name} does not start with a known wnid")
        out.append((key, wnid, label, p.read_bytes()))
    return out


def build_form(form: str, paths: Sequence[Path], dest: Path) -> Path:
    """The images in ``form`` under ``dest`` (the folder to convert), in FILES files."""
    items = _named(paths)
    dest.mkdir(parents=True, exist_ok=True)
    if form == "hf-parquet":
        from imgprep.inputs.fakes import parquet

        rows = [(parquet.hub_path(k, w, "train"), data, label) for k, w, label, data in items]
        for i in range(FILES):
            parquet.write_parquet(dest / f"train-{i:05d}-of-{FILES:05d}.parquet",
                                  rows[i::FILES], parquet.hub_class_names(imagenet_classes()),
                                  ROWS_PER_GROUP)
    elif form == "hf-targz":
        from imgprep.inputs.fakes import targz

        members = [(targz.member_name(k, w, "train"), data) for k, w, _, data in items]
        for i in range(FILES):
            (dest / f"train_images_{i}.tar.gz").write_bytes(targz.targz_bytes(members[i::FILES]))
    elif form.startswith("kaggle"):
        _write_kaggle(form, items, dest)
    elif form == "wds":
        from imgprep.inputs.fakes import wds

        table = imagenet_classes()
        samples = [(k, data, label, f"{k}.JPEG", table.names[label])
                   for k, _, label, data in items]
        for i in range(FILES):
            (dest / wds.shard_name("train", i)).write_bytes(wds.shard_bytes(samples[i::FILES]))
    else:
        raise SystemExit(f"bench_convert: --form {form}: one of {', '.join(FORMS)}")
    return dest


def _write_kaggle(form: str, items: list[tuple[str, str, int, bytes]], dest: Path) -> None:
    """Kaggle's layout of the train images: the extracted tree, or its zip (members stored, or
    deflated as zip does by default)."""
    mapping = imagenet_classes().to_text().encode()
    if form == "kaggle":
        (dest / "LOC_synset_mapping.txt").write_bytes(mapping)
        for key, wnid, _, data in items:
            folder = dest / KAGGLE_TRAIN / wnid
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{key}.JPEG").write_bytes(data)
        return
    method = zipfile.ZIP_DEFLATED if form == "kaggle-zip-deflated" else zipfile.ZIP_STORED
    with zipfile.ZipFile(dest / "imagenet-object-localization-challenge.zip", "w") as zf:
        zf.writestr("LOC_synset_mapping.txt", mapping)
        for key, wnid, _, data in items:
            zf.writestr(f"{KAGGLE_TRAIN}/{wnid}/{key}.JPEG", data, compress_type=method)


def _inflate(files: list[Path]) -> None:
    for p in files:
        with zipfile.ZipFile(p) as zf:
            for info in zf.infolist():
                zf.read(info)


def time_form_convert(src: Path, out: Path, workers: int, shards: int | None, n: int) -> float:
    """Images per second of one conversion of ``src`` (any form) into the fresh ``out``."""
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    (summary,) = convert_splits(ConvertOptions(input=src, out=out, workers=workers,
                                               num_shards=shards, split="train"))
    dt = time.perf_counter() - t0
    if not summary.complete or summary.samples != n or summary.errors:
        raise SystemExit(f"bench_convert: {src} did not convert all {n} images: {summary}")
    shutil.rmtree(out)
    return n / dt


def _read_parquet(files: list[Path]) -> None:
    from imgprep.inputs.parquetio import iter_images

    for p in files:
        for _ in iter_images(p):
            pass


def _gunzip(files: list[Path]) -> None:
    for p in files:
        with gzip.open(p, "rb") as f:
            while f.read(CHUNK):
                pass


def _spool(form: str, files: list[Path], folder: Path, workers: int) -> None:
    if form == "hf-parquet":
        from imgprep.inputs.forms.parquet import spool_items as read
    else:
        from imgprep.inputs.forms.targz import stream_members as read
    if folder.exists():
        shutil.rmtree(folder)
    spool_all([SpoolJob(source=p, spool=spool_path(folder, i, p), read=read)
               for i, p in enumerate(files)], workers)
    shutil.rmtree(folder)


def container_costs(form: str, src: Path, scratch: Path) -> dict[str, Callable[[], None]]:
    """The container's own work, each timed alone: what it costs to get the bytes out."""
    files = sorted(p for p in src.iterdir() if p.is_file())
    if form == "kaggle-zip-deflated":
        return {"inflate": lambda: _inflate(files)}
    if form == "hf-parquet":
        return {"read": lambda: _read_parquet(files),
                "spool_1w": lambda: _spool(form, files, scratch / "spool", 1),
                "spool_2w": lambda: _spool(form, files, scratch / "spool", 2)}
    if form == "hf-targz":
        return {"read": lambda: _gunzip(files),
                "spool_1w": lambda: _spool(form, files, scratch / "spool", 1),
                "spool_2w": lambda: _spool(form, files, scratch / "spool", 2)}
    return {}


def seconds(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_forms(forms: Sequence[str], paths: Sequence[Path], tar: Path, scratch: Path,
              repeat: int, shards: int | None) -> dict[str, Any]:
    """Every form against the plain tar, ``repeat`` interleaved rounds after a warm-up."""
    n = len(paths)
    sources = {f: build_form(f, paths, scratch / "forms" / f) for f in forms}
    sources["tar"] = tar
    rates: dict[str, dict[str, list[float]]] = {k: {"1w": [], "2w": []} for k in sources}
    costs: dict[str, dict[str, list[float]]] = {}
    for src in sources.values():  # warm-up: page cache, imports
        time_form_convert(src, scratch / "warm", 1, shards, n)
    for r in range(repeat):
        for w in (1, 2):
            for k, src in sources.items():
                rates[k][f"{w}w"].append(time_form_convert(src, scratch / f"{k}-{r}", w,
                                                           shards, n))
        for f in forms:
            for name, fn in container_costs(f, sources[f], scratch).items():
                costs.setdefault(f, {}).setdefault(name, []).append(seconds(fn))
    out: dict[str, Any] = {"images": n, "files_per_form": FILES, "rounds": repeat,
                           "tar_rate_1w": round(statistics.median(rates["tar"]["1w"]), 1),
                           "tar_rate_2w": round(statistics.median(rates["tar"]["2w"]), 1),
                           "forms": {}}
    for f in forms:
        ratio_1w = statistics.median(a / b for a, b in zip(rates[f]["1w"], rates["tar"]["1w"],
                                                           strict=True))
        ratio_2w = statistics.median(a / b for a, b in zip(rates[f]["2w"], rates["tar"]["2w"],
                                                           strict=True))
        scaling = statistics.median(a / b for a, b in zip(rates[f]["2w"], rates[f]["1w"],
                                                          strict=True))
        out["forms"][f] = {
            "rate_1w": round(statistics.median(rates[f]["1w"]), 1),
            "rate_2w": round(statistics.median(rates[f]["2w"]), 1),
            "over_tar_1w": round(ratio_1w, 3), "over_tar_2w": round(ratio_2w, 3),
            "2w_over_1w": round(scaling, 3),
            "container_s": {k: round(statistics.median(v), 3)
                            for k, v in costs.get(f, {}).items()},
            "input_mb": round(sum(p.stat().st_size for p in sources[f].rglob("*")
                                  if p.is_file()) / 1e6, 1),
        }
    return out


def print_forms(res: dict[str, Any]) -> None:
    print(f"input forms against the plain tar: {res['images']} images, {res['files_per_form']} "
          f"files a form, {res['rounds']} rounds; plain tar {res['tar_rate_1w']} img/s with 1 "
          f"worker, {res['tar_rate_2w']} with 2")
    print(f"{'form':12s} {'1w img/s':>9s} {'/tar':>6s} {'2w img/s':>9s} {'/tar':>6s} "
          f"{'2w/1w':>6s}  container alone (s)")
    for f, v in res["forms"].items():
        alone = ", ".join(f"{k} {s}" for k, s in v["container_s"].items()) or "none (in place)"
        print(f"{f:12s} {v['rate_1w']:9.1f} {v['over_tar_1w']:6.3f} {v['rate_2w']:9.1f} "
              f"{v['over_tar_2w']:6.3f} {v['2w_over_1w']:6.3f}  {alone}")
