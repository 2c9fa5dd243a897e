"""Reading the Hugging Face Hub's parquet copy of ILSVRC2012 with pyarrow, a row group at a
time, and refusing what is not that copy.

A file of the copy (``data/train-00000-of-00294.parquet``) has two columns: ``image``, a
struct of ``bytes`` (the JPEG) and ``path`` (its original name), and ``label``, the class
index in sorted-wnid order (-1 in the test split). Its schema metadata ``huggingface``
names the classes (``info.features.label.names``). Before anything is listed the footer
alone is checked: the schema, the class names (another data set's parquet, e.g. Imagenette
with 10 classes, must never be read as ImageNet labels 0-9) and, where the writer kept
statistics, the null counts of ``image.bytes`` and ``label``.

Reading is column-projected and bounded: ``iter_labels`` reads only ``image.path`` and
``label``, a row group (~100 names) at a time; ``iter_images`` reads ``image.bytes``; never
a whole file. Images are bounded before they are materialised: a row group whose
``image.bytes`` column chunk would take more than the image cap (``--max-image-bytes``) to
read, stored and decoded, is not read at all (each of its rows is refused). The decoded size
is the sum of its pages' uncompressed sizes, read from the page headers
(``imgprep.inputs.parquetpages``): pyarrow sizes its buffers by them, so a footer that
understates a chunk hides nothing. A row group that passes is decoded a row at a time, the
file read through a small buffer, so that a value the file stores once and many rows name
(dictionary encoding) is never held more than once; every cell of it is then within the cap.
pyarrow gives no value's size without decoding the page that holds it, and decodes a row
group's pages in order (a page holds whole values, so one page can be as large as its
largest cell; the footer's statistics of a binary column are its min and max values, not
lengths), so the row group is the finest unit that can be refused unread: a row group
holding an image over the cap is refused whole (the Hub's hold ~100 images, ~11 MB). A
spooling process holds a page or two of the row group at a time, each within the cap.
pyarrow is an optional extra (``imgprep[parquet]``), imported only when a parquet is read;
``is_parquet`` needs only the file's magic bytes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from imgprep.errors import LabelError, SourceFormatError
from imgprep.inputs import parquetpages
from imgprep.inputs.spool import Refused
from imgprep.inputs.synsets import ClassTable

MAGIC = b"PAR1"
INSTALL = "pip install 'imgprep[parquet]'"
MAX_NAME_DIFFS = 10  # class names that may be spelled otherwise (e.g. 'crane' twice)
TEST_LABEL = -1  # the label of every test image in the Hub's copy
READ_BUFFER = 1 << 20  # the file is read through a buffer this large, not a column at once
MAX_NAMES = 64 << 20  # what a row group's names or labels may take (the Hub's: a few KB)


def is_parquet(path: Path) -> bool:
    """Whether ``path`` is a parquet file (``PAR1`` at both ends): no pyarrow needed."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4))
            return head == MAGIC and f.read(4) == MAGIC
    except OSError:
        return False


