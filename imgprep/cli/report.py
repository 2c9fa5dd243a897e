"""Human-readable summaries of what a command did, built from its summary."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from imgprep.convert.dryrun import DryRunReport
    from imgprep.convert.summary import ConvertSummary
    from imgprep.inputs.fakeset import FakeSummary
    from imgprep.jpegcrop import Library
    from imgprep.shards.info import ManifestSummary, PilInfo, Versions
    from imgprep.stage.run import StageSummary


def convert_lines(s: ConvertSummary, max_errors: int) -> list[str]:
    """The human-readable summary of one split's conversion."""
    if s.role == "part":
        return [f"rank {s.rank}: {s.tasks_mine} of {s.tasks} shards of {s.split} "
                f"converted ({s.samples} samples) in {s.seconds:.1f} s; rank 0 writes the "
                "manifest"]
    lines = [
        f"{s.split}: {s.samples} samples in {s.tasks} "
        f"{'shards' if s.format == 'shards' else 'chunks'} ({s.bytes / 1e6:.1f} MB) "
        f"from {s.images_listed} images; {s.tasks_resumed} resumed"
        + (" (already complete: nothing converted)" if s.complete and s.tasks
           and s.tasks_resumed == s.tasks else ""),
        f"{s.seconds:.1f} s, {s.images_per_s:.0f} images/s with {s.workers} "
        "workers" + (f" on rank 0 of {s.world_size}" if s.world_size > 1 else ""),
    ]
    if s.unknown_wnids:
        n = sum(s.unknown_wnids.values())
        lines.append(f"{n} images are named with wnids outside the class table "
                     f"({', '.join(f'{w}: {k}' for w, k in s.unknown_wnids.items())}); "
                     "logged as errors; pass --classes with a table that has them")
    lines += _label_lines(s)
    if s.errors:
        lines.append(f"{s.errors} images failed; see {s.error_log}")
    if s.warnings:
        lines.append(f"{s.warnings} images converted whole with warnings (libjpeg's, or bytes "
                     f"after the image); see {s.warning_log}")
    lines.append(f"manifest: {s.manifest}" if s.complete else
                 f"FAILED: {s.errors} errors > --max-errors {max_errors}: no manifest "
                 "written; fix the inputs or raise --max-errors, then rerun to finish")
    return lines


def _label_lines(s: ConvertSummary) -> list[str]:
    """Where a split's labels came from, said when it is not what was given or carried, and
    what --trust-labels let through."""
    from imgprep.inputs.groundtruth import absent_note

    source = s.label_source
    lines = {"published": ["labels: the published ILSVRC2012 validation labels"],
             "input+published": ["labels: from the input, and the published ILSVRC2012 "
                                 "validation labels for the ILSVRC2012_val_* images it does "
                                 "not label"],
             "none": [f"labels: none (the {s.split} split is converted unlabelled: no .cls; "
                      "the loaders and the trainer refuse to train on it)"]}.get(source, [])
    if note := absent_note(s.expected_images, s.missing_images, s.missing_first):
        lines.append(f"missing: {note}")
    differing = s.label_check_names.get("differing", 0)
    if differing and source == "ground-truth":
        lines.append(f"--trust-labels: {differing} ILSVRC2012_val_* names in the ground truth "
                     "have labels other than the published ones; converted as given")
    elif differing:
        lines.append(f"--trust-labels: {differing} images carry labels other than the "
                     "published ones or their names' wnids; converted as given")
    return lines


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _check(mode: str) -> str:
    if mode in ("none", ""):
        return ""
    return " (checked at conversion)" if mode == "at conversion" else f" ({mode} check)"


def dry_run_lines(r: DryRunReport) -> list[str]:
    """``convert --dry-run``: the form, each split, what is skipped; nothing was written."""
    from imgprep.inputs.groundtruth import absent_note

    lines = [f"{r.input}: {r.description} (form {r.form})"]
    for s in r.splits:
        spool = f"; staging copy: {_size(s.spool_bytes)} in {r.out}/.imgprep" \
            if s.spool_bytes else ""
        errors = f"; {s.listing_errors} members refused" if s.listing_errors else ""
        count = f"{s.images} images" if s.images is not None else \
            "images counted while decompressing"
        lines += [f"{s.split}: {count} from {s.where}{errors}",
                  f"  labels: {s.labels}{_check(s.label_check)}",
                  f"  writes: {s.writes} in {r.out} ({s.output}){spool}"]
        lines += [note] if (note := r.error_note(s)) else []
        lines += [f"  missing: {n}"] if (n := absent_note(
            s.expected_images, s.missing_images, s.missing_first)) else []
    lines += [f"skips {k}" for k in r.skipped]
    lines.append("dry run: nothing was written")
    return lines