def pyarrow_parquet(path: Path) -> ModuleType:
    """``pyarrow.parquet``, or a refusal naming the extra that provides it."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise SourceFormatError(
            f"{path} is a parquet file (the Hugging Face Hub's copy of ImageNet); reading it "
            f"needs pyarrow, which is not installed: {INSTALL}") from e
    return pq


@dataclass(frozen=True)
class ParquetMeta:
    """What a parquet file's footer says: rows per row group and the class names of its
    Hugging Face metadata (None when it has none)."""

    path: Path
    row_groups: tuple[int, ...]
    class_names: tuple[str, ...] | None

    @property
    def rows(self) -> int:
        return sum(self.row_groups)


def _field(schema: Any, name: str) -> Any:
    index = schema.get_field_index(name)
    return schema.field(index) if index >= 0 else None


def check_schema(schema: Any, where: str) -> None:
    """Refuse a schema that is not ``image: struct<bytes: binary, path: string>`` and an
    integer ``label`` (large and view variants accepted)."""
    import pyarrow as pa

    image, label = _field(schema, "image"), _field(schema, "label")
    fields = {f.name: f.type for f in image.type} if image is not None and \
        pa.types.is_struct(image.type) else {}
    problems = []
    if not fields or not _is_binary(fields.get("bytes")):
        problems.append("an 'image' column of struct<bytes: binary, path: string>")
    elif "path" in fields and not _is_string(fields["path"]):
        problems.append("'image.path' as a string")
    if label is None or not pa.types.is_integer(label.type):
        problems.append("an integer 'label' column")
    if problems:
        found = ", ".join(f"{f.name}: {f.type}" for f in schema) or "no columns"
        raise SourceFormatError(
            f"{where} is a parquet file but not the Hugging Face copy of ImageNet: it lacks "
            f"{' and '.join(problems)} (it has {found}); point imgprep at the "
            "'data/' folder of ILSVRC/imagenet-1k or at one of its files")


def _is_binary(t: Any) -> bool:
    import pyarrow as pa

    return t is not None and (pa.types.is_binary(t) or pa.types.is_large_binary(t)
                              or pa.types.is_binary_view(t))


def _is_string(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def hub_class_names(schema: Any, where: str) -> tuple[str, ...] | None:
    """The class names in the schema's ``huggingface`` metadata, or None without it."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return None
    try:
        info = json.loads(raw)
        label = (info.get("info") or info)["features"]["label"]
    except (ValueError, TypeError, KeyError, AttributeError):
        return None  # metadata of another shape: the labels are still range-checked
    names = label.get("names") if isinstance(label, dict) else None
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SourceFormatError(f"{where}: its Hugging Face metadata names classes that are "
                                "not strings; this is not the ImageNet copy")
    return tuple(names)


def _norm(name: str) -> str:
    return re.sub(r"\d+$", "", " ".join(name.replace("_", " ").split()).casefold())


def _same_class(theirs: str, ours: str, wnid: str) -> bool:
    t, o = _norm(theirs), _norm(ours)
    return t in (o, wnid, _norm(ours.split(",")[0])) or \
        _norm(theirs.split(",")[0]) == _norm(ours.split(",")[0])


def check_class_names(names: tuple[str, ...], classes: ClassTable, where: str) -> None:
    """Refuse class names that are not those of ``classes`` in its order (a few spelled
    otherwise are fine: the Hub's copy renames one of its two 'crane' classes)."""
    sample = ", ".join(names[:4]) + (" …" if len(names) > 4 else "")
    if len(names) != len(classes):
        raise LabelError(
            f"{where}: its Hugging Face metadata names {len(names)} classes ({sample}), not "
            f"the {len(classes)} of ILSVRC2012: it is another data set, and its labels "
            f"0-{len(names) - 1} are not ImageNet's; imgprep converts copies of ILSVRC2012 "
            "only")
    diffs = [i for i, (t, o) in enumerate(zip(names, classes.names, strict=True))
             if not _same_class(t, o, classes.wnids[i])]
    if len(diffs) > MAX_NAME_DIFFS:
        first = "; ".join(f"label {i}: {names[i]!r} where ILSVRC2012 has "
                          f"{classes.wnids[i]} {classes.names[i]!r}" for i in diffs[:3])
        raise LabelError(
            f"{where}: its Hugging Face metadata names {len(diffs)} of its {len(names)} "
            f"classes otherwise than ILSVRC2012 in sorted-wnid order (first: {first}): its "
            "labels would be read as the wrong classes; imgprep converts copies of "
            "ILSVRC2012 only")


def _null_count(meta: Any, group: int, column: str) -> int:
    """Nulls in ``column`` of a row group by its statistics (0 when none were kept)."""
    rg = meta.row_group(group)
    for c in range(rg.num_columns):
        col = rg.column(c)
        if col.path_in_schema == column and col.is_stats_set:
            return int(col.statistics.null_count or 0) if col.statistics.has_null_count else 0
    return 0


def read_meta(path: Path, classes: ClassTable) -> ParquetMeta:
    """Check a file's footer (schema, class names, null counts in the statistics) and say
    how its rows fall into row groups; nothing else is read."""
    pq = pyarrow_parquet(path)
    try:
        pf = pq.ParquetFile(path)
    except (OSError, ValueError) as e:  # pyarrow.ArrowInvalid is a ValueError
        raise SourceFormatError(f"{path} is not a readable parquet file ({e}); it is damaged "
                                "or cut short: download it again") from e
    with pf:
        schema = pf.schema_arrow
        check_schema(schema, str(path))
        names = hub_class_names(schema, str(path))
        if names is not None:
            check_class_names(names, classes, str(path))
        meta = pf.metadata
        for g in range(meta.num_row_groups):
            for column in ("image.bytes", "label"):
                if _null_count(meta, g, column):
                    raise SourceFormatError(
                        f"{path}: row group {g} holds {_null_count(meta, g, column)} null "
                        f"'{column}' values; every image needs its bytes and label: download "
                        "the file again")
        groups = tuple(meta.row_group(g).num_rows for g in range(meta.num_row_groups))
    return ParquetMeta(path, groups, names)


@dataclass(frozen=True)
class RowGroup:
    """The names and labels of one row group (``path`` is None where a row has none)."""

    index: int
    first_row: int
    paths: list[str | None]
    labels: np.ndarray


def iter_labels(path: Path, classes: ClassTable, allow_test: bool) -> Iterator[RowGroup]:
    """Each row group's ``image.path`` and ``label`` (nothing else is read), refusing null
    labels and labels outside ``classes`` (-1 only where ``allow_test``)."""
    pq = pyarrow_parquet(path)
    first = 0
    with pq.ParquetFile(path) as pf:
        has_path = "path" in {f.name for f in pf.schema_arrow.field("image").type}
    columns = ["image.path", "label"] if has_path else ["label"]
    with pq.ParquetFile(path, read_dictionary=columns[:-1] or None) as pf, \
            open(path, "rb") as raw:
        for g in range(pf.metadata.num_row_groups):
            _check_names_fit(raw.fileno(), pf.metadata, g, columns, path)
            table = pf.read_row_group(g, columns=columns)
            label = table.column("label").combine_chunks()
            _check_labels(f"{path}: row group {g}", first, label, len(classes), allow_test)
            paths: list[str | None] = _paths(table, g, path) if has_path else [None] * len(label)
            yield RowGroup(g, first, paths, label.to_numpy(zero_copy_only=False)
                           .astype(np.int64))
            first += len(label)


def _check_names_fit(fd: int, meta: Any, group: int, columns: list[str], path: Path) -> None:
    """Refuse a row group whose name or label column would take over ``MAX_NAMES`` bytes to
    read (``chunk_cost``), before it is read."""
    rg = meta.row_group(group)
    for c in range(rg.num_columns):
        col = rg.column(c)
        if col.path_in_schema not in columns:
            continue
        try:
            cost = chunk_cost(fd, col)
        except ValueError as e:
            raise SourceFormatError(f"{path}: row group {group}: its '{col.path_in_schema}' "
                                    f"pages cannot be read ({e}); the file is damaged: "
                                    "download it again") from e
        if cost > MAX_NAMES:
            raise SourceFormatError(
                f"{path}: row group {group}: its '{col.path_in_schema}' column takes {cost:,} "
                f"bytes to read, over the {MAX_NAMES:,} that names and labels of a row group "
                "may take; this is not the Hub's copy, or it is damaged: download it again")


def _paths(table: Any, group: int, path: Path) -> list[str | None]:
    """The ``image.path`` of a row group read dictionary-encoded, refused before it is
    decoded when its names would take over ``MAX_NAMES`` bytes."""
    import pyarrow.compute as pc

    out: list[str | None] = []
    for chunk in table.column("image").chunks:
        names = chunk.field("path")
        values = names.dictionary if hasattr(names, "dictionary") else names
        longest = int(pc.max(pc.binary_length(values)).as_py() or 0) if len(values) else 0
        if len(names) * longest > MAX_NAMES:
            raise SourceFormatError(
                f"{path}: row group {group}: its image.path names, up to {longest:,} bytes "
                f"each, would take over the {MAX_NAMES:,} bytes that names of a row group may "
                "take; this is not the Hub's copy, or it is damaged: download it again")
        out += names.to_pylist()
    return out