def make_sample_line(s: FakeSummary) -> str:
    """``make-sample``: what was written, and (other forms) the command that converts it."""
    if s.form != "ilsvrc":
        return (f"{s.out}: the {s.form} form: {s.train_images} train images in "
                f"{len(s.classes)} classes, {s.val_images} val, {s.test_images} test; "
                f"convert it: imgprep convert {' or '.join(s.inputs)} -o OUT")
    return (f"{s.out}: {s.train_images} train images in {len(s.classes)} classes "
            f"({s.train_tar}), {s.val_images} val images ({s.val_tar}) with devkit, "
            f"Caffe and Kaggle ground truth; quirks: {', '.join(s.quirks)}"
            + (f"; bad: {', '.join(s.bad)}" if s.bad else ""))


def stage_line(s: StageSummary, fanout: bool) -> str:
    """The human-readable summary of one node's ``stage-to-node``."""
    return (f"node {s.node_rank}/{s.num_nodes} ({s.role}): {s.shards_copied} shards "
            f"copied, {s.shards_skipped} already there, {s.bytes_read / 1e6:.1f} MB read "
            "from the source"
            + (f", {s.bytes_received / 1e6:.1f} MB from other nodes" if fanout else "")
            + f" in {s.seconds:.1f} s ({s.mb_per_s:.0f} MB/s); manifests: "
            f"{', '.join(s.manifests)}")


def info_lines(versions: Versions, pil: PilInfo, lib: Library | None,
               manifests: list[ManifestSummary], convert: str = "", loader: str = ""
               ) -> list[str]:
    """``imgprep info``: versions, which PIL, the decoder's libjpeg-turbo, how convert makes
    images here (``convert``), what the loader decodes and resizes with (``loader``), and one
    line per manifest."""
    lines = [f"{k:12s} {v}" for k, v in asdict(versions).items()]
    lines.append(f"{'PIL':12s} {pil.pil_version} ({'pillow-simd' if pil.pillow_simd else 'stock'}"
                 f", AVX2 build: {pil.avx2_build}, libjpeg-turbo: {pil.libjpeg_turbo} "
                 f"{pil.jpeg_version})")
    lines.append(f"{'crop decode':12s} {pil.crop_decode}")
    lines.append(f"{'resampler':12s} {pil.resampler}")
    if lib is not None:
        lines.append(f"{'extension':12s} {lib.extension}")
    if convert:
        lines.append(f"{'convert':12s} {convert}")
    if loader:
        lines.append(f"{'loader':12s} {loader}")
    for m in manifests:
        lines.append(f"{m.path}: {m.split} {m.format}, {m.samples} samples, {m.shards} shards, "
                     f"{m.bytes / 1e6:.1f} MB, {m.classes} classes, {m.errors} errors, "
                     f"transform version {m.transform_version}; mean {m.mean} std {m.std}")
        if m.options.store.stored:
            st = m.options.store
            rule = (f", {st.raw} where the key hashes below {st.fraction}"
                    if st.fraction is not None else f", {st.raw} where the JPEG is at least "
                    f"{st.min_ratio} of the pixels' bytes" if st.min_ratio is not None else "")
            lines.append(f"  store: {st.mode}{rule} (stored pixels: docs/formats.md)")
        if m.missing_images and m.expected_images is not None:
            lines.append(f"  ground truth: {m.expected_images:,} images listed, "
                         f"{m.missing_images:,} of them not in the input (not converted)")
        if m.fast_decode is not None:
            d = m.fast_decode
            why = "; ".join(f"{n} {r}" for r, n in d.declined.items())
            lines.append(f"  crop-aware decode: {d.fast} of the first {d.probed} images"
                         + (f" (Pillow path: {why})" if why else ""))
    return lines