def _check_labels(where: str, first: int, label: Any, count: int, allow_test: bool) -> None:
    if label.null_count:
        row = int(np.flatnonzero(np.asarray(label.is_null()))[0])
        raise SourceFormatError(f"{where}, row {row} (row {first + row} of the file): 'label' "
                                "is null; every image of the copy has a label: download the "
                                "file again")
    values = label.to_numpy(zero_copy_only=False)
    low = TEST_LABEL if allow_test else 0
    bad = np.flatnonzero((values < low) | (values >= count))
    if len(bad):
        row = int(bad[0])
        allowed = f"{low}..{count - 1}" if allow_test else f"0..{count - 1}"
        what = "the test split's -1 outside the test split" \
            if values[row] == TEST_LABEL else f"outside {allowed}"
        raise LabelError(f"{where}, row {row} (row {first + row} of the file): label "
                         f"{int(values[row])} is {what} "
                         f"({len(bad)} such rows in the group); this file is not the "
                         "ImageNet copy it claims to be, or it is damaged: download it again")


def _image_chunk(meta: Any, group: int) -> Any:
    """The footer's record of the ``image.bytes`` column chunk of a row group."""
    rg = meta.row_group(group)
    for c in range(rg.num_columns):
        if rg.column(c).path_in_schema == "image.bytes":
            return rg.column(c)
    raise SourceFormatError(f"row group {group} has no image.bytes column")


def chunk_cost(fd: int, col: Any) -> int:
    """What reading the column chunk ``col`` (the footer's record of it) takes: its bytes as
    stored (read whole) and decoded (by its page headers, which pyarrow sizes its buffers
    by, not by the footer's totals); ``ValueError`` when a page header does not decode."""
    starts = [o for o in (col.dictionary_page_offset, col.data_page_offset) if o]
    start, stored = min(starts, default=0), int(col.total_compressed_size)
    return stored + parquetpages.decoded_bytes(fd, start, stored)


def read_cost(fd: int, meta: Any, group: int) -> int:
    """What reading the images of row group ``group`` takes (``chunk_cost``)."""
    return chunk_cost(fd, _image_chunk(meta, group))


def _group_refusal(path: Path, fd: int, meta: Any, group: int,
                   max_bytes: int | None) -> Refused | None:
    """Why no image of row group ``group`` is read (reading them, stored and decoded, would
    take over ``max_bytes``), or None."""
    if max_bytes is None:
        return None
    try:
        cost = read_cost(fd, meta, group)
    except ValueError as e:
        raise SourceFormatError(f"{path}: row group {group}: its image pages cannot be read "
                                f"({e}); the file is damaged: download it again") from e
    if cost <= max_bytes:
        return None
    return Refused(f"its row group {group}, read whole, takes {cost:,} bytes (by its page "
                   f"headers), over --max-image-bytes ({max_bytes:,}); not read: the Hub's "
                   "row groups take about 11 MB, so the file is damaged or was altered; pass "
                   "a larger --max-image-bytes to read it anyway")


def iter_images(path: Path, max_bytes: int | None = None) -> Iterator[bytes | Refused]:
    """The ``image.bytes`` of every row in order, decoded a row at a time (the file read
    through a small buffer), those of a row group that would take over ``max_bytes`` to
    read ``Refused`` unread; a null is refused naming its row group and row. What pyarrow
    keeps for reuse is handed back at the end, so that processes forked later do not carry
    it."""
    import pyarrow as pa

    pq = pyarrow_parquet(path)
    with pq.ParquetFile(path, pre_buffer=False, buffer_size=READ_BUFFER) as pf, \
            open(path, "rb") as raw:
        meta = pf.metadata
        for g in range(meta.num_row_groups):
            refused = _group_refusal(path, raw.fileno(), meta, g, max_bytes)
            if refused is not None:
                yield from (refused for _ in range(meta.row_group(g).num_rows))
                continue
            rows = pf.iter_batches(batch_size=1, row_groups=[g], columns=["image.bytes"])
            for row, batch in enumerate(rows):
                yield _cell(path, g, row, batch.column(0))
    pa.default_memory_pool().release_unused()


def _cell(path: Path, group: int, row: int, image: Any) -> bytes:
    """The one cell of a batch of ``image``: its ``bytes``."""
    value = image.field("bytes")
    if image.is_null()[0].as_py() or value.is_null()[0].as_py():
        raise SourceFormatError(
            f"{path}: row group {group}, row {row}: 'image.bytes' is null; every image of the "
            "copy has its bytes: download the file again")
    data: bytes = value[0].as_py()
    return data
